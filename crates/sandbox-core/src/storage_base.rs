//! Storage-base planning: which directories of the base to create, decided from no-follow stats.
//!
//! The backend runs the stats where they mean something (docker: inside the container; sbx: on the host side
//! of the mount) and hands the answers here; this module decides, so both backends refuse the same things
//! with the same error kinds. Existing directories are never touched: only the missing suffix is created.

use crate::entry::EntryKind;
use crate::error::SandboxError;
use crate::guest_path::norm;

/// Checks a storage base and returns its normal form.
///
/// The base must be absolute and free of NUL, else [`SandboxError::InvalidArgument`]. The normal form
/// (see [`guest_path::norm`](crate::guest_path::norm)) is what backends record and compare.
pub fn validate_base(base: &str) -> Result<String, SandboxError> {
    if base.contains('\0') {
        return Err(SandboxError::invalid(format!(
            "storage base {base:?} contains a NUL byte"
        )));
    }
    if !base.starts_with('/') {
        return Err(SandboxError::invalid(format!(
            "storage base {base:?} must be an absolute path"
        )));
    }
    Ok(norm(base))
}

/// The directories of a storage base, outermost first: every prefix below `/` (`/` itself is never listed).
///
/// The base is validated first, as by [`validate_base`].
///
/// ```
/// use sandbox_core::storage_base::storage_base_directories;
/// assert_eq!(
///     storage_base_directories("/maf-sandbox/work").unwrap(),
///     ["/maf-sandbox", "/maf-sandbox/work"]
/// );
/// ```
pub fn storage_base_directories(base: &str) -> Result<Vec<String>, SandboxError> {
    let base = validate_base(base)?;
    let mut out = Vec::new();
    let mut current = String::new();
    for component in base.split('/').filter(|c| !c.is_empty()) {
        current.push('/');
        current.push_str(component);
        out.push(current.clone());
    }
    Ok(out)
}

/// Decides what to create for a storage base, from the no-follow stats of its directories.
///
/// `stats[i]` answers [`storage_base_directories`]`(base)[i]` (`None` = missing). Walking outermost first:
/// a directory → next; missing → the result is this directory and every deeper one, outermost first (the
/// deeper ones need no stat, so `stats` may stop at the first `None`); a link →
/// [`SandboxError::Confinement`]; any other non-directory → [`SandboxError::NotADirectory`] naming it. An
/// empty result means the base already exists.
///
/// Too few stats to decide, or more stats than directories, is a caller bug and reads as
/// [`SandboxError::InvalidArgument`], never as success.
///
/// ```
/// use sandbox_core::storage_base::plan_storage_base;
/// use sandbox_core::EntryKind;
/// let create = plan_storage_base("/maf-sandbox/work", &[Some(EntryKind::Directory), None]).unwrap();
/// assert_eq!(create, ["/maf-sandbox/work"]);
/// ```
pub fn plan_storage_base(
    base: &str,
    stats: &[Option<EntryKind>],
) -> Result<Vec<String>, SandboxError> {
    let directories = storage_base_directories(base)?;
    if stats.len() > directories.len() {
        return Err(SandboxError::invalid(format!(
            "storage base {base:?}: {} stats for {} directories",
            stats.len(),
            directories.len()
        )));
    }
    for (index, directory) in directories.iter().enumerate() {
        let Some(stat) = stats.get(index) else {
            return Err(SandboxError::invalid(format!(
                "storage base {base:?}: no stat for {directory:?}"
            )));
        };
        match stat {
            Some(EntryKind::Directory) => {}
            None => return Ok(directories[index..].to_vec()),
            Some(EntryKind::Symlink) => {
                return Err(SandboxError::confinement(
                    base,
                    format!("storage base component {directory:?} is a link"),
                ))
            }
            Some(_) => {
                return Err(SandboxError::NotADirectory {
                    path: directory.clone(),
                })
            }
        }
    }
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use EntryKind::{Directory as D, File as F, Other as O, Symlink as L};

    #[test]
    fn validate_refuses_relative_and_nul() {
        for bad in ["", "work", "./w", "/w\0x", "\0"] {
            assert_eq!(
                validate_base(bad).unwrap_err().kind(),
                ErrorKind::InvalidArgument,
                "{bad:?}"
            );
        }
        assert_eq!(validate_base("//a/./b/").unwrap(), "/a/b");
        assert_eq!(validate_base("/").unwrap(), "/");
    }

    #[test]
    fn directories() {
        assert_eq!(
            storage_base_directories("/a/b/c").unwrap(),
            ["/a", "/a/b", "/a/b/c"]
        );
        assert!(storage_base_directories("/").unwrap().is_empty());
        assert_eq!(storage_base_directories("/a/../b").unwrap(), ["/b"]);
    }

    #[test]
    fn plans_missing_suffix() {
        let base = "/a/b/c";
        assert_eq!(
            plan_storage_base(base, &[None]).unwrap(),
            ["/a", "/a/b", "/a/b/c"]
        );
        assert_eq!(
            plan_storage_base(base, &[Some(D), None]).unwrap(),
            ["/a/b", "/a/b/c"]
        );
        assert_eq!(
            plan_storage_base(base, &[Some(D), None, Some(D)]).unwrap(),
            ["/a/b", "/a/b/c"]
        );
        assert!(plan_storage_base(base, &[Some(D), Some(D), Some(D)])
            .unwrap()
            .is_empty());
        assert!(plan_storage_base("/", &[]).unwrap().is_empty());
    }

    #[test]
    fn refuses_links_and_non_directories() {
        let base = "/a/b/c";
        let e = plan_storage_base(base, &[Some(D), Some(L), None]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Confinement);
        let e = plan_storage_base(base, &[Some(D), Some(D), Some(L)]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Confinement);
        for kind in [F, O] {
            let e = plan_storage_base(base, &[Some(D), Some(kind)]).unwrap_err();
            assert!(matches!(e, SandboxError::NotADirectory { ref path } if path == "/a/b"));
        }
        // An outer refusal wins over a deeper missing directory.
        let e = plan_storage_base(base, &[Some(F), None]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotADirectory);
    }

    #[test]
    fn refuses_undecidable_stats() {
        let base = "/a/b";
        for stats in [&[][..], &[Some(D)][..], &[Some(D), Some(D), Some(D)][..]] {
            assert_eq!(
                plan_storage_base(base, stats).unwrap_err().kind(),
                ErrorKind::InvalidArgument,
                "{stats:?}"
            );
        }
        assert_eq!(
            plan_storage_base("rel", &[None]).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }
}
