//! The engine-side stat reads the first tar header of `docker cp <id>:<path> -`, whose names,
//! link targets and PAX records a guest controls. The parser must never panic, never read past
//! its bounds, and answer consistently: a size only for regular files, and the same answer for
//! every longer prefix once it has found one.
//!
//! Inputs whose first byte is odd get a valid checksum written into every 512-byte block, so the
//! fuzzer reaches what lies behind the checksum (typeflags, PAX records, metadata bounds).
#![no_main]

use backend_docker::fuzzing::{tar_first_entry, TAR_MAX_PREFIX};
use libfuzzer_sys::fuzz_target;
use sandbox_core::EntryKind;

const BLOCK: usize = 512;

fn with_valid_checksums(data: &[u8]) -> Vec<u8> {
    let mut bytes = data[1..].to_vec();
    for block in bytes.chunks_exact_mut(BLOCK) {
        block[148..156].copy_from_slice(b"        ");
        let sum: u32 = block.iter().map(|b| u32::from(*b)).sum();
        let field = format!("{sum:06o}\0 ");
        block[148..156].copy_from_slice(field.as_bytes());
    }
    bytes
}

fuzz_target!(|data: &[u8]| {
    let stream = match data.first() {
        Some(first) if first % 2 == 1 => with_valid_checksums(data),
        _ => data.to_vec(),
    };
    let answer = tar_first_entry(&stream);
    if let Ok(Some((kind, size))) = &answer {
        assert_eq!(
            size.is_some(),
            *kind == EntryKind::File,
            "a size only for files"
        );
        // Found within the bounded prefix: a longer stream never changes the answer.
        let mut longer = stream.clone();
        longer.extend_from_slice(&[0u8; 1024]);
        assert_eq!(tar_first_entry(&longer), answer);
    }
    if stream.len() > TAR_MAX_PREFIX {
        assert!(
            !matches!(answer, Ok(None)),
            "more than the bounded prefix never asks for more"
        );
    }
});
