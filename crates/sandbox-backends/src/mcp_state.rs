//! Where the MCP server keeps its state by default, known here so that every host's guard of
//! host files covers it whichever binary runs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The MCP server's default state directory: `$XDG_RUNTIME_DIR/sandbox-mcp` when that variable
/// names a directory, else `sandbox-mcp-<uid>` under the temporary directory. The name carries
/// the numeric user id, never `USER`: an unset or shared `USER` must not give two users one
/// directory. The server checks the directory's owner and mode before it uses it.
pub fn default_mcp_state_dir() -> PathBuf {
    mcp_state_dir_in(
        std::env::var_os("XDG_RUNTIME_DIR"),
        &std::env::temp_dir(),
        rustix::process::geteuid().as_raw(),
    )
}

/// [`default_mcp_state_dir`] for a given runtime directory, temporary directory and user id.
fn mcp_state_dir_in(runtime: Option<OsString>, temp: &Path, uid: u32) -> PathBuf {
    match runtime {
        // A relative value is not a runtime directory (the XDG rule): it is ignored.
        Some(dir) if Path::new(&dir).is_absolute() => PathBuf::from(dir).join("sandbox-mcp"),
        _ => temp.join(format!("sandbox-mcp-{uid}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_per_user_whatever_user_says() {
        let tmp = Path::new("/tmp");
        assert_eq!(
            mcp_state_dir_in(Some("/run/user/1000".into()), tmp, 1000),
            Path::new("/run/user/1000/sandbox-mcp")
        );
        // Without a runtime directory the user id names it: two users never share one, and
        // nothing depends on USER.
        assert_eq!(
            mcp_state_dir_in(None, tmp, 1000),
            Path::new("/tmp/sandbox-mcp-1000")
        );
        assert_ne!(
            mcp_state_dir_in(None, tmp, 1000),
            mcp_state_dir_in(None, tmp, 1001)
        );
        assert_eq!(
            mcp_state_dir_in(Some("".into()), tmp, 7),
            Path::new("/tmp/sandbox-mcp-7")
        );
        assert_eq!(
            mcp_state_dir_in(Some("relative".into()), tmp, 7),
            Path::new("/tmp/sandbox-mcp-7")
        );
    }
}
