//! Where the suites plant their fixtures, derived from the subject's working directory.

/// The suites' own reading of the guest-path normal form, written from the rules in
/// `docs/conformance.md#how-a-run-works` (the paths bullet), not from the core's code: the suites
/// are the oracle the backends (which use `sandbox_core::guest_path`) are judged by, so a mistake
/// in the core must show up as a disagreement, never be copied here.
///
/// It reads the rules as a rewriting to a fixed point, where the core walks a stack: the path is
/// split into its segments with empty and `.` segments gone; then a segment other than `..`
/// followed by `..` cancels out with it, again and again until no such pair is left; what `..`
/// remain stand at the front, and an absolute path drops them (nothing is above its root).
pub(crate) fn norm(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut segments: Vec<&str> = path
        .split('/')
        .filter(|segment| !segment.is_empty() && *segment != ".")
        .collect();
    while let Some(at) = segments
        .windows(2)
        .position(|pair| pair[0] != ".." && pair[1] == "..")
    {
        segments.drain(at..at + 2);
    }
    if absolute {
        segments.retain(|segment| *segment != "..");
        return format!("/{}", segments.join("/"));
    }
    if segments.is_empty() {
        ".".to_owned()
    } else {
        segments.join("/")
    }
}

/// The last component of a guest path.
pub(crate) fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The parent of an absolute guest path (`/` for a top-level one).
pub(crate) fn parent(path: &str) -> String {
    let normal = norm(path);
    match normal.rfind('/') {
        Some(0) | None => "/".to_owned(),
        Some(i) => normal[..i].to_owned(),
    }
}

/// The fixture paths of one subject.
///
/// `outside` is a string-prefix **sibling** of `work` (`/w` and `/w-outside`), so a backend that checks
/// containment by string prefix is caught.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConformancePaths {
    /// The normalised working directory.
    pub work: String,
    /// `work + "-outside"`.
    pub outside: String,
    /// `outside/secret.txt`.
    pub secret: String,
    /// `outside/sub/leaf.txt`.
    pub nested_secret: String,
    /// `work/real/inside.txt` (`work/inside.txt` with flat files).
    pub inside: String,
    /// `work/plain.txt`.
    pub plain: String,
    /// `work/link-dir`.
    pub linked_directory: String,
    /// `work/link-dir/sub`.
    pub under_linked_directory: String,
    /// `work/link-file`.
    pub linked_file: String,
}

impl ConformancePaths {
    /// The paths under `working_directory` with the nested control file.
    pub fn under(working_directory: &str) -> Self {
        Self::with_layout(working_directory, false)
    }

    /// The paths under `working_directory`; `flat_files` moves the control file to `work/inside.txt`.
    pub fn with_layout(working_directory: &str, flat_files: bool) -> Self {
        let work = norm(working_directory);
        let outside = format!("{work}-outside");
        ConformancePaths {
            secret: format!("{outside}/secret.txt"),
            nested_secret: format!("{outside}/sub/leaf.txt"),
            inside: if flat_files {
                format!("{work}/inside.txt")
            } else {
                format!("{work}/real/inside.txt")
            },
            plain: format!("{work}/plain.txt"),
            linked_directory: format!("{work}/link-dir"),
            under_linked_directory: format!("{work}/link-dir/sub"),
            linked_file: format!("{work}/link-file"),
            work,
            outside,
        }
    }

    /// `outside/name` as seen from `work`: `../<basename(work)>-outside/<name>`.
    pub fn beyond(&self, name: &str) -> String {
        format!("../{}-outside/{name}", basename(&self.work))
    }

    /// `work/relative` as an absolute path.
    pub fn in_work(&self, relative: &str) -> String {
        format!("{}/{relative}", self.work)
    }

    /// `outside/relative` as an absolute path.
    pub fn in_outside(&self, relative: &str) -> String {
        format!("{}/{relative}", self.outside)
    }

    /// A path under `work`, relative to `work` (`real/inside.txt`); other paths are returned unchanged.
    pub fn relative(&self, absolute: &str) -> String {
        absolute
            .strip_prefix(&self.work)
            .and_then(|rest| rest.strip_prefix('/'))
            .map(str::to_owned)
            .unwrap_or_else(|| absolute.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norm_reads_the_documented_rules() {
        assert_eq!(norm("//w/./a/../b/"), "/w/b");
        assert_eq!(norm("/.."), "/");
        assert_eq!(norm("/a/../../b"), "/b");
        assert_eq!(norm("../a/.."), "..");
        assert_eq!(norm(""), ".");
        assert_eq!(norm("./."), ".");
        assert_eq!(norm("a/../../b"), "../b");
        assert_eq!(norm("a/b/../../.."), "..");
        assert_eq!(norm("///"), "/");
    }

    /// Every path of up to five segments drawn from the ones the rules treat differently, with
    /// and without a leading slash (and a doubled one).
    fn corpus() -> Vec<String> {
        const SEGMENTS: [&str; 5] = ["", ".", "..", "a", "b"];
        let mut paths = vec![String::new()];
        let mut layer = vec![String::new()];
        for _ in 0..5 {
            layer = layer
                .iter()
                .flat_map(|prefix| {
                    SEGMENTS.iter().map(move |segment| {
                        if prefix.is_empty() {
                            (*segment).to_owned()
                        } else {
                            format!("{prefix}/{segment}")
                        }
                    })
                })
                .collect();
            paths.extend(layer.iter().cloned());
        }
        let relative = paths.clone();
        paths.extend(relative.iter().map(|p| format!("/{p}")));
        paths.extend(relative.iter().map(|p| format!("//{p}")));
        paths
    }

    /// The corpus paths where `candidate` disagrees with the oracle.
    fn disagreements(candidate: impl Fn(&str) -> String) -> Vec<String> {
        corpus()
            .into_iter()
            .filter(|path| candidate(path) != norm(path))
            .collect()
    }

    #[test]
    fn the_core_agrees_with_the_oracle_on_every_short_path() {
        assert!(corpus().len() > 10_000);
        assert_eq!(
            disagreements(sandbox_core::guest_path::norm),
            Vec::<String>::new()
        );
    }

    /// Plausible mistakes in the core's normal form, each a small change to a correct walk: the
    /// oracle catches every one.
    #[test]
    fn the_oracle_catches_a_broken_core() {
        /// A stack walk with switches for the mistakes.
        fn walk(
            path: &str,
            keep_dots_at_root: bool,
            pop_dotdot: bool,
            empty_is_dot: bool,
        ) -> String {
            let absolute = path.starts_with('/');
            let mut stack: Vec<&str> = Vec::new();
            for segment in path.split('/') {
                match segment {
                    "" | "." => {}
                    ".." => match stack.last() {
                        Some(&last) if last != ".." || pop_dotdot => {
                            stack.pop();
                        }
                        _ if absolute && !keep_dots_at_root => {}
                        _ => stack.push(".."),
                    },
                    other => stack.push(other),
                }
            }
            let joined = stack.join("/");
            match (absolute, joined.is_empty()) {
                (true, _) => format!("/{joined}"),
                (false, true) if empty_is_dot => ".".to_owned(),
                (false, _) => joined,
            }
        }
        // The walk without mistakes is right: the broken ones differ only by their mistake.
        assert_eq!(
            disagreements(|p| walk(p, false, false, true)),
            Vec::<String>::new()
        );
        type NormalForm = Box<dyn Fn(&str) -> String>;
        let broken: [(&str, NormalForm); 5] = [
            (
                "`..` climbs above the root",
                Box::new(|p| walk(p, true, false, true)),
            ),
            (
                "`..` cancels a `..`",
                Box::new(|p| walk(p, false, true, true)),
            ),
            (
                "the empty path stays empty",
                Box::new(|p| walk(p, false, false, false)),
            ),
            (
                "a leading `//` is kept",
                Box::new(|p| {
                    let normal = walk(p, false, false, true);
                    if p.starts_with("//") {
                        format!("/{normal}")
                    } else {
                        normal
                    }
                }),
            ),
            (
                "a trailing slash is kept",
                Box::new(|p| {
                    let normal = walk(p, false, false, true);
                    if p.ends_with('/') && normal != "/" {
                        format!("{normal}/")
                    } else {
                        normal
                    }
                }),
            ),
        ];
        for (mistake, candidate) in broken {
            assert!(
                !disagreements(candidate).is_empty(),
                "{mistake} went unnoticed"
            );
        }
    }

    #[test]
    fn paths_under_a_working_directory() {
        let p = ConformancePaths::under("/srv/w/./");
        assert_eq!(p.work, "/srv/w");
        assert_eq!(p.outside, "/srv/w-outside");
        assert_eq!(p.secret, "/srv/w-outside/secret.txt");
        assert_eq!(p.nested_secret, "/srv/w-outside/sub/leaf.txt");
        assert_eq!(p.inside, "/srv/w/real/inside.txt");
        assert_eq!(p.plain, "/srv/w/plain.txt");
        assert_eq!(p.linked_directory, "/srv/w/link-dir");
        assert_eq!(p.under_linked_directory, "/srv/w/link-dir/sub");
        assert_eq!(p.linked_file, "/srv/w/link-file");
        assert_eq!(p.beyond("t.txt"), "../w-outside/t.txt");
        assert_eq!(p.relative(&p.inside), "real/inside.txt");
        assert_eq!(
            ConformancePaths::with_layout("/w", true).inside,
            "/w/inside.txt"
        );
        assert_eq!(parent("/a/b/c"), "/a/b");
        assert_eq!(parent("/a"), "/");
    }
}
