//! The host-path guard: never panics on any path, judges a path and its normal form alike, refuses
//! every case variant of a refused path, and admits writes only inside the output root, spelled
//! exactly, with no hidden name on the path.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_core::credential_paths::CredentialGuard;
use sandbox_core::guest_path::norm;
use sandbox_core::host_paths::{HostPathGuard, HostRefusal};

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    path: String,
    allow_credential: bool,
}

fuzz_target!(|input: Input| {
    let Input {
        path,
        allow_credential,
    } = input;
    let guard = HostPathGuard::new(CredentialGuard::for_root("/root", ["/home/u"]))
        .with_state_roots(["/srv/ws"])
        .with_output_root("/srv/out");
    let read = guard.read_refusal(&path, allow_credential);
    let write = guard.write_refusal(&path, allow_credential);
    if !path.starts_with('/') {
        assert_eq!(read, Some(HostRefusal::NotAbsolute));
        assert_eq!(write, Some(HostRefusal::NotAbsolute));
        return;
    }
    // Spelling and case change nothing.
    let normal = norm(&path);
    assert_eq!(guard.write_refusal(&normal, allow_credential), write);
    assert_eq!(guard.read_refusal(&normal, allow_credential), read);
    // A case variant is refused whenever the path is (the refusals fold case; only the output
    // root's admission is exact, so a variant may be refused where the path is not).
    let upper = path.to_uppercase();
    if upper.to_lowercase() == path.to_lowercase() {
        if write.is_some() {
            assert!(
                guard.write_refusal(&upper, allow_credential).is_some(),
                "{path:?}"
            );
        }
        assert_eq!(
            guard.read_refusal(&upper, allow_credential).is_some(),
            read.is_some(),
            "{path:?}"
        );
    }
    // Whatever may be written lies inside the output root with no hidden name on it; a refused read
    // is refused as a write.
    if write.is_none() {
        assert!(normal.starts_with("/srv/out/"), "{normal:?}");
        assert!(!normal.split('/').any(|c| c.starts_with('.')), "{normal:?}");
        assert!(read.is_none() || read.as_ref().is_some_and(HostRefusal::is_credential));
    }
});
