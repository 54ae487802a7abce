//! `list_dir` runs its listing with the guest's own authority, so the guest controls every byte
//! the host parses. Whatever it prints, an accepted record names exactly one entry of the listed
//! directory (never empty, `.`, `..` or a path with `/`), and only files carry a size.
#![no_main]

use backend_docker::fuzzing::list_records;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(records) = list_records(data) {
        for (kind, size, name) in records {
            assert!(matches!(kind, b'f' | b'd' | b'l' | b'o'));
            assert_eq!(size.is_some(), kind == b'f', "a size only for files");
            assert!(!name.is_empty() && name != b"." && name != b"..");
            assert!(!name.contains(&b'/') && !name.contains(&0));
        }
    }
});
