//! Guest-path confinement: `confine` never panics, and every path it accepts lies within the working
//! directory, holds no backslash and is in normal form.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_core::guest_path;

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    path: String,
    wd: String,
}

fuzz_target!(|input: Input| {
    let Input { path, wd } = input;
    let Ok(resolved) = guest_path::confine(&path, &wd) else {
        return;
    };
    assert!(
        !path.contains('\\'),
        "a backslash path was accepted: {path:?}"
    );
    assert!(
        guest_path::relative_to(&resolved, &wd).is_some(),
        "{path:?} under {wd:?} resolved to {resolved:?}, outside the working directory"
    );
    assert_eq!(
        guest_path::norm(&resolved),
        resolved,
        "the result is normalised"
    );
    // The walk for the caller's path ends at the resolved path (or lists nothing for the root).
    let chain = guest_path::ancestors(&path, &wd);
    if resolved != "/" && resolved != "." {
        assert_eq!(chain.last(), Some(&resolved), "{chain:?}");
    }
});
