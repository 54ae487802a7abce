//! Property test: random plans of operations, with links planted inside and pointing outside,
//! against an in-memory model of the root. After every step the real tree must equal the model
//! and the sentinel tree outside the root must be exactly as it was.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use confined_fs::{ConfinedRoot, ConfinementReason, EntryKind, Error, Stat};
use proptest::prelude::*;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(Vec<u8>),
    Dir,
    Link(String),
}

/// The root's contents: every entry by its components; the root itself is implicit.
type Tree = BTreeMap<Vec<String>, Node>;

/// The outcome of one operation, reduced to what the model predicts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Done,
    Bytes(Vec<u8>),
    Stat(Option<Stat>),
    Listing(Vec<(String, Stat)>),
    Confinement(ConfinementReason),
    NotADirectory,
    IsADirectory,
    NotFound,
    NotRegularFile,
    TooLarge(u64),
}

#[derive(Debug, Clone)]
enum Op {
    Write(String, usize),
    Read(String, u64),
    Lstat(String),
    List(String),
    MakeDirs(String),
    Remove(String, bool),
    /// The guest plants a link (only where the model says the parent is a real directory).
    PlantLink(String, usize),
}

/// Link targets: outside (relative and absolute), inside, dangling.
fn link_targets(outside: &Path) -> Vec<String> {
    vec![
        "../outside".to_owned(),
        "../../outside/canary".to_owned(),
        outside.display().to_string(),
        outside.join("canary").display().to_string(),
        outside.join("a").display().to_string(),
        "a".to_owned(),
        "b/c".to_owned(),
        "/nonexistent-confined-fs-target".to_owned(),
    ]
}

fn component() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        6 => prop::sample::select(vec!["a", "b", "c", "l", "m"]),
        1 => Just("."),
        1 => Just(".."),
        1 => Just(""),
    ]
}

fn relative_path() -> impl Strategy<Value = String> {
    prop::collection::vec(component(), 1..5).prop_map(|parts| parts.join("/"))
}

fn guest_path() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => relative_path(),
        1 => relative_path().prop_map(|p| format!("/{p}")),
        1 => relative_path().prop_map(|p| p.replacen('/', "\\", 1)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (guest_path(), 0usize..6).prop_map(|(p, n)| Op::Write(p, n)),
        3 => (guest_path(), 0u64..6).prop_map(|(p, c)| Op::Read(p, c)),
        2 => guest_path().prop_map(Op::Lstat),
        2 => guest_path().prop_map(Op::List),
        2 => guest_path().prop_map(Op::MakeDirs),
        2 => (guest_path(), any::<bool>()).prop_map(|(p, r)| Op::Remove(p, r)),
        3 => (guest_path(), 0usize..8).prop_map(|(p, t)| Op::PlantLink(p, t)),
    ]
}

/// The model's lexical normalisation (`sandbox_core::guest_path::norm` without the absolute branch).
fn normalise(path: &str) -> Result<Vec<String>, ConfinementReason> {
    if path.contains('\\') {
        return Err(ConfinementReason::Backslash);
    }
    if path.starts_with('/') {
        return Err(ConfinementReason::Absolute);
    }
    let mut parts: Vec<String> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(ConfinementReason::Escape);
                }
            }
            name => parts.push(name.to_owned()),
        }
    }
    Ok(parts)
}

/// Walks the first `depth` components as directories, creating missing ones when asked.
/// `Ok(false)` when one is missing and not created.
fn model_walk(
    tree: &mut Tree,
    parts: &[String],
    depth: usize,
    create: bool,
) -> Result<bool, Outcome> {
    for index in 0..depth {
        let prefix = parts[..=index].to_vec();
        match tree.get(&prefix) {
            Some(Node::Dir) => {}
            Some(Node::Link(_)) => return Err(Outcome::Confinement(ConfinementReason::Link)),
            Some(Node::File(_)) => return Err(Outcome::NotADirectory),
            None if create => {
                tree.insert(prefix, Node::Dir);
            }
            None => return Ok(false),
        }
    }
    Ok(true)
}

fn stat_of(node: &Node) -> Stat {
    match node {
        Node::File(bytes) => Stat {
            kind: EntryKind::File,
            size: Some(bytes.len() as u64),
        },
        Node::Dir => Stat {
            kind: EntryKind::Directory,
            size: None,
        },
        Node::Link(_) => Stat {
            kind: EntryKind::Symlink,
            size: None,
        },
    }
}

/// What the model predicts for `op`, applying its effect to `tree`.
fn predict(tree: &mut Tree, op: &Op, step: usize) -> Outcome {
    let path = match op {
        Op::Write(p, _)
        | Op::Read(p, _)
        | Op::Lstat(p)
        | Op::List(p)
        | Op::MakeDirs(p)
        | Op::Remove(p, _) => p,
        Op::PlantLink(..) => unreachable!("planting is the guest's move, not an operation"),
    };
    let parts = match normalise(path) {
        Ok(parts) => parts,
        Err(reason) => return Outcome::Confinement(reason),
    };
    let leaf = parts.len().checked_sub(1);
    let result = (|| -> Result<Outcome, Outcome> {
        match op {
            Op::Write(_, len) => {
                let Some(leaf) = leaf else {
                    return Err(Outcome::IsADirectory);
                };
                model_walk(tree, &parts, leaf, true)?;
                if tree.get(&parts) == Some(&Node::Dir) {
                    return Err(Outcome::IsADirectory);
                }
                tree.insert(parts.clone(), Node::File(contents(step, *len)));
                Ok(Outcome::Done)
            }
            Op::Read(_, cap) => {
                let Some(leaf) = leaf else {
                    return Err(Outcome::IsADirectory);
                };
                if !model_walk(tree, &parts, leaf, false)? {
                    return Err(Outcome::NotFound);
                }
                match tree.get(&parts) {
                    None => Err(Outcome::NotFound),
                    Some(Node::Dir) => Err(Outcome::IsADirectory),
                    Some(Node::Link(_)) => Err(Outcome::NotRegularFile),
                    Some(Node::File(bytes)) if bytes.len() as u64 > *cap => {
                        Err(Outcome::TooLarge(*cap))
                    }
                    Some(Node::File(bytes)) => Ok(Outcome::Bytes(bytes.clone())),
                }
            }
            Op::Lstat(_) => {
                let Some(leaf) = leaf else {
                    return Ok(Outcome::Stat(Some(stat_of(&Node::Dir))));
                };
                if !model_walk(tree, &parts, leaf, false)? {
                    return Ok(Outcome::Stat(None));
                }
                Ok(Outcome::Stat(tree.get(&parts).map(stat_of)))
            }
            Op::List(_) => {
                if !model_walk(tree, &parts, parts.len(), false)? {
                    return Err(Outcome::NotFound);
                }
                let listing = tree
                    .iter()
                    .filter(|(key, _)| key.len() == parts.len() + 1 && key.starts_with(&parts))
                    .map(|(key, node)| (key[parts.len()].clone(), stat_of(node)))
                    .collect();
                Ok(Outcome::Listing(listing))
            }
            Op::MakeDirs(_) => {
                model_walk(tree, &parts, parts.len(), true)?;
                Ok(Outcome::Done)
            }
            Op::Remove(_, recursive) => {
                let Some(leaf) = leaf else {
                    return Err(Outcome::Confinement(ConfinementReason::Root));
                };
                if !model_walk(tree, &parts, leaf, false)? {
                    return Err(Outcome::NotFound);
                }
                match tree.get(&parts) {
                    None => Err(Outcome::NotFound),
                    Some(Node::Dir) if !recursive => Err(Outcome::IsADirectory),
                    Some(_) => {
                        tree.retain(|key, _| !key.starts_with(&parts));
                        Ok(Outcome::Done)
                    }
                }
            }
            Op::PlantLink(..) => unreachable!(),
        }
    })();
    result.unwrap_or_else(|refusal| refusal)
}

fn contents(step: usize, len: usize) -> Vec<u8> {
    vec![b'a' + (step % 26) as u8; len]
}

fn observe(root: &ConfinedRoot, op: &Op, step: usize) -> Result<Outcome, Error> {
    let refused = |error: Error| -> Result<Outcome, Error> {
        Ok(match error {
            Error::Confinement { reason, .. } => Outcome::Confinement(reason),
            Error::NotADirectory { .. } => Outcome::NotADirectory,
            Error::IsADirectory { .. } => Outcome::IsADirectory,
            Error::NotFound { .. } => Outcome::NotFound,
            Error::NotRegularFile { .. } => Outcome::NotRegularFile,
            Error::TooLarge { cap, .. } => Outcome::TooLarge(cap),
            other => return Err(other),
        })
    };
    let outcome = match op {
        Op::Write(path, len) => root
            .write(path, &contents(step, *len))
            .map(|()| Outcome::Done),
        Op::Read(path, cap) => root.read(path, *cap).map(Outcome::Bytes),
        Op::Lstat(path) => root.lstat(path).map(Outcome::Stat),
        Op::List(path) => root.list(path).map(|entries| {
            Outcome::Listing(
                entries
                    .into_iter()
                    .map(|e| (e.name.into_string().expect("test names are UTF-8"), e.stat))
                    .collect(),
            )
        }),
        Op::MakeDirs(path) => root.make_dirs(path).map(|()| Outcome::Done),
        Op::Remove(path, recursive) => root.remove(path, *recursive).map(|()| Outcome::Done),
        Op::PlantLink(..) => unreachable!(),
    };
    outcome.or_else(refused)
}

/// Reads a real tree without following links.
fn snapshot(base: &Path) -> Tree {
    fn visit(dir: &Path, prefix: &[String], tree: &mut Tree) {
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let mut key = prefix.to_vec();
            key.push(entry.file_name().into_string().unwrap());
            let meta = fs::symlink_metadata(entry.path()).unwrap();
            if meta.file_type().is_symlink() {
                let target = fs::read_link(entry.path()).unwrap();
                tree.insert(key, Node::Link(target.display().to_string()));
            } else if meta.is_dir() {
                tree.insert(key.clone(), Node::Dir);
                visit(&entry.path(), &key, tree);
            } else {
                tree.insert(key, Node::File(fs::read(entry.path()).unwrap()));
            }
        }
    }
    let mut tree = Tree::new();
    visit(base, &[], &mut tree);
    tree
}

/// The sentinel tree with every entry's modification time.
fn sentinel_state(outside: &Path) -> (Tree, Vec<(PathBuf, SystemTime)>) {
    let mut times = Vec::new();
    for entry in ["", "canary", "a", "a/inner", "sub", "sub/deep"] {
        let path = outside.join(entry);
        times.push((
            path.clone(),
            fs::symlink_metadata(&path).unwrap().modified().unwrap(),
        ));
    }
    (snapshot(outside), times)
}

fn run_plan(plan: &[Op]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let root_path = dir.path().join("root");
    let outside = dir.path().join("outside");
    fs::create_dir(&root_path).unwrap();
    fs::create_dir_all(outside.join("a")).unwrap();
    fs::create_dir_all(outside.join("sub")).unwrap();
    fs::write(outside.join("canary"), b"canary").unwrap();
    fs::write(outside.join("a/inner"), b"inner").unwrap();
    fs::write(outside.join("sub/deep"), b"deep").unwrap();
    let sentinel = sentinel_state(&outside);
    let targets = link_targets(&outside);
    let root = ConfinedRoot::open(&root_path).unwrap();
    let mut model = Tree::new();

    for (step, op) in plan.iter().enumerate() {
        if let Op::PlantLink(path, target) = op {
            let Ok(parts) = normalise(path) else { continue };
            let Some(leaf) = parts.len().checked_sub(1) else {
                continue;
            };
            let mut scratch = model.clone();
            let parent_is_real = model_walk(&mut scratch, &parts, leaf, false) == Ok(true);
            if parent_is_real && !model.contains_key(&parts) {
                let target = &targets[*target];
                symlink(target, root_path.join(parts.join("/"))).unwrap();
                model.insert(parts, Node::Link(target.clone()));
            }
        } else {
            let expected = predict(&mut model, op, step);
            let observed = observe(&root, op, step);
            let observed = match observed {
                Ok(outcome) => outcome,
                Err(error) => {
                    return Err(TestCaseError::fail(format!(
                        "step {step} {op:?}: untyped failure {error}"
                    )))
                }
            };
            prop_assert_eq!(&observed, &expected, "step {} {:?}", step, op);
        }
        prop_assert_eq!(
            snapshot(&root_path),
            model.clone(),
            "root diverged after step {} {:?}",
            step,
            op
        );
        prop_assert_eq!(
            sentinel_state(&outside),
            sentinel.clone(),
            "outside changed after step {} {:?}",
            step,
            op
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_plan_reaches_outside_the_root(plan in prop::collection::vec(op(), 1..32)) {
        run_plan(&plan)?;
    }
}

#[test]
fn a_fixed_plan_through_planted_links() {
    let plan = vec![
        Op::MakeDirs("a/b".into()),
        Op::PlantLink("l".into(), 0),
        Op::PlantLink("a/m".into(), 5),
        Op::Write("l/canary".into(), 3),
        Op::Write("a/m/x".into(), 3),
        Op::Read("l/canary".into(), 100),
        Op::List("l".into()),
        Op::Remove("l".into(), true),
        Op::Write("a/b/../c".into(), 2),
        Op::Read("a/c".into(), 1),
        Op::Remove("a".into(), true),
    ];
    run_plan(&plan).unwrap();
}
