//! The Debian roots: one `debootstrap --variant=minbase` of every root's packages, then per root a
//! copy with the packages it lacks purged, archived once.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::scratch::{remove_tree, unmount_under, Scratch};
use super::{
    ensure_dir, run_checked, write_file, DebianTools, HostTools, ImageRecipe, AGENT_ID, AGENT_USER,
    DEBIAN_SUITE, IMAGE_PATH, NOTOOLS_REMOVED, ROOT_RECIPE_VERSION,
};
use crate::error::DockerError;

/// A debootstrapped root: one per package set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum DebianRoot {
    /// `--include=util-linux,coreutils,curl`, user `agent`.
    Base,
    /// The base packages plus bash, mount, sudo and CPython; `agent` may sudo without a
    /// password.
    SbxShell,
    /// The base packages plus CPython (Debian's `python3`), user `agent`.
    Python,
}

/// What the one debootstrap installs besides minbase: the packages of every root. `bash` and
/// `mount` are of priority `required`, so minbase has them in the base root too; `sudo` and
/// `python3` are not, and are purged from the copies of the roots without them
/// ([`DebianRoot::purged`]).
pub(super) const BOOTSTRAP_INCLUDES: &str = "util-linux,coreutils,curl,bash,mount,sudo,python3";

/// CPython's packages (`python3` and what it depends on that only Python uses), purged from a
/// root without Python. The libraries they pulled in (libffi, libsqlite3, ...) stay: nothing
/// runs them without the interpreter.
pub(super) const PYTHON_PACKAGES: [&str; 7] = [
    "python3",
    "python3.11",
    "python3-minimal",
    "python3.11-minimal",
    "libpython3-stdlib",
    "libpython3.11-stdlib",
    "libpython3.11-minimal",
];

/// What the base root purges: sudo and CPython.
const BASE_PURGED: [&str; 8] = [
    "sudo",
    PYTHON_PACKAGES[0],
    PYTHON_PACKAGES[1],
    PYTHON_PACKAGES[2],
    PYTHON_PACKAGES[3],
    PYTHON_PACKAGES[4],
    PYTHON_PACKAGES[5],
    PYTHON_PACKAGES[6],
];

impl DebianRoot {
    /// The packages this root holds besides minbase.
    pub(super) fn includes(self) -> &'static str {
        match self {
            DebianRoot::Base => "util-linux,coreutils,curl",
            DebianRoot::SbxShell => "util-linux,coreutils,curl,bash,mount,sudo,python3",
            DebianRoot::Python => "util-linux,coreutils,curl,python3",
        }
    }

    /// The packages of [`BOOTSTRAP_INCLUDES`] this root must not hold.
    pub(super) fn purged(self) -> &'static [&'static str] {
        match self {
            DebianRoot::Base => &BASE_PURGED,
            DebianRoot::SbxShell => &[],
            DebianRoot::Python => &["sudo"],
        }
    }

    fn id(self) -> &'static str {
        match self {
            DebianRoot::Base => "base",
            DebianRoot::SbxShell => "sbx-shell",
            DebianRoot::Python => "python",
        }
    }

    fn archive_name(self) -> String {
        format!(
            "debian-{DEBIAN_SUITE}-{}-v{ROOT_RECIPE_VERSION}.tar",
            self.id()
        )
    }
}

impl ImageRecipe {
    /// The tar archives of `roots`, each from the cache when there. The missing ones come from
    /// one debootstrap of [`BOOTSTRAP_INCLUDES`] (every root's packages): each root is a copy of
    /// that tree (the last one the tree itself) with the packages it lacks purged, the user
    /// added and the package caches emptied.
    pub(super) async fn debian_archives(
        &self,
        roots: &[DebianRoot],
        tools: &HostTools,
        scratch: &Scratch,
    ) -> Result<HashMap<DebianRoot, PathBuf>, DockerError> {
        let debian = tools
            .debian
            .as_ref()
            .ok_or_else(|| DockerError::HostToolMissing {
                program: "debootstrap".to_owned(),
                package: "debootstrap".to_owned(),
            })?;
        let cache = match &self.cache_dir {
            Some(dir) => Some(ensure_dir(dir)?),
            None => None,
        };
        let mut archives = HashMap::new();
        let mut missing = Vec::new();
        for root in roots {
            let archive = match &cache {
                Some(dir) => dir.join(root.archive_name()),
                None => scratch.path().join(root.archive_name()),
            };
            if archive.is_file() {
                self.say(&format!("  using cached root {}", archive.display()));
                archives.insert(*root, archive);
            } else if !missing.iter().any(|(other, _)| other == root) {
                missing.push((*root, archive));
            }
        }
        let Some(last) = missing.len().checked_sub(1) else {
            return Ok(archives);
        };

        let shared = scratch.path().join("root-bootstrap");
        self.bootstrap(&shared, cache.as_deref(), debian).await?;
        for (index, (root, archive)) in missing.into_iter().enumerate() {
            let tree = if index == last {
                shared.clone()
            } else {
                let copy = scratch.path().join(format!("root-{}", root.id()));
                let args: Vec<OsString> = vec![
                    "-a".into(),
                    shared.clone().into_os_string(),
                    copy.clone().into_os_string(),
                ];
                run_checked(&debian.cp, &args, &[], self.import_timeout).await?;
                copy
            };
            self.finish_root(root, &tree, &archive, debian).await?;
            archives.insert(root, archive);
        }
        Ok(archives)
    }

    /// `debootstrap --variant=minbase` of [`BOOTSTRAP_INCLUDES`] into `target`, keeping the
    /// downloaded packages under `cache/debs` when there is a cache.
    async fn bootstrap(
        &self,
        target: &Path,
        cache: Option<&Path>,
        debian: &DebianTools,
    ) -> Result<(), DockerError> {
        let mut args: Vec<OsString> = vec![
            "--variant=minbase".into(),
            format!("--include={BOOTSTRAP_INCLUDES}").into(),
        ];
        if let Some(dir) = cache {
            let debs = ensure_dir(&dir.join("debs"))?;
            let mut flag = OsString::from("--cache-dir=");
            flag.push(debs.as_os_str());
            args.push(flag);
        }
        args.extend([
            OsString::from(DEBIAN_SUITE),
            target.to_owned().into_os_string(),
            OsString::from(&debian.mirror),
        ]);
        self.say(&format!(
            "  debootstrap {DEBIAN_SUITE} (minbase + {BOOTSTRAP_INCLUDES}) from {}",
            debian.mirror
        ));
        let started = Instant::now();
        let outcome = run_checked(
            &debian.debootstrap,
            &args,
            &chroot_env(),
            self.bootstrap_timeout,
        )
        .await;
        // debootstrap unmounts what it mounted on a normal exit; a killed one may not have.
        unmount_under(target);
        outcome?;
        self.say(&format!(
            "  debootstrap done in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    /// Makes `tree` (a copy of the bootstrapped tree) into `root` and archives it to `archive`:
    /// purges the packages the root lacks, adds the user, empties the package caches.
    async fn finish_root(
        &self,
        root: DebianRoot,
        tree: &Path,
        archive: &Path,
        debian: &DebianTools,
    ) -> Result<(), DockerError> {
        let purged = root.purged();
        if !purged.is_empty() {
            let mut args: Vec<OsString> =
                vec![tree.as_os_str().to_owned(), "dpkg".into(), "--purge".into()];
            args.extend(purged.iter().map(OsString::from));
            // sudo's removal script refuses while root has no password (as in every root
            // here) unless told the removal is meant.
            let mut env = chroot_env();
            env.push(("SUDO_FORCE_REMOVE", "yes"));
            run_checked(&debian.chroot, &args, &env, self.command_timeout).await?;
            self.say(&format!(
                "  {}: purged {} from a copy of the bootstrapped root",
                root.id(),
                purged.join(", ")
            ));
        }
        self.add_agent_user(root, tree, debian).await?;
        trim_package_caches(tree)?;

        let partial = archive.with_extension("tar.partial");
        let tar_args: Vec<OsString> = vec![
            "--numeric-owner".into(),
            "-C".into(),
            tree.to_owned().into_os_string(),
            "-cf".into(),
            partial.clone().into_os_string(),
            ".".into(),
        ];
        let archived = run_checked(&debian.tar, &tar_args, &[], self.import_timeout).await;
        if let Err(error) = archived {
            let _ = std::fs::remove_file(&partial);
            return Err(error);
        }
        std::fs::rename(&partial, archive).map_err(|source| DockerError::Io {
            action: "moving the root archive into place at",
            path: archive.to_owned(),
            source,
        })?;
        remove_tree(tree)?;
        self.say(&format!(
            "  root {} (minbase + {}) archived to {} ({} MiB)",
            root.id(),
            root.includes(),
            archive.display(),
            file_size(archive) / (1024 * 1024)
        ));
        Ok(())
    }

    /// Adds user `agent` (1000:1000, home `/home/agent`) inside the root, and for the sbx
    /// shell root the passwordless sudo rule.
    async fn add_agent_user(
        &self,
        root: DebianRoot,
        target: &Path,
        debian: &DebianTools,
    ) -> Result<(), DockerError> {
        let id = AGENT_ID.to_string();
        let group: Vec<OsString> = vec![
            target.as_os_str().to_owned(),
            "groupadd".into(),
            "--gid".into(),
            id.clone().into(),
            AGENT_USER.into(),
        ];
        run_checked(&debian.chroot, &group, &chroot_env(), self.command_timeout).await?;
        let user: Vec<OsString> = vec![
            target.as_os_str().to_owned(),
            "useradd".into(),
            "--uid".into(),
            id.clone().into(),
            "--gid".into(),
            id.into(),
            "--create-home".into(),
            "--shell".into(),
            "/bin/bash".into(),
            AGENT_USER.into(),
        ];
        run_checked(&debian.chroot, &user, &chroot_env(), self.command_timeout).await?;
        if root == DebianRoot::SbxShell {
            let rule = target.join("etc/sudoers.d").join(AGENT_USER);
            write_file(&rule, b"agent ALL=(ALL:ALL) NOPASSWD: ALL\n", 0o440)?;
        }
        self.say(&format!(
            "  user {AGENT_USER} ({AGENT_ID}:{AGENT_ID}) added{}",
            if root == DebianRoot::SbxShell {
                ", with passwordless sudo"
            } else {
                ""
            }
        ));
        Ok(())
    }

    /// A copy of the base archive without the wrapper's `base64` and `setsid`.
    pub(super) async fn without_wrapper_tools(
        &self,
        base: &Path,
        tools: &HostTools,
        scratch: &Scratch,
    ) -> Result<PathBuf, DockerError> {
        let debian = tools
            .debian
            .as_ref()
            .ok_or_else(|| DockerError::HostToolMissing {
                program: "tar".to_owned(),
                package: "tar".to_owned(),
            })?;
        let copy = scratch.path().join("notools.tar");
        std::fs::copy(base, &copy).map_err(|source| DockerError::Io {
            action: "copying the base root archive to",
            path: copy.clone(),
            source,
        })?;
        let mut args: Vec<OsString> = vec![
            "--delete".into(),
            "-f".into(),
            copy.clone().into_os_string(),
        ];
        args.extend(NOTOOLS_REMOVED.map(OsString::from));
        run_checked(&debian.tar, &args, &[], self.import_timeout).await?;
        self.say(&format!(
            "  removed {} from a copy of the base root",
            NOTOOLS_REMOVED.join(", ")
        ));
        Ok(copy)
    }
}

/// The environment debootstrap and chroot'ed tools run with: a full sbin `PATH`, the C locale
/// (the root has no other), and no interactive package prompts.
fn chroot_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("PATH", IMAGE_PATH),
        ("LC_ALL", "C"),
        ("LANGUAGE", ""),
        ("DEBIAN_FRONTEND", "noninteractive"),
    ]
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|meta| meta.len()).unwrap_or(0)
}

/// Empties the package caches debootstrap leaves (downloaded .debs and index files): they
/// only make the image larger.
fn trim_package_caches(root: &Path) -> Result<(), DockerError> {
    for dir in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        let dir = root.join(dir);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
            if is_file && path.file_name() != Some(OsStr::new("lock")) {
                std::fs::remove_file(&path).map_err(|source| DockerError::Io {
                    action: "removing",
                    path: path.clone(),
                    source,
                })?;
            }
        }
    }
    Ok(())
}

// ----- host facts -----

/// The effective uid of this process, from `/proc/self/status`.
pub(super) fn effective_uid() -> Result<u32, DockerError> {
    let path = Path::new("/proc/self/status");
    let status = std::fs::read_to_string(path).map_err(|source| DockerError::Io {
        action: "reading",
        path: path.to_owned(),
        source,
    })?;
    effective_uid_from_status(&status).ok_or_else(|| DockerError::Io {
        action: "finding the effective uid in",
        path: path.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no readable Uid line"),
    })
}

/// The second field of the `Uid:` line (real, effective, saved, file-system).
fn effective_uid_from_status(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|id| id.parse().ok())
}

const APT_SOURCE_FILES: &str =
    "/etc/apt/sources.list, /etc/apt/sources.list.d/*.list and *.sources";

/// The Debian mirror in the host's apt sources to bootstrap the images' suite (`bookworm`) from: the first
/// `deb … main` source listing that suite, else the first plain Debian archive (a URI ending in
/// `/debian`), which serves every suite.
///
/// # Errors
///
/// [`DockerError::NoDebianMirror`] when no source qualifies.
pub fn mirror_from_apt_sources() -> Result<String, DockerError> {
    let mut files = Vec::new();
    let main = PathBuf::from("/etc/apt/sources.list");
    if let Ok(text) = std::fs::read_to_string(&main) {
        files.push((main, text));
    }
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<PathBuf> = entries.flatten().map(|entry| entry.path()).collect();
        paths.sort();
        for path in paths {
            let apt_reads_it = matches!(
                path.extension().and_then(OsStr::to_str),
                Some("list" | "sources")
            );
            if apt_reads_it {
                if let Ok(text) = std::fs::read_to_string(&path) {
                    files.push((path, text));
                }
            }
        }
    }
    debian_mirror(&files, DEBIAN_SUITE).ok_or_else(|| DockerError::NoDebianMirror {
        suite: DEBIAN_SUITE.to_owned(),
        searched: APT_SOURCE_FILES.to_owned(),
    })
}

/// One enabled `deb` source: its URIs and suites (components must include `main`).
#[derive(Debug, PartialEq, Eq)]
struct AptSource {
    uris: Vec<String>,
    suites: Vec<String>,
}

/// Picks the mirror for `suite`: the first `deb … main` source listing that exact suite, else
/// the first plain Debian archive (a URI ending in `/debian`) with any suite, which serves
/// every suite.
fn debian_mirror(files: &[(PathBuf, String)], suite: &str) -> Option<String> {
    let mut sources = Vec::new();
    for (path, text) in files {
        if path.extension().and_then(OsStr::to_str) == Some("sources") {
            sources.extend(parse_deb822_sources(text));
        } else {
            sources.extend(parse_one_line_sources(text));
        }
    }
    let exact = sources
        .iter()
        .find(|source| source.suites.iter().any(|s| s == suite))
        .and_then(|source| source.uris.first());
    let archive = || {
        sources
            .iter()
            .flat_map(|source| source.uris.iter())
            .find(|uri| uri.trim_end_matches('/').ends_with("/debian"))
    };
    exact
        .or_else(archive)
        .map(|uri| uri.trim_end_matches('/').to_owned())
}

/// `deb [options] uri suite component…` lines.
fn parse_one_line_sources(text: &str) -> Vec<AptSource> {
    let mut sources = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(rest) = line
            .strip_prefix("deb ")
            .or_else(|| line.strip_prefix("deb\t"))
        else {
            continue;
        };
        let mut rest = rest.trim_start();
        if let Some(options) = rest.strip_prefix('[') {
            match options.split_once(']') {
                Some((_, after)) => rest = after.trim_start(),
                None => continue,
            }
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() >= 3 && fields[2..].contains(&"main") {
            sources.push(AptSource {
                uris: vec![fields[0].to_owned()],
                suites: vec![fields[1].to_owned()],
            });
        }
    }
    sources
}

/// deb822 stanzas (`Types:`, `URIs:`, `Suites:`, `Components:`, `Enabled:`), separated by blank
/// lines; `#` lines are comments.
fn parse_deb822_sources(text: &str) -> Vec<AptSource> {
    let mut sources = Vec::new();
    for stanza in text.split("\n\n") {
        let mut fields: HashMap<String, String> = HashMap::new();
        let mut last: Option<String> = None;
        for line in stanza.lines() {
            if line.trim_start().starts_with('#') || line.trim().is_empty() {
                continue;
            }
            if line.starts_with(' ') || line.starts_with('\t') {
                if let Some(key) = &last {
                    let value = fields.entry(key.clone()).or_default();
                    value.push(' ');
                    value.push_str(line.trim());
                }
                continue;
            }
            if let Some((key, value)) = line.split_once(':') {
                let key = key.trim().to_ascii_lowercase();
                fields.insert(key.clone(), value.trim().to_owned());
                last = Some(key);
            }
        }
        let words = |key: &str| -> Vec<String> {
            fields
                .get(key)
                .map(|value| value.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default()
        };
        let enabled = fields
            .get("enabled")
            .is_none_or(|value| !value.eq_ignore_ascii_case("no"));
        if enabled
            && words("types").iter().any(|t| t == "deb")
            && words("components").iter().any(|c| c == "main")
        {
            sources.push(AptSource {
                uris: words("uris"),
                suites: words("suites"),
            });
        }
    }
    sources
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_comes_from_deb822_sources_for_the_suite() {
        let sources = "Types: deb\n# http://snapshot.example/archive\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n";
        let files = vec![(
            PathBuf::from("/etc/apt/sources.list.d/debian.sources"),
            sources.to_owned(),
        )];
        assert_eq!(
            debian_mirror(&files, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
    }

    #[test]
    fn mirror_skips_disabled_stanzas_and_sources_without_main() {
        let sources = "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\nTypes: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\nComponents: main\n\nTypes: deb\nURIs: http://contrib.example/debian\nSuites: bookworm\nComponents: contrib\n";
        let files = vec![(PathBuf::from("a.sources"), sources.to_owned())];
        assert_eq!(debian_mirror(&files, "bookworm"), None);
    }

    #[test]
    fn mirror_comes_from_one_line_sources_with_options() {
        let list = "# comment\ndeb [arch=amd64 signed-by=/k.gpg] https://other.example/apt stable main\ndeb http://ftp.example/debian bookworm main contrib # trailing\n";
        let files = vec![(PathBuf::from("/etc/apt/sources.list"), list.to_owned())];
        assert_eq!(
            debian_mirror(&files, "bookworm").as_deref(),
            Some("http://ftp.example/debian")
        );
    }

    #[test]
    fn mirror_falls_back_to_a_debian_archive_of_another_suite() {
        let list = "deb https://vendor.example/apt stable main\ndeb http://ftp.example/debian/ trixie main\n";
        let files = vec![(PathBuf::from("sources.list"), list.to_owned())];
        assert_eq!(
            debian_mirror(&files, "bookworm").as_deref(),
            Some("http://ftp.example/debian")
        );
        let vendor_only = vec![(
            PathBuf::from("sources.list"),
            "deb https://vendor.example/apt stable main\n".to_owned(),
        )];
        assert_eq!(debian_mirror(&vendor_only, "bookworm"), None);
    }

    #[test]
    fn effective_uid_is_the_second_uid_field() {
        let status = "Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t5\t5\t5\t5\n";
        assert_eq!(effective_uid_from_status(status), Some(0));
        assert_eq!(effective_uid_from_status("Name:\tx\n"), None);
    }
}
