//! The fixture bytes and numbers every suite shares, exactly as the spec gives them.

use std::time::Duration;

/// The read cap every file probe uses: 1 MiB.
pub const READ_CAP: u64 = 1_048_576;

/// The bytes of the legitimate control file (20 bytes).
pub const CONTROL_FILE_BYTES: &[u8] = b"a legitimate output\n";

/// The bytes planted outside the working directory (30 bytes).
pub const PLANTED_SECRET_BYTES: &[u8] = b"the guest must not reach this\n";

/// The explicit storage base both backends are run with once (its parent is absent from the images and
/// sits under the root-owned `/srv`).
pub const EXPLICIT_STORAGE_BASE: &str = "/srv/maf-explicit/work";

/// The exec timeout of the reference probes.
pub const PROBE_EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// The exec timeout of the EGRESS probes.
pub const EGRESS_EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// The bound of the storage-base and RECLAIM reclaims.
pub const RECLAIM_TIMEOUT: Duration = Duration::from_secs(60);

/// The binary fixture: every byte 0x00..=0xFF, then the UTF-8 of `ünïcödé→payload`, U+FFFD and `\r\n`,
/// then `E2 82` (a truncated UTF-8 sequence).
pub fn every_byte_and_utf8_edges() -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..=255u8).collect();
    bytes.extend_from_slice("ünïcödé→payload\u{FFFD}\r\n".as_bytes());
    bytes.extend_from_slice(&[0xE2, 0x82]);
    bytes
}

/// `len` bytes that do not compress to nothing (an xorshift stream from `seed`), so no layer
/// between a test and the guest can shortcut a large transfer; the same `seed` gives the same
/// bytes.
pub fn incompressible_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incompressible_bytes_are_exact_repeatable_and_varied() {
        let bytes = incompressible_bytes(1003, 7);
        assert_eq!(bytes.len(), 1003);
        assert_eq!(bytes, incompressible_bytes(1003, 7));
        assert_ne!(bytes, incompressible_bytes(1003, 8));
        let distinct: std::collections::BTreeSet<u8> = bytes.iter().copied().collect();
        assert!(distinct.len() > 200, "{} distinct bytes", distinct.len());
    }

    #[test]
    fn fixture_sizes() {
        assert_eq!(CONTROL_FILE_BYTES.len(), 20);
        assert_eq!(PLANTED_SECRET_BYTES.len(), 30);
        let b = every_byte_and_utf8_edges();
        assert_eq!(&b[..256], (0..=255u8).collect::<Vec<_>>().as_slice());
        assert_eq!(&b[b.len() - 4..], b"\r\n\xE2\x82");
        assert!(std::str::from_utf8(&b[256..b.len() - 2]).is_ok());
    }
}
