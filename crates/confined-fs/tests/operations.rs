//! Each operation against the cases a guest can set up: links, files and pipes where they do not
//! belong, aliases, oversize files and paths that climb out.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use confined_fs::{
    ConfinedRoot, ConfinementReason, DirectoryListing, EntryKind, Error, Irregular, KernelListing,
    NameRules, RootOptions, Stat, WindowsNameProblem,
};

/// A workspace `root/` beside an `outside/` tree holding a canary the guest would love to reach.
struct Layout {
    _dir: tempfile::TempDir,
    root_path: PathBuf,
    outside: PathBuf,
    root: ConfinedRoot,
}

const CANARY: &[u8] = b"outside the root: never read, never written";

impl Layout {
    fn new() -> Self {
        Self::with(RootOptions::default())
    }

    fn with(options: RootOptions) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let root_path = dir.path().join("root");
        let outside = dir.path().join("outside");
        fs::create_dir(&root_path).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("canary"), CANARY).unwrap();
        let root = ConfinedRoot::open_with(&root_path, options).expect("the root opens");
        Self {
            _dir: dir,
            root_path,
            outside,
            root,
        }
    }

    fn host(&self, path: &str) -> PathBuf {
        self.root_path.join(path)
    }

    fn outside_names(&self) -> Vec<OsString> {
        let mut names: Vec<_> = fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    }

    fn assert_outside_untouched(&self) {
        assert_eq!(self.outside_names(), [OsString::from("canary")]);
        assert_eq!(fs::read(self.outside.join("canary")).unwrap(), CANARY);
    }

    fn root_names(&self, dir: &str) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(self.host(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }
}

fn reason(result: Result<impl std::fmt::Debug, Error>) -> ConfinementReason {
    match result {
        Err(Error::Confinement { reason, .. }) => reason,
        other => panic!("expected a confinement refusal, got {other:?}"),
    }
}

#[test]
fn a_link_inside_the_path_is_refused_even_when_it_stays_inside_the_root() {
    let layout = Layout::new();
    fs::create_dir(layout.host("real")).unwrap();
    fs::write(layout.host("real/f"), b"inside").unwrap();
    symlink("real", layout.host("inlink")).unwrap();
    symlink(&layout.outside, layout.host("outlink")).unwrap();
    let root = &layout.root;

    for link in ["inlink", "outlink"] {
        assert_eq!(
            reason(root.read(format!("{link}/f"), 100)),
            ConfinementReason::Link
        );
        assert_eq!(
            reason(root.read(format!("{link}/canary"), 100)),
            ConfinementReason::Link
        );
        assert_eq!(
            reason(root.write(format!("{link}/g"), b"x")),
            ConfinementReason::Link
        );
        assert_eq!(
            reason(root.write(format!("{link}/deeper/g"), b"x")),
            ConfinementReason::Link
        );
        assert_eq!(reason(root.list(link)), ConfinementReason::Link);
        assert_eq!(
            reason(root.lstat(format!("{link}/f"))),
            ConfinementReason::Link
        );
        assert_eq!(
            reason(root.make_dirs(format!("{link}/x"))),
            ConfinementReason::Link
        );
        assert_eq!(
            reason(root.remove(format!("{link}/canary"), false)),
            ConfinementReason::Link
        );
        // The link itself is described, never followed.
        assert_eq!(
            root.lstat(link).unwrap(),
            Some(Stat {
                kind: EntryKind::Symlink,
                size: None
            })
        );
    }
    assert_eq!(layout.root_names("real"), ["f"]);
    layout.assert_outside_untouched();
}

#[test]
fn a_file_in_the_middle_of_a_path_is_not_a_directory() {
    let layout = Layout::new();
    fs::write(layout.host("f"), b"plain").unwrap();
    let root = &layout.root;
    assert!(matches!(root.read("f/x", 10), Err(Error::NotADirectory { path }) if path == "f"));
    assert!(matches!(
        root.write("f/x", b"1"),
        Err(Error::NotADirectory { .. })
    ));
    assert!(matches!(root.list("f"), Err(Error::NotADirectory { .. })));
    assert!(matches!(
        root.make_dirs("f/x/y"),
        Err(Error::NotADirectory { .. })
    ));
    assert!(matches!(
        root.lstat("f/x"),
        Err(Error::NotADirectory { .. })
    ));
    assert!(matches!(
        root.remove("f/x", true),
        Err(Error::NotADirectory { .. })
    ));
    assert_eq!(fs::read(layout.host("f")).unwrap(), b"plain");
}

#[test]
fn paths_that_leave_the_root_are_refused_before_any_system_call() {
    let layout = Layout::new();
    let root = &layout.root;
    let outside = layout.outside.join("canary");
    let absolute = outside.to_str().unwrap();
    for (path, expected) in [
        ("..", ConfinementReason::Escape),
        ("../outside/canary", ConfinementReason::Escape),
        ("a/../../outside/canary", ConfinementReason::Escape),
        (absolute, ConfinementReason::Absolute),
        ("..\\outside\\canary", ConfinementReason::Backslash),
        ("a\0b", ConfinementReason::Nul),
    ] {
        assert_eq!(reason(root.read(path, 1 << 20)), expected, "{path:?}");
        assert_eq!(
            reason(root.write(path, b"overwritten")),
            expected,
            "{path:?}"
        );
        assert_eq!(reason(root.lstat(path)), expected, "{path:?}");
        assert_eq!(reason(root.list(path)), expected, "{path:?}");
        assert_eq!(reason(root.make_dirs(path)), expected, "{path:?}");
        assert_eq!(reason(root.remove(path, true)), expected, "{path:?}");
    }
    // Climbing back down inside the root is fine.
    root.write("a/../b", b"1").unwrap();
    assert_eq!(layout.root_names("."), ["b"]);
    layout.assert_outside_untouched();
}

#[test]
fn the_root_itself() {
    let layout = Layout::new();
    let root = &layout.root;
    for path in ["", ".", "./", "a/.."] {
        assert_eq!(
            root.lstat(path).unwrap(),
            Some(Stat {
                kind: EntryKind::Directory,
                size: None
            })
        );
        assert!(matches!(
            root.read(path, 10),
            Err(Error::IsADirectory { .. })
        ));
        assert!(matches!(
            root.write(path, b""),
            Err(Error::IsADirectory { .. })
        ));
        assert_eq!(reason(root.remove(path, true)), ConfinementReason::Root);
        root.make_dirs(path).unwrap();
        assert_eq!(root.list(path).unwrap(), []);
    }
}

#[test]
fn read_refuses_links_pipes_directories_and_hard_links_without_blocking() {
    let layout = Layout::new();
    let root = &layout.root;
    symlink(layout.outside.join("canary"), layout.host("to-canary")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        layout.host("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    fs::create_dir(layout.host("dir")).unwrap();
    fs::write(layout.host("one"), b"1").unwrap();
    fs::hard_link(layout.host("one"), layout.host("two")).unwrap();

    assert!(matches!(
        root.read("to-canary", 1 << 20),
        Err(Error::NotRegularFile {
            found: Irregular::Symlink,
            ..
        })
    ));
    assert!(matches!(
        root.read("dir", 10),
        Err(Error::IsADirectory { .. })
    ));
    assert!(matches!(
        root.read("two", 10),
        Err(Error::NotRegularFile {
            found: Irregular::HardLinked { links: 2 },
            ..
        })
    ));
    assert!(matches!(root.read("missing", 10), Err(Error::NotFound { path }) if path == "missing"));
    assert!(matches!(
        root.read("no/such/file", 10),
        Err(Error::NotFound { .. })
    ));

    // A pipe with no writer would block a plain open; this read must come back at once.
    let (done, finished) = mpsc::channel();
    let pipe_root = ConfinedRoot::open(&layout.root_path).unwrap();
    std::thread::spawn(move || {
        let _ = done.send(pipe_root.read("pipe", 10));
    });
    let outcome = finished
        .recv_timeout(Duration::from_secs(10))
        .expect("reading a pipe must not block");
    assert!(matches!(
        outcome,
        Err(Error::NotRegularFile {
            found: Irregular::Fifo,
            ..
        })
    ));
    layout.assert_outside_untouched();
}

#[test]
fn read_refuses_over_the_cap_whole() {
    let layout = Layout::new();
    let root = &layout.root;
    let contents: Vec<u8> = (0..=255u8).cycle().take(3 * 1024 * 1024 + 7).collect();
    root.write("big", &contents).unwrap();
    root.write("empty", b"").unwrap();
    let size = contents.len() as u64;
    assert_eq!(root.read("big", size).unwrap(), contents);
    assert_eq!(root.read("big", u64::MAX).unwrap(), contents);
    assert!(
        matches!(root.read("big", size - 1), Err(Error::TooLarge { cap, .. }) if cap == size - 1)
    );
    assert!(matches!(
        root.read("big", 0),
        Err(Error::TooLarge { cap: 0, .. })
    ));
    assert_eq!(root.read("empty", 0).unwrap(), b"");
}

#[test]
fn read_head_cuts_a_larger_file_and_refuses_all_else_read_refuses() {
    let layout = Layout::new();
    let root = &layout.root;
    let contents: Vec<u8> = (0..=255u8).cycle().take(3 * 1024 * 1024 + 7).collect();
    root.write("big", &contents).unwrap();
    let size = contents.len() as u64;
    assert_eq!(root.read_head("big", 10).unwrap(), &contents[..10]);
    assert_eq!(
        root.read_head("big", size - 1).unwrap(),
        &contents[..contents.len() - 1]
    );
    assert_eq!(root.read_head("big", size).unwrap(), contents);
    assert_eq!(root.read_head("big", u64::MAX).unwrap(), contents);
    assert_eq!(root.read_head("big", 0).unwrap(), b"");

    symlink(layout.outside.join("canary"), layout.host("to-canary")).unwrap();
    fs::create_dir(layout.host("dir")).unwrap();
    fs::write(layout.host("one"), b"1").unwrap();
    fs::hard_link(layout.host("one"), layout.host("two")).unwrap();
    assert!(matches!(
        root.read_head("to-canary", 4),
        Err(Error::NotRegularFile {
            found: Irregular::Symlink,
            ..
        })
    ));
    assert!(matches!(
        root.read_head("dir", 4),
        Err(Error::IsADirectory { .. })
    ));
    assert!(matches!(
        root.read_head("two", 4),
        Err(Error::NotRegularFile {
            found: Irregular::HardLinked { links: 2 },
            ..
        })
    ));
    assert!(matches!(
        root.read_head("missing", 4),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        root.read_head("../outside/canary", 4),
        Err(Error::Confinement { .. })
    ));
    layout.assert_outside_untouched();
}

#[test]
fn write_creates_private_directories_and_replaces_what_stood_there() {
    let layout = Layout::new();
    let root = &layout.root;
    root.write("a/b/c.txt", b"first").unwrap();
    assert_eq!(fs::read(layout.host("a/b/c.txt")).unwrap(), b"first");
    for dir in ["a", "a/b"] {
        let mode = fs::metadata(layout.host(dir)).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{dir} must be private, is {mode:o}");
    }
    let file_mode = fs::metadata(layout.host("a/b/c.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        file_mode & 0o077,
        0,
        "the file must be private, is {file_mode:o}"
    );

    // A link planted at the destination is replaced, and its target is not written.
    symlink(layout.outside.join("canary"), layout.host("a/b/c.txt.bak")).unwrap();
    root.write("a/b/c.txt.bak", b"second").unwrap();
    assert!(fs::symlink_metadata(layout.host("a/b/c.txt.bak"))
        .unwrap()
        .is_file());
    assert_eq!(fs::read(layout.host("a/b/c.txt.bak")).unwrap(), b"second");

    // A hard link to the destination keeps the old content: the name is replaced, not the inode.
    fs::hard_link(layout.host("a/b/c.txt"), layout.host("a/alias")).unwrap();
    root.write("a/b/c.txt", b"third").unwrap();
    assert_eq!(fs::read(layout.host("a/alias")).unwrap(), b"first");
    assert_eq!(fs::metadata(layout.host("a/b/c.txt")).unwrap().nlink(), 1);

    assert!(matches!(root.write("a/b", b"x"), Err(Error::IsADirectory { path }) if path == "a/b"));
    // No temporary file is left behind, after success or failure.
    assert_eq!(layout.root_names("a/b"), ["c.txt", "c.txt.bak"]);
    layout.assert_outside_untouched();
}

#[test]
fn write_unless_link_refuses_a_link_at_the_target_and_leaves_it() {
    let layout = Layout::new();
    let root = &layout.root;
    root.write("d/inside", b"inside").unwrap();
    symlink(layout.outside.join("canary"), layout.host("d/out")).unwrap();
    symlink("inside", layout.host("d/in")).unwrap();
    symlink("nowhere", layout.host("d/dangling")).unwrap();
    for link in ["d/out", "d/in", "d/dangling"] {
        assert!(
            matches!(
                root.write_unless_link(link, b"x"),
                Err(Error::Confinement { reason: ConfinementReason::Link, ref path }) if path == link
            ),
            "{link}"
        );
        assert!(
            fs::symlink_metadata(layout.host(link))
                .unwrap()
                .file_type()
                .is_symlink(),
            "{link} is left a link"
        );
    }
    assert_eq!(fs::read(layout.host("d/inside")).unwrap(), b"inside");
    // Everything else is written as `write` writes it: new parents, a new file, a replaced
    // file, a directory refused; a link on the way is refused as by every operation.
    root.write_unless_link("d/new/f", b"1").unwrap();
    root.write_unless_link("d/inside", b"2").unwrap();
    assert_eq!(fs::read(layout.host("d/new/f")).unwrap(), b"1");
    assert_eq!(fs::read(layout.host("d/inside")).unwrap(), b"2");
    assert!(matches!(
        root.write_unless_link("d/new", b"x"),
        Err(Error::IsADirectory { .. })
    ));
    assert_eq!(
        reason(root.write_unless_link("d/in/x", b"x")),
        ConfinementReason::Link
    );
    // `write` itself still replaces a link.
    root.write("d/in", b"3").unwrap();
    assert!(fs::symlink_metadata(layout.host("d/in")).unwrap().is_file());
    // No temporary file is left behind.
    assert_eq!(
        layout.root_names("d"),
        ["dangling", "in", "inside", "new", "out"]
    );
    layout.assert_outside_untouched();
}

#[test]
fn make_dirs_creates_every_missing_level_and_keeps_existing_ones() {
    let layout = Layout::new();
    let root = &layout.root;
    fs::create_dir(layout.host("kept")).unwrap();
    fs::set_permissions(layout.host("kept"), fs::Permissions::from_mode(0o755)).unwrap();
    root.make_dirs("kept/x/y/z").unwrap();
    root.make_dirs("kept/x/y/z").unwrap();
    assert!(fs::symlink_metadata(layout.host("kept/x/y/z"))
        .unwrap()
        .is_dir());
    assert_eq!(
        fs::metadata(layout.host("kept"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    assert_eq!(
        fs::metadata(layout.host("kept/x"))
            .unwrap()
            .permissions()
            .mode()
            & 0o077,
        0
    );
}

#[test]
fn list_is_one_level_sorted_and_shows_links_as_links() {
    let layout = Layout::new();
    let root = &layout.root;
    root.write("d/b.txt", b"12345").unwrap();
    root.make_dirs("d/a-dir/deeper").unwrap();
    symlink(&layout.outside, layout.host("d/c-link")).unwrap();
    fs::write(layout.host("d/back\\slash"), b"").unwrap();
    let listed: Vec<(OsString, Stat)> = root
        .list("d")
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.stat))
        .collect();
    assert_eq!(
        listed,
        [
            (
                OsString::from("a-dir"),
                Stat {
                    kind: EntryKind::Directory,
                    size: None
                }
            ),
            (
                OsString::from("b.txt"),
                Stat {
                    kind: EntryKind::File,
                    size: Some(5)
                }
            ),
            (
                OsString::from("c-link"),
                Stat {
                    kind: EntryKind::Symlink,
                    size: None
                }
            ),
        ]
    );
    assert!(
        matches!(root.list("nothing/here"), Err(Error::NotFound { path }) if path == "nothing")
    );
    assert_eq!(reason(root.list("d/c-link")), ConfinementReason::Link);
    layout.assert_outside_untouched();
}

#[test]
fn remove_unlinks_without_following_and_recurses_only_when_asked() {
    let layout = Layout::new();
    let root = &layout.root;
    root.write("f", b"1").unwrap();
    root.remove("f", false).unwrap();
    assert!(matches!(root.lstat("f"), Ok(None)));
    assert!(matches!(
        root.remove("f", false),
        Err(Error::NotFound { .. })
    ));

    // A link to an outside directory goes as a link; the directory stays.
    symlink(&layout.outside, layout.host("out")).unwrap();
    root.remove("out", true).unwrap();
    assert!(fs::symlink_metadata(layout.host("out")).is_err());

    // A tree with links to the outside inside it: the links go, their targets stay.
    root.write("tree/a/b/c", b"x").unwrap();
    root.write("tree/top", b"y").unwrap();
    symlink(&layout.outside, layout.host("tree/a/out-dir")).unwrap();
    symlink(
        layout.outside.join("canary"),
        layout.host("tree/a/b/out-file"),
    )
    .unwrap();
    assert!(
        matches!(root.remove("tree", false), Err(Error::IsADirectory { path }) if path == "tree")
    );
    assert!(layout.host("tree/a/b/c").exists());
    root.remove("tree", true).unwrap();
    assert_eq!(layout.root_names("."), Vec::<String>::new());
    layout.assert_outside_untouched();
}

#[test]
fn opening_a_root_that_is_a_link_or_a_file_is_refused() {
    let layout = Layout::new();
    symlink(&layout.outside, layout.host("link")).unwrap();
    fs::write(layout.host("file"), b"").unwrap();
    assert_eq!(
        reason(ConfinedRoot::open(layout.host("link"))),
        ConfinementReason::Link
    );
    assert!(matches!(
        ConfinedRoot::open(layout.host("file")),
        Err(Error::NotADirectory { .. })
    ));
    assert!(matches!(
        ConfinedRoot::open(layout.host("missing")),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(layout.root.host_path(), layout.root_path);
}

#[test]
fn windows_rules_refuse_reserved_names_when_chosen() {
    let posix = Layout::new();
    posix.root.write("nul.txt", b"fine on Linux").unwrap();
    posix.root.write("a:b", b"fine on Linux").unwrap();

    let windows = Layout::with(RootOptions::default().name_rules(NameRules::Windows));
    for (path, expected) in [
        ("dir/nul.txt", WindowsNameProblem::DeviceName("NUL".into())),
        (
            "COM\u{b9}",
            WindowsNameProblem::DeviceName("COM\u{b9}".into()),
        ),
        ("conout$", WindowsNameProblem::DeviceName("CONOUT$".into())),
        ("a:b", WindowsNameProblem::ReservedCharacter(':')),
        ("trailing.", WindowsNameProblem::TrailingDotOrSpace),
        ("bell\u{7}", WindowsNameProblem::ControlCharacter('\u{7}')),
    ] {
        assert_eq!(
            reason(windows.root.write(path, b"x")),
            ConfinementReason::ReservedName(expected)
        );
    }
    windows.root.write("dir/console.txt", b"ok").unwrap();
    assert_eq!(windows.root_names("."), ["dir"]);
}

#[test]
fn a_windows_name_refusal_says_which_rule_and_what_broke_it() {
    let windows = Layout::with(RootOptions::default().name_rules(NameRules::Windows));
    for (path, expected) in [
        (
            "dir/nul.txt",
            "dir/nul.txt: refused: reserved name: NUL is a Windows device name",
        ),
        (
            "a|b",
            "a|b: refused: reserved name: the character '|' is reserved on Windows",
        ),
        (
            "trailing ",
            "trailing : refused: reserved name: a trailing dot or space is stripped on Windows",
        ),
        // The control character is named by its code point, which a reader can see.
        (
            "esc\u{1b}",
            "esc\u{1b}: refused: reserved name: the control character U+001B is refused on Windows",
        ),
    ] {
        assert_eq!(
            windows.root.write(path, b"x").unwrap_err().to_string(),
            expected
        );
    }
    // No Unix path can hold an unpaired surrogate; the problem still reads as one sentence.
    assert_eq!(
        WindowsNameProblem::NotUnicode.to_string(),
        "an unpaired surrogate is not a Unicode name"
    );
}

/// A stand-in for a case-folding file system: the kernel resolves the names the test creates,
/// but the directory "stores" some of them with another spelling, as a case-insensitive
/// file system does when `README` was created and `readme` is asked for.
#[derive(Debug)]
struct CaseFoldingListing {
    stored_as: Vec<(OsString, OsString)>,
}

impl DirectoryListing for CaseFoldingListing {
    fn lists_verbatim(&self, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<bool> {
        let stored = KernelListing::names(dir)?.into_iter().map(|listed| {
            self.stored_as
                .iter()
                .find(|(resolved, _)| *resolved == listed)
                .map_or(listed, |(_, spelling)| spelling.clone())
        });
        Ok(stored.into_iter().any(|listed| listed == name))
    }
}

#[test]
fn a_name_that_resolves_but_is_not_listed_verbatim_is_an_alias() {
    let listing = CaseFoldingListing {
        stored_as: vec![
            ("readme".into(), "README".into()),
            ("docs".into(), "Docs".into()),
        ],
    };
    let layout = Layout::with(RootOptions::default().listing(Arc::new(listing)));
    fs::write(layout.host("readme"), b"original").unwrap();
    fs::create_dir(layout.host("docs")).unwrap();
    fs::write(layout.host("docs/page"), b"page").unwrap();
    fs::write(layout.host("plain"), b"plain").unwrap();
    let root = &layout.root;

    assert_eq!(reason(root.read("readme", 100)), ConfinementReason::Alias);
    assert_eq!(reason(root.lstat("readme")), ConfinementReason::Alias);
    assert_eq!(
        reason(root.write("readme", b"clobbered")),
        ConfinementReason::Alias
    );
    assert_eq!(
        reason(root.remove("readme", false)),
        ConfinementReason::Alias
    );
    assert_eq!(
        reason(root.read("docs/page", 100)),
        ConfinementReason::Alias
    );
    assert_eq!(
        reason(root.write("docs/new", b"x")),
        ConfinementReason::Alias
    );
    assert_eq!(reason(root.list("docs")), ConfinementReason::Alias);
    assert_eq!(reason(root.make_dirs("docs/sub")), ConfinementReason::Alias);
    // Names listed verbatim pass, and new names (nothing resolves) are created.
    assert_eq!(root.read("plain", 100).unwrap(), b"plain");
    root.write("fresh", b"new").unwrap();
    assert_eq!(fs::read(layout.host("readme")).unwrap(), b"original");
    assert_eq!(layout.root_names("docs"), ["page"]);
}

#[test]
fn errors_say_which_path_and_why() {
    let layout = Layout::new();
    symlink(&layout.outside, layout.host("out")).unwrap();
    let message = layout.root.read("out/canary", 10).unwrap_err().to_string();
    assert!(
        message.contains("out") && message.contains("link"),
        "{message}"
    );
    let message = layout.root.read("../x", 10).unwrap_err().to_string();
    assert!(
        message.contains("../x") && message.contains("above the root"),
        "{message}"
    );
    let error = layout.root.read("missing", 10).unwrap_err();
    assert!(error.is_refusal() && !error.is_confinement());
    let _: &Path = layout.root.host_path();
}
