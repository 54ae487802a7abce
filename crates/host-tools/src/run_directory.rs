//! The guest paths of a run: the run directory the relay makes and the socket in it. No I/O:
//! the relay makes them, and the host checks what the relay reports before it uses or removes
//! anything there.

/// The environment variable naming a run's socket in the guest.
pub const SOCKET_ENV: &str = "HOST_TOOL_SOCKET";
/// The prefix of a run directory's name.
pub const RUN_DIRECTORY_PREFIX: &str = ".host-tools-";
/// True when `path` is a socket path a relay makes: `/<tmp>/.host-tools-<32 hex>/socket`, with
/// no other component that could point elsewhere. The host removes only such a directory.
pub fn is_run_socket(path: &str) -> bool {
    let Some(directory) = path.strip_suffix("/socket") else {
        return false;
    };
    let Some((parent, name)) = directory.rsplit_once('/') else {
        return false;
    };
    let hex = name.strip_prefix(RUN_DIRECTORY_PREFIX).unwrap_or("");
    parent.starts_with('/')
        && !parent.split('/').any(|part| part == ".." || part == ".")
        && hex.len() == 32
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_relay_socket_path_is_a_run_socket() {
        let hex = "0123456789abcdef0123456789abcdef";
        assert!(is_run_socket(&format!("/tmp/.host-tools-{hex}/socket")));
        assert!(is_run_socket(&format!(
            "/var/tmp/x/.host-tools-{hex}/socket"
        )));
        for bad in [
            format!("tmp/.host-tools-{hex}/socket"),
            format!("/tmp/../.host-tools-{hex}/socket"),
            format!("/tmp/./.host-tools-{hex}/socket"),
            format!("/tmp/.host-tools-{hex}/sock"),
            format!("/tmp/.host-tools-{}/socket", &hex[1..]),
            format!("/tmp/.host-tools-{}/socket", hex.to_uppercase()),
            format!("/tmp/host-tools-{hex}/socket"),
            format!("/tmp/.host-tools-{hex}x/socket"),
            "/socket".to_owned(),
            format!("/.host-tools-{hex}/socket/x"),
        ] {
            assert!(!is_run_socket(&bad), "{bad}");
        }
    }
}
