#![cfg(target_os = "linux")]
//! An entry that vanishes between the directory read and its lstat is left out of a listing,
//! not an error. `/proc/self/fd` makes that happen every time: it lists the descriptor the
//! listing itself reads the directory through, which is closed again before the entries are
//! looked at. Alone in its test binary, so no other thread opens a descriptor meanwhile.

use confined_fs::ConfinedRoot;

#[test]
fn an_entry_that_vanishes_while_listed_is_left_out() {
    let root = ConfinedRoot::open("/proc/self/fd").expect("the descriptor directory opens");
    let before: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    let listed = root
        .list("")
        .expect("a vanished entry is skipped, never an error");
    let names: Vec<String> = listed
        .iter()
        .map(|entry| entry.name.clone().into_string().unwrap())
        .collect();
    // Every listed descriptor is still open; stdin, stdout and stderr are among them.
    for name in &names {
        assert!(
            std::path::Path::new("/proc/self/fd")
                .join(name)
                .symlink_metadata()
                .is_ok(),
            "{name} was listed but is not open"
        );
    }
    for standard in ["0", "1", "2"] {
        assert!(
            names.iter().any(|name| name == standard),
            "{names:?} / {before:?}"
        );
    }
}
