//! Where the suites plant their fixtures, derived from the subject's working directory.

/// Lexical normal form of a guest path: `.` and empty segments dropped, `..` pops (dropped
/// at the root, kept in a relative path with nothing to pop), leading slashes folded into one, `.` for
/// the empty result.
///
/// Deliberately not `sandbox_core::guest_path::norm`: the suites are the oracle the backends (which use
/// the core's helpers) are judged by, so they keep their own reading of the rule.
pub(crate) fn norm(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => match segments.last() {
                Some(&last) if last != ".." => {
                    segments.pop();
                }
                _ if absolute => {}
                _ => segments.push(".."),
            },
            other => segments.push(other),
        }
    }
    let joined = segments.join("/");
    match (absolute, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_owned(),
        (false, false) => joined,
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
    fn norm_matches_the_core_rule() {
        assert_eq!(norm("//w/./a/../b/"), "/w/b");
        assert_eq!(norm("/.."), "/");
        assert_eq!(norm("../a/.."), "..");
        assert_eq!(norm(""), ".");
        assert_eq!(norm("a/../../b"), "../b");
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
