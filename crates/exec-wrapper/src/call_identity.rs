//! Per-call values: the nonce and the file names derived from it.
//!
//! The names are fresh per call, so two concurrent commands in one sandbox never share a pid
//! file, a cancel file or an env file.

use std::fmt;

use crate::error::{Error, Result};

/// Length of a nonce in hex characters (12 random bytes).
pub(crate) const NONCE_HEX_LEN: usize = 24;

/// The per-call nonce: 24 lowercase hex characters from the operating system's CSPRNG.
///
/// The wrapper prints it on stderr right before the command starts. It authenticates nothing
/// against a hostile guest; it only stops an engine, transport or wrapper failure from being read
/// as a command's result.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Nonce(String);

impl Nonce {
    /// Accepts exactly 24 lowercase hex characters (for instance a nonce read back from a record).
    pub fn parse(text: &str) -> Option<Nonce> {
        let well_formed = text.len() == NONCE_HEX_LEN
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        well_formed.then(|| Nonce(text.to_owned()))
    }

    /// The nonce as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The nonce line the wrapper prints on stderr: the nonce and a newline (25 bytes).
    pub fn line(&self) -> Vec<u8> {
        let mut line = Vec::with_capacity(NONCE_HEX_LEN + 1);
        line.extend_from_slice(self.0.as_bytes());
        line.push(b'\n');
        line
    }

    /// The line the sbx `bind` stage prints when the marker is missing: `<nonce>-unmounted\n`.
    pub fn unmounted_line(&self) -> Vec<u8> {
        let mut line = self.0.as_bytes().to_vec();
        line.extend_from_slice(b"-unmounted\n");
        line
    }

    /// The line the wrapper prints, before any nonce line, when it cannot enter the working
    /// directory: `<nonce>-nocwd\n`, followed by the shell's own message.
    pub fn no_cwd_line(&self) -> Vec<u8> {
        let mut line = self.0.as_bytes().to_vec();
        line.extend_from_slice(b"-nocwd\n");
        line
    }
}

impl fmt::Display for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nonce({})", self.0)
    }
}

/// A fresh nonce for one call.
///
/// # Errors
///
/// [`Error::Entropy`] if the operating system's random source fails; no predictable fallback is
/// ever used.
pub fn new_nonce() -> Result<Nonce> {
    let mut raw = [0u8; NONCE_HEX_LEN / 2];
    getrandom::fill(&mut raw).map_err(|e| Error::Entropy {
        reason: e.to_string(),
    })?;
    let mut hex = String::with_capacity(NONCE_HEX_LEN);
    for byte in raw {
        hex.push(char::from(HEX[usize::from(byte >> 4)]));
        hex.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    Ok(Nonce(hex))
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The guest path where the command records its process group: `/tmp/maf-sbx-<nonce>.pgid`.
pub fn pid_file(nonce: &Nonce) -> String {
    format!("/tmp/maf-sbx-{nonce}.pgid")
}

/// The cancel file the kill script creates: the pid file followed by `.cancel`.
pub fn cancel_file(nonce: &Nonce) -> String {
    format!("{}.cancel", pid_file(nonce))
}

/// The sbx env file's name inside the workspace: `.maf-sbx-env-<nonce>`.
///
/// The host writes it through its confined plane; the guest sees it at `<parent>/<name>`.
pub fn sbx_env_file_name(nonce: &Nonce) -> String {
    format!(".maf-sbx-env-{nonce}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_fresh_lowercase_hex() {
        let a = new_nonce().unwrap();
        let b = new_nonce().unwrap();
        assert_ne!(a, b);
        assert_eq!(Nonce::parse(a.as_str()), Some(a.clone()));
        assert_eq!(a.line().len(), 25);
        // The case, checked on the bytes themselves rather than through `parse`: over many nonces
        // every hex letter turns up, and none may be uppercase.
        let mut letters = std::collections::BTreeSet::new();
        for _ in 0..64 {
            let nonce = new_nonce().unwrap();
            assert_eq!(nonce.as_str().len(), NONCE_HEX_LEN);
            for byte in nonce.as_str().bytes() {
                assert!(
                    byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte),
                    "{:?} holds {:?}",
                    nonce.as_str(),
                    char::from(byte)
                );
                if byte.is_ascii_alphabetic() {
                    letters.insert(byte);
                }
            }
        }
        assert_eq!(
            letters.len(),
            6,
            "64 nonces show every hex letter, all lowercase"
        );
    }

    #[test]
    fn parse_refuses_anything_but_24_lowercase_hex() {
        assert!(Nonce::parse("0123456789abcdef01234567").is_some());
        assert!(Nonce::parse("0123456789ABCDEF01234567").is_none());
        assert!(Nonce::parse("0123456789abcdef0123456").is_none());
        assert!(Nonce::parse("0123456789abcdef01234567\n").is_none());
        assert!(Nonce::parse("0123456789abcdef0123456g").is_none());
    }

    #[test]
    fn file_names_follow_the_nonce() {
        let nonce = Nonce::parse("00112233445566778899aabb").unwrap();
        assert_eq!(
            pid_file(&nonce),
            "/tmp/maf-sbx-00112233445566778899aabb.pgid"
        );
        assert_eq!(
            cancel_file(&nonce),
            "/tmp/maf-sbx-00112233445566778899aabb.pgid.cancel"
        );
        assert_eq!(
            sbx_env_file_name(&nonce),
            ".maf-sbx-env-00112233445566778899aabb"
        );
        assert_eq!(
            nonce.unmounted_line(),
            b"00112233445566778899aabb-unmounted\n"
        );
        assert_eq!(nonce.no_cwd_line(), b"00112233445566778899aabb-nocwd\n");
    }
}
