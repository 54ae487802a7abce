//! Drives `confined_fs::ConfinedRoot` with arbitrary plans of operations, interleaved with links
//! a guest plants (inside the root, pointing inside and outside it). Whatever the plan, the
//! sentinel tree beside the root must be unchanged, nothing outside may be read, and no
//! operation may panic.
#![no_main]

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::Path;

use arbitrary::Arbitrary;
use confined_fs::{ConfinedRoot, EntryKind};
use libfuzzer_sys::fuzz_target;

const CANARY: &[u8] = b"sentinel outside the root";
const MAX_STEPS: usize = 48;

#[derive(Arbitrary, Debug)]
enum Component {
    A,
    B,
    Link,
    Dot,
    DotDot,
    Empty,
    Outside,
    Canary,
    /// Any bytes a caller might hand in: separators, backslashes, NUL, non-ASCII.
    Raw(String),
}

impl Component {
    fn text(&self) -> &str {
        match self {
            Self::A => "a",
            Self::B => "b",
            Self::Link => "l",
            Self::Dot => ".",
            Self::DotDot => "..",
            Self::Empty => "",
            Self::Outside => "outside",
            Self::Canary => "canary",
            Self::Raw(raw) => raw,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct GuestPath {
    absolute: bool,
    components: Vec<Component>,
}

impl GuestPath {
    fn render(&self) -> String {
        let joined = self
            .components
            .iter()
            .map(Component::text)
            .collect::<Vec<_>>()
            .join("/");
        if self.absolute {
            format!("/{joined}")
        } else {
            joined
        }
    }
}

#[derive(Arbitrary, Debug)]
enum LinkTarget {
    OutsideRelative,
    OutsideAbsolute,
    CanaryAbsolute,
    Inside,
    Dangling,
}

#[derive(Arbitrary, Debug)]
enum Step {
    Write {
        path: GuestPath,
        len: u8,
    },
    Read {
        path: GuestPath,
        cap: u8,
    },
    Lstat(GuestPath),
    List(GuestPath),
    MakeDirs(GuestPath),
    Remove {
        path: GuestPath,
        recursive: bool,
    },
    /// The guest plants a link named `name` in the directory `parent` (when it is a real one).
    PlantLink {
        parent: GuestPath,
        name: Component,
        target: LinkTarget,
    },
}

/// Names, contents and modification times of the sentinel tree.
fn sentinel(outside: &Path) -> Vec<(String, Vec<u8>, i64, i64)> {
    let mut state = Vec::new();
    for entry in ["", "canary", "a", "a/inner"] {
        let path = outside.join(entry);
        let meta = fs::symlink_metadata(&path).expect("the sentinel exists");
        let contents = if meta.is_file() {
            fs::read(&path).expect("the sentinel reads")
        } else {
            Vec::new()
        };
        state.push((entry.to_owned(), contents, meta.mtime(), meta.mtime_nsec()));
    }
    let mut names: Vec<_> = fs::read_dir(outside)
        .expect("the sentinel lists")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    state.push((names.join(","), Vec::new(), 0, 0));
    state
}

fuzz_target!(|steps: Vec<Step>| {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root_path = dir.path().join("root");
    let outside = dir.path().join("outside");
    fs::create_dir(&root_path).expect("the root is made");
    fs::create_dir_all(outside.join("a")).expect("the sentinel is made");
    fs::write(outside.join("canary"), CANARY).expect("the canary is written");
    fs::write(outside.join("a/inner"), CANARY).expect("the inner canary is written");
    let before = sentinel(&outside);
    let root = ConfinedRoot::open(&root_path).expect("the root opens");

    for step in steps.iter().take(MAX_STEPS) {
        match step {
            Step::Write { path, len } => {
                let _ = root.write(path.render(), &vec![b'w'; usize::from(*len)]);
            }
            Step::Read { path, cap } => {
                if let Ok(bytes) = root.read(path.render(), u64::from(*cap) * 4) {
                    assert_ne!(bytes, CANARY, "read reached the sentinel");
                }
            }
            Step::Lstat(path) => {
                let _ = root.lstat(path.render());
            }
            Step::List(path) => {
                let _ = root.list(path.render());
            }
            Step::MakeDirs(path) => {
                let _ = root.make_dirs(path.render());
            }
            Step::Remove { path, recursive } => {
                let _ = root.remove(path.render(), *recursive);
            }
            Step::PlantLink {
                parent,
                name,
                target,
            } => {
                let parent = parent.render();
                let name = name.text();
                // Plant only through real directories, as checked by the crate itself, so the
                // planting never follows a link out of the root.
                let parent_is_real = matches!(root.lstat(&parent), Ok(Some(stat)) if stat.kind == EntryKind::Directory);
                let simple_name =
                    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0']);
                if parent_is_real
                    && simple_name
                    && !parent.starts_with('/')
                    && !parent.contains(['\\', '\0'])
                {
                    let target = match target {
                        LinkTarget::OutsideRelative => "../outside".into(),
                        LinkTarget::OutsideAbsolute => outside.clone(),
                        LinkTarget::CanaryAbsolute => outside.join("canary"),
                        LinkTarget::Inside => "a".into(),
                        LinkTarget::Dangling => "/nonexistent-confined-fs-fuzz".into(),
                    };
                    let _ = symlink(target, root_path.join(&parent).join(name));
                }
            }
        }
    }
    assert_eq!(sentinel(&outside), before, "the sentinel tree changed");
});
