#![cfg(unix)]
//! What a caller sees at the edges: the kernel's answer to the alias check, which errors are
//! refusals and which are host failures, and that looking never creates anything.

use std::ffi::OsString;
use std::fs;
use std::os::fd::AsFd;
use std::path::Path;

use confined_fs::{
    ConfinedRoot, DirectoryListing, EntryKind, Error, HeldDirectory, Irregular, KernelListing, Stat,
};

#[test]
fn the_kernel_listing_answers_for_the_exact_spelling_only() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["Readme", "caf\u{e9}", "plain"] {
        fs::write(dir.path().join(name), b"").unwrap();
    }
    let handle = fs::File::open(dir.path()).unwrap();
    let fd = handle.as_fd();
    for listed in ["Readme", "caf\u{e9}", "plain"] {
        assert!(KernelListing.lists_verbatim(fd, listed.as_ref()).unwrap());
    }
    // Another case, the decomposed spelling, a prefix, and a name that is not there at all.
    for not_listed in [
        "readme",
        "README",
        "cafe\u{301}",
        "Read",
        "plain ",
        "absent",
    ] {
        assert!(
            !KernelListing
                .lists_verbatim(fd, not_listed.as_ref())
                .unwrap(),
            "{not_listed:?}"
        );
    }
    let mut names = KernelListing::names(fd).unwrap();
    names.sort();
    let expected: Vec<OsString> = ["Readme", "caf\u{e9}", "plain"]
        .iter()
        .map(OsString::from)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(names, expected);
    // Asking twice gives the same answers: each call lists from the start.
    assert!(KernelListing.lists_verbatim(fd, "plain".as_ref()).unwrap());
    assert!(KernelListing.lists_verbatim(fd, "Readme".as_ref()).unwrap());

    // For a name the walk's lstat found: on a directory held as not byte-exact only the listing
    // answers, so a spelling it does not hold (as a case-folding lookup would have found) is
    // refused; held as byte-exact or unknown, the lstat's find stands.
    let elsewhere = HeldDirectory {
        byte_exact_file_system: Some(false),
        ..HeldDirectory::default()
    };
    for (name, listed) in [("Readme", true), ("readme", false), ("cafe\u{301}", false)] {
        assert_eq!(
            KernelListing
                .lists_found_verbatim(fd, name.as_ref(), elsewhere)
                .unwrap(),
            listed,
            "{name:?}"
        );
    }
    assert!(KernelListing
        .lists_found_verbatim(fd, "Readme".as_ref(), HeldDirectory::default())
        .unwrap());
    assert!(!KernelListing
        .lists_found_verbatim(fd, "..".as_ref(), HeldDirectory::default())
        .unwrap());
}

#[test]
fn refusals_and_host_failures_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    let root = ConfinedRoot::open(dir.path()).unwrap();
    root.write("f", b"x").unwrap();

    root.make_dirs("d").unwrap();
    std::os::unix::fs::symlink("f", dir.path().join("link")).unwrap();

    // Every confinement refusal, whatever its reason, is both.
    let confinements = [
        root.read("../x", 10).unwrap_err(),
        root.read("/etc/passwd", 10).unwrap_err(),
        root.read("link/x", 10).unwrap_err(),
        root.remove(".", true).unwrap_err(),
    ];
    for refused in &confinements {
        assert!(matches!(refused, Error::Confinement { .. }), "{refused:?}");
        assert!(
            refused.is_confinement() && refused.is_refusal(),
            "{refused}"
        );
    }

    // Every other decision of the crate is a refusal, not a confinement breach.
    let refusals = [
        root.read("missing", 10).unwrap_err(),
        root.read("f/x", 10).unwrap_err(),
        root.read("d", 10).unwrap_err(),
        root.read("link", 10).unwrap_err(),
        root.read("f", 0).unwrap_err(),
    ];
    assert!(matches!(refusals[0], Error::NotFound { .. }));
    assert!(matches!(refusals[1], Error::NotADirectory { .. }));
    assert!(matches!(refusals[2], Error::IsADirectory { .. }));
    assert!(matches!(refusals[3], Error::NotRegularFile { .. }));
    assert!(matches!(refusals[4], Error::TooLarge { .. }));
    for refused in &refusals {
        assert!(
            !refused.is_confinement() && refused.is_refusal(),
            "{refused}"
        );
    }

    // A name longer than any file system allows: the host fails the call, nothing refused it.
    let too_long = "n".repeat(300);
    let host_failure = root.read(&too_long, 10).unwrap_err();
    assert!(matches!(host_failure, Error::Io { .. }), "{host_failure:?}");
    assert!(
        !host_failure.is_refusal() && !host_failure.is_confinement(),
        "{host_failure}"
    );
}

fn names(dir: &Path) -> Vec<OsString> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    names
}

#[test]
fn looking_at_missing_paths_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = ConfinedRoot::open(dir.path()).unwrap();
    fs::create_dir(dir.path().join("kept")).unwrap();

    assert!(matches!(root.lstat("a/b/c"), Ok(None)));
    assert!(matches!(root.lstat("kept/a/b"), Ok(None)));
    assert!(matches!(root.read("a/b/c", 10), Err(Error::NotFound { path }) if path == "a"));
    assert!(matches!(root.list("a/b"), Err(Error::NotFound { path }) if path == "a"));
    assert!(
        matches!(root.remove("kept/a/b", true), Err(Error::NotFound { path }) if path == "kept/a")
    );
    assert_eq!(names(dir.path()), [OsString::from("kept")]);
    assert!(names(&dir.path().join("kept")).is_empty());

    // Writing and making directories do create what is missing, one level at a time.
    root.make_dirs("a/b").unwrap();
    root.write("kept/x/y", b"y").unwrap();
    assert!(fs::symlink_metadata(dir.path().join("a/b"))
        .unwrap()
        .is_dir());
    assert_eq!(fs::read(dir.path().join("kept/x/y")).unwrap(), b"y");
}

#[test]
fn a_recursive_remove_empties_every_level_however_wide() {
    let dir = tempfile::tempdir().unwrap();
    let root = ConfinedRoot::open(dir.path()).unwrap();
    for top in 0..3 {
        for inner in 0..4 {
            root.write(format!("tree/{top}/{inner}/file"), b"x")
                .unwrap();
            root.write(format!("tree/{top}/file-{inner}"), b"y")
                .unwrap();
        }
        root.make_dirs(format!("tree/{top}/empty")).unwrap();
    }
    root.remove("tree", true).unwrap();
    assert!(names(dir.path()).is_empty());
}

#[test]
fn special_files_are_described_as_other_and_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = ConfinedRoot::open(dir.path()).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        dir.path().join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(dir.path().join("socket")).unwrap();
    for name in ["pipe", "socket"] {
        assert_eq!(
            root.lstat(name).unwrap(),
            Some(Stat {
                kind: EntryKind::Other,
                size: None
            }),
            "{name}"
        );
    }
    assert!(matches!(
        root.read("socket", 10),
        Err(Error::NotRegularFile {
            found: Irregular::Socket,
            ..
        })
    ));
    let listed: Vec<_> = root
        .list(".")
        .unwrap()
        .into_iter()
        .map(|entry| (entry.name, entry.stat.kind))
        .collect();
    assert_eq!(
        listed,
        [
            (OsString::from("pipe"), EntryKind::Other),
            (OsString::from("socket"), EntryKind::Other)
        ]
    );
}

#[test]
fn devices_are_refused_by_kind() {
    let dir = tempfile::tempdir().unwrap();
    let root = ConfinedRoot::open(dir.path()).unwrap();
    // The same device numbers as /dev/null and /dev/loop0; creating them needs CAP_MKNOD.
    let devices = [
        (
            "char",
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::makedev(1, 3),
        ),
        (
            "block",
            rustix::fs::FileType::BlockDevice,
            rustix::fs::makedev(7, 0),
        ),
    ];
    for (name, kind, number) in devices {
        if let Err(errno) = rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join(name),
            kind,
            rustix::fs::Mode::from_raw_mode(0o600),
            number,
        ) {
            // Without the capability the refusal by kind cannot be set up here.
            assert_eq!(errno, rustix::io::Errno::PERM);
            eprintln!("skipping {name}: mknod needs CAP_MKNOD");
            continue;
        }
        let expected = if name == "char" {
            Irregular::CharDevice
        } else {
            Irregular::BlockDevice
        };
        let outcome = root.read(name, 10);
        assert!(
            matches!(outcome, Err(Error::NotRegularFile { found, .. }) if found == expected),
            "{name}: {outcome:?}"
        );
        assert_eq!(
            root.lstat(name).unwrap().map(|s| s.kind),
            Some(EntryKind::Other)
        );
    }
}

#[test]
fn a_root_under_a_missing_or_file_parent_is_not_found_or_not_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("file"), b"").unwrap();
    let missing = dir.path().join("missing").join("root");
    assert!(
        matches!(ConfinedRoot::open(&missing), Err(Error::NotFound { ref path }) if path == &missing.display().to_string()),
        "{:?}",
        ConfinedRoot::open(&missing)
    );
    let under_file = dir.path().join("file").join("root");
    assert!(
        matches!(
            ConfinedRoot::open(&under_file),
            Err(Error::NotADirectory { .. })
        ),
        "{:?}",
        ConfinedRoot::open(&under_file)
    );
}

#[test]
fn a_refused_read_says_what_was_found_instead() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("file"), b"").unwrap();
    fs::hard_link(dir.path().join("file"), dir.path().join("twin")).unwrap();
    std::os::unix::fs::symlink("file", dir.path().join("link")).unwrap();
    let root = ConfinedRoot::open(dir.path()).unwrap();
    for (path, expected) in [
        ("link", "link: not a regular file: a symbolic link"),
        (
            "twin",
            "twin: not a regular file: a regular file with 2 hard links",
        ),
    ] {
        assert_eq!(root.read(path, 10).unwrap_err().to_string(), expected);
    }
}

#[test]
fn a_recursive_remove_descends_exactly_max_remove_depth_levels() {
    let dir = tempfile::tempdir().unwrap();
    let root = ConfinedRoot::open(dir.path()).unwrap();
    let nested = |levels: usize| vec!["d"; levels].join("/");
    // `MAX_REMOVE_DEPTH` levels under the removed directory's own level: all removed.
    let deepest = nested(confined_fs::MAX_REMOVE_DEPTH);
    fs::create_dir_all(dir.path().join(&deepest)).unwrap();
    fs::write(dir.path().join(&deepest).join("file"), b"x").unwrap();
    root.remove("d", true).unwrap();
    assert!(names(dir.path()).is_empty());

    // One more: refused, the deepest level left in place.
    let too_deep = nested(confined_fs::MAX_REMOVE_DEPTH + 1);
    fs::create_dir_all(dir.path().join(&too_deep)).unwrap();
    fs::write(dir.path().join(&too_deep).join("file"), b"x").unwrap();
    match root.remove("d", true) {
        Err(Error::Io { ref source, .. }) => {
            assert!(source.to_string().contains("deeper than"), "{source}")
        }
        other => panic!("expected the depth limit, got {other:?}"),
    }
    assert_eq!(
        fs::read(dir.path().join(&too_deep).join("file")).unwrap(),
        b"x"
    );
}
