//! Guest-path confinement against an independent component-list model, and the concurrent ancestor walk
//! against the sequential one.

use std::collections::HashMap;

use proptest::prelude::*;
use sandbox_core::guest_path::{self, Access};
use sandbox_core::{EntryKind, ErrorKind, SandboxError};

/// The model: an absolute path as its list of components, resolved by a stack.
fn model_resolve(components: &mut Vec<String>, path: &str) {
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                components.pop();
            }
            other => components.push(other.to_owned()),
        }
    }
}

fn model_absolute(path: &str) -> Vec<String> {
    let mut components = Vec::new();
    model_resolve(&mut components, path);
    components
}

fn render(components: &[String]) -> String {
    format!("/{}", components.join("/"))
}

/// The model of `confine`: components of wd, then of the path (from the root if it is absolute); accepted
/// iff there is no backslash and wd's components are a component-wise prefix of the result.
fn model_confine(path: &str, wd: &str) -> Option<Vec<String>> {
    if path.contains('\\') {
        return None;
    }
    let wd_components = model_absolute(wd);
    let mut resolved = if path.starts_with('/') {
        Vec::new()
    } else {
        wd_components.clone()
    };
    model_resolve(&mut resolved, path);
    resolved.starts_with(&wd_components).then_some(resolved)
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just("w".to_owned()),
        Just("w-outside".to_owned()),
        Just("sub".to_owned()),
        Just("sub2".to_owned()),
        Just("a".to_owned()),
        Just("...".to_owned()),
        Just("a\\b".to_owned()),
        "[a-c.\\\\-]{1,3}",
    ]
}

fn relative_path() -> impl Strategy<Value = String> {
    prop::collection::vec(segment(), 0..6).prop_map(|s| s.join("/"))
}

fn any_path() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just(""), Just("/"), Just("//"), Just("///")],
        relative_path(),
    )
        .prop_map(|(lead, rest)| format!("{lead}{rest}"))
}

/// Working directories: absolute, from a small vocabulary so siblings and prefixes collide often.
fn working_dir() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("w"),
            Just("sub"),
            Just("a"),
            Just("."),
            Just(""),
            Just("..")
        ],
        0..4,
    )
    .prop_map(|s| format!("/{}", s.join("/")))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn confine_matches_the_model(path in any_path(), wd in working_dir()) {
        match (guest_path::confine(&path, &wd), model_confine(&path, &wd)) {
            (Ok(resolved), Some(model)) => prop_assert_eq!(resolved, render(&model)),
            (Err(e), None) => prop_assert_eq!(e.kind(), ErrorKind::Confinement),
            (got, want) => prop_assert!(false, "confine({:?}, {:?}) = {:?}, model {:?}", path, wd, got, want),
        }
    }

    #[test]
    fn accepted_paths_stay_within_wd(path in any_path(), wd in working_dir()) {
        if let Ok(resolved) = guest_path::confine(&path, &wd) {
            let rest = guest_path::relative_to(&resolved, &wd);
            prop_assert!(rest.is_some(), "{:?} accepted outside {:?}", resolved, wd);
            let rest = rest.unwrap_or_default();
            // Rejoining the remainder onto wd gives the resolved path back.
            let rejoined = guest_path::norm(&format!("{}/{}", guest_path::norm(&wd), rest));
            prop_assert_eq!(&rejoined, &resolved);
            prop_assert!(!resolved.contains('\\'));
        }
    }

    #[test]
    fn norm_is_idempotent_and_clean(path in any_path()) {
        let once = guest_path::norm(&path);
        prop_assert_eq!(guest_path::norm(&once), once.clone());
        prop_assert!(!once.is_empty());
        prop_assert!(!once.contains("//"));
        if path.starts_with('/') {
            prop_assert!(once.starts_with('/'));
            prop_assert!(once.split('/').all(|c| c != "." && c != ".."));
            prop_assert_eq!(once, render(&model_absolute(&path)));
        } else {
            prop_assert!(!once.starts_with('/'));
        }
    }

    #[test]
    fn string_prefix_siblings_are_outside(
        base in "[a-z]{1,4}(/[a-z]{1,4}){0,2}",
        suffix in "[a-z0-9.-]{1,4}",
    ) {
        // `/<base><suffix>` shares a string prefix with `/<base>` but is a sibling, never inside it.
        let base = format!("/{base}");
        let sibling = format!("{base}{suffix}");
        prop_assume!(guest_path::norm(&sibling) == sibling);
        prop_assert_eq!(guest_path::relative_to(&sibling, &base), None);
        prop_assert!(guest_path::confine(&sibling, &base).is_err());
        prop_assume!(suffix != "." && suffix != "..");
        let inside = format!("{base}/{suffix}");
        prop_assert!(guest_path::relative_to(&inside, &base).is_some());
    }

    #[test]
    fn ancestors_are_a_component_chain(path in any_path(), wd in working_dir()) {
        let Ok(resolved) = guest_path::confine(&path, &wd) else { return Ok(()) };
        let chain = guest_path::ancestors(&resolved, &wd);
        let wd_norm = guest_path::norm(&wd);
        let expected: Vec<String> = {
            let components = model_absolute(&resolved);
            (1..=components.len()).map(|n| render(&components[..n])).collect()
        };
        prop_assert_eq!(&chain, &expected);
        prop_assert!(!chain.contains(&"/".to_owned()));
        if wd_norm != "/" {
            prop_assert!(chain.contains(&wd_norm));
        }
    }
}

/// A random guest tree over a few names, as absolute path → kind.
fn guest_tree() -> impl Strategy<Value = HashMap<String, EntryKind>> {
    let kind = prop_oneof![
        6 => Just(EntryKind::Directory),
        1 => Just(EntryKind::Symlink),
        1 => Just(EntryKind::File),
        1 => Just(EntryKind::Other),
    ];
    let path = prop::collection::vec(prop_oneof![Just("w"), Just("a"), Just("b")], 1..5)
        .prop_map(|c| format!("/{}", c.join("/")));
    prop::collection::hash_map(path, kind, 0..24).prop_map(|raw| {
        // Keep only what a real file system could hold: every proper ancestor of an entry is a directory.
        let consistent = |p: &String| {
            let components: Vec<&str> = p.split('/').skip(1).collect();
            (1..components.len()).all(|n| {
                raw.get(&format!("/{}", components[..n].join("/"))) == Some(&EntryKind::Directory)
            })
        };
        raw.iter()
            .filter(|(p, _)| consistent(p))
            .map(|(p, k)| (p.clone(), *k))
            .collect()
    })
}

/// The model of the walk: the first non-directory among `chain`, judged.
fn model_walk(tree: &HashMap<String, EntryKind>, chain: &[String]) -> Result<(), ErrorKind> {
    for component in chain {
        match tree.get(component) {
            Some(EntryKind::Directory) => {}
            None => return Ok(()),
            Some(EntryKind::Symlink) => return Err(ErrorKind::Confinement),
            Some(_) => return Err(ErrorKind::NotADirectory),
        }
    }
    Ok(())
}

/// The future of one stat in these tests.
type StatFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<EntryKind>, SandboxError>>>>;

/// An async stat that finishes after a per-path number of yields, so completion order is shuffled.
fn shuffled_stat(
    tree: &HashMap<String, EntryKind>,
    delays: &[u8],
) -> impl FnMut(String) -> StatFuture {
    let tree = tree.clone();
    let delays = delays.to_vec();
    let mut calls = 0usize;
    move |p: String| {
        let kind = tree.get(&p).copied();
        let delay = delays
            .get(calls % delays.len().max(1))
            .copied()
            .unwrap_or(0);
        calls += 1;
        Box::pin(async move {
            for _ in 0..delay {
                tokio::task::yield_now().await;
            }
            Ok(kind)
        })
    }
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(future)
}

fn kinds<T>(r: Result<T, SandboxError>) -> Result<T, ErrorKind> {
    r.map_err(|e| e.kind())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn walk_matches_model_sync_and_async(
        tree in guest_tree(),
        path in "[wab]{1}(/[wab]{1}){0,3}",
        wd in prop_oneof![Just("/w"), Just("/w/a"), Just("/a")],
        include_self in any::<bool>(),
        delays in prop::collection::vec(0u8..6, 1..8),
    ) {
        let resolved = guest_path::confine(&path, wd).expect("generated paths are relative and clean");
        let deepest = if include_self { resolved.clone() } else { guest_path::norm(&format!("{resolved}/..")) };
        let want = model_walk(&tree, &guest_path::ancestors(&deepest, wd));
        let stat = |p: &str| Ok(tree.get(p).copied());
        let sync = kinds(guest_path::refuse_linked_ancestors(stat, &path, wd, include_self));
        prop_assert_eq!(sync, want);
        let concurrent = kinds(block_on(guest_path::refuse_linked_ancestors_async(
            shuffled_stat(&tree, &delays), &path, wd, include_self,
        )));
        prop_assert_eq!(concurrent, want);
    }

    #[test]
    fn bundles_agree_sync_and_async(
        tree in guest_tree(),
        path in prop_oneof![Just(String::new()), Just("..".to_owned()), "[wab]{1}(/[wab]{1}){0,3}"],
        wd in prop_oneof![Just("/w"), Just("/w/a")],
        delays in prop::collection::vec(0u8..6, 1..8),
    ) {
        let stat = |p: &str| Ok(tree.get(p).copied());
        prop_assert_eq!(
            kinds(Access::Write.check(stat, &path, wd)),
            kinds(block_on(Access::Write.check_async(shuffled_stat(&tree, &delays), &path, wd)))
        );
        prop_assert_eq!(
            kinds(Access::Read.check(stat, &path, wd)),
            kinds(block_on(Access::Read.check_async(shuffled_stat(&tree, &delays), &path, wd)))
        );
        prop_assert_eq!(
            kinds(Access::List.check(stat, &path, wd)),
            kinds(block_on(Access::List.check_async(shuffled_stat(&tree, &delays), &path, wd)))
        );
        prop_assert_eq!(
            kinds(Access::Delete.check(stat, &path, wd)),
            kinds(block_on(Access::Delete.check_async(shuffled_stat(&tree, &delays), &path, wd)))
        );
        // A write never lands on a link, whatever else holds.
        if let Ok(resolved) = Access::Write.check(stat, &path, wd) {
            prop_assert_ne!(tree.get(&resolved), Some(&EntryKind::Symlink));
        }
    }
}

proptest! {
    /// Listing names: every byte string round-trips through its shown form; a shown form holds a
    /// backslash exactly when it was escaped, so an escaped name never equals an addressable one;
    /// and distinct names are shown distinctly.
    #[test]
    fn listed_names_round_trip_and_never_collide(
        a in proptest::collection::vec(prop_oneof![Just(b'\\'), Just(0xff_u8), Just(0xc3), Just(0xa9), Just(b'x'), any::<u8>()], 0..12),
        b in proptest::collection::vec(prop_oneof![Just(b'\\'), Just(0xff_u8), Just(b'x'), any::<u8>()], 0..12),
    ) {
        use sandbox_core::guest_path::{escape_name, unescape_name};
        let (shown_a, escaped_a) = escape_name(&a);
        prop_assert_eq!(unescape_name(&shown_a), Some(a.clone()));
        prop_assert_eq!(escaped_a, shown_a.contains('\\'));
        let addressable = std::str::from_utf8(&a).is_ok_and(|s| !s.contains('\\'));
        prop_assert_eq!(escaped_a, !addressable);
        let (shown_b, _) = escape_name(&b);
        prop_assert_eq!(shown_a == shown_b, a == b);
    }
}
