//! A root named relative to the working directory, by a bare name: its parent is the working
//! directory itself. Alone in its test binary, since it changes the process's working directory.

use std::fs;

use confined_fs::ConfinedRoot;

#[test]
fn a_root_named_by_a_bare_relative_name_opens_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("root")).unwrap();
    fs::write(dir.path().join("root").join("inside"), b"found").unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    let root = ConfinedRoot::open("root").expect("a bare name is a root in the working directory");
    assert_eq!(root.read("inside", 100).unwrap(), b"found");
}
