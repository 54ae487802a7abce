//! The host layout under the workspace root, and the per-sandbox record.
//!
//! ```text
//! <root>/                 0700
//!   <name>/               0700, named like the sandbox
//!     meta.json           the record (temp + fsync + rename); `instance_id` present = ready
//!     ws-<12 hex>/        0700, the only directory sbx mounts; fresh per create
//! ```
//!
//! The directories are the second record of what exists: sbx can lose its engine and list
//! nothing, and a disposal from another process still finds every name here. Everything in this
//! module is blocking file I/O: call it on the blocking pool.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use host_state::{self, random_hex, Placing};
use serde::{Deserialize, Serialize};

/// The record's file name.
pub(crate) const RECORD: &str = "meta.json";
/// The record's format version.
pub(crate) const RECORD_VERSION: u32 = 1;
/// The prefix of every workspace generation directory.
pub(crate) const GENERATION_PREFIX: &str = "ws-";

/// What `meta.json` holds (field names shared with the Python implementation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// Always [`RECORD_VERSION`].
    pub(crate) version: u32,
    /// `[scope, thread_id, agent_id, call_id]`.
    pub(crate) key: [String; 4],
    /// The spec kind.
    pub(crate) kind: String,
    /// The normalised storage base.
    pub(crate) work_dir: String,
    /// The image (template) the spec named.
    pub(crate) image: Option<String>,
    /// The pinned image id the spec named.
    pub(crate) image_id: Option<String>,
    /// The generation directory's bare name, `ws-<12 hex>`.
    pub(crate) workspace: String,
    /// Where sbx mounts the workspace in the guest (`pwd -P` at create).
    #[serde(default)]
    pub(crate) guest_mount: Option<String>,
    /// `null` for closed egress.
    #[serde(default)]
    pub(crate) egress_allow: Option<serde_json::Value>,
    /// `null` for closed egress.
    #[serde(default)]
    pub(crate) egress_plan: Option<serde_json::Value>,
    /// The sandbox's id; present only once the create finished, so it is written last.
    #[serde(default)]
    pub(crate) instance_id: Option<String>,
    /// Set when a kill did not land: the next acquire in any process replaces the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) retired: Option<bool>,
    /// Why it was retired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) retired_reason: Option<String>,
}

impl Record {
    /// Whether the record says this instance is retired.
    pub(crate) fn retires(&self, instance_id: &str) -> bool {
        self.retired == Some(true) && self.instance_id.as_deref() == Some(instance_id)
    }
}

/// `<root>/<name>`.
pub(crate) fn name_dir(root: &Path, name: &str) -> PathBuf {
    root.join(name)
}

/// Whether `name` is a bare generation name: `ws-` and 12 lowercase hex digits.
pub(crate) fn is_generation_name(name: &str) -> bool {
    name.strip_prefix(GENERATION_PREFIX).is_some_and(|hex| {
        hex.len() == 12
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A builder for directories only the user can enter: mode 0700 on POSIX. Windows has no mode
/// bits; a directory there inherits the ACL of its parent, which for the default root under
/// `%LOCALAPPDATA%` is the user profile's (the user, SYSTEM and Administrators only).
fn private_dir_builder() -> fs::DirBuilder {
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt as _;
        let mut builder = fs::DirBuilder::new();
        builder.mode(0o700);
        builder
    }
    #[cfg(not(unix))]
    fs::DirBuilder::new()
}

/// Creates the root with its parents and makes it private: 0700 on POSIX; on Windows it keeps
/// the ACL inherited from its parent (the user profile's, under the default `%LOCALAPPDATA%`).
pub(crate) fn ensure_root(root: &Path) -> io::Result<()> {
    fs::create_dir_all(root)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(root, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Makes `<root>/<name>/ws-<12 hex>` (both private) and returns the generation's bare name.
pub(crate) fn new_generation(root: &Path, name: &str) -> io::Result<String> {
    ensure_root(root)?;
    let dir = name_dir(root, name);
    match private_dir_builder().create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = fs::symlink_metadata(&dir)?;
            if !meta.is_dir() {
                return Err(io::Error::other(format!(
                    "{} exists and is not a directory",
                    dir.display()
                )));
            }
        }
        Err(e) => return Err(e),
    }
    loop {
        let generation = format!("{GENERATION_PREFIX}{}", random_hex(12)?);
        match private_dir_builder().create(dir.join(&generation)) {
            Ok(()) => return Ok(generation),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Removes a generation this call made (recursively, never following links), the record when
/// it names that generation (a draft of this call) unless `keep_record`, and the name directory
/// when nothing else is left in it.
pub(crate) fn drop_generation(
    root: &Path,
    name: &str,
    generation: &str,
    keep_record: bool,
) -> io::Result<()> {
    let dir = name_dir(root, name);
    remove_entry(&dir, generation)?;
    if keep_record {
        return remove_dir_if_empty(&dir);
    }
    if let Ok(Some(record)) = read_record(&dir) {
        if record.workspace == generation && record.instance_id.is_none() {
            remove_record(&dir)?;
        }
    }
    remove_dir_if_empty(&dir)
}

/// Removes `<dir>` if it is empty; a non-empty or missing directory is left as it is.
pub(crate) fn remove_dir_if_empty(dir: &Path) -> io::Result<()> {
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        // Not empty: another generation or a newer record lives there.
        Err(_) if dir.exists() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes the record atomically: `.meta.json.<16 hex>.part`, fsync, rename over `meta.json`,
/// then fsync the directory so the rename itself survives a crash.
pub(crate) fn write_record(dir: &Path, record: &Record) -> io::Result<()> {
    place_record(dir, record, Placing::Replace).map(drop)
}

/// Writes the record only when there is none (a hard link, which never replaces): `Ok(false)`
/// when another record was already there, which is then left as it is.
pub(crate) fn claim_record(dir: &Path, record: &Record) -> io::Result<bool> {
    place_record(dir, record, Placing::IfAbsent)
}

fn place_record(dir: &Path, record: &Record, placing: Placing) -> io::Result<bool> {
    let bytes = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    host_state::place_record(dir, RECORD, &bytes, placing)
}

/// Removes the record (missing is fine).
pub(crate) fn remove_record(dir: &Path) -> io::Result<()> {
    match fs::remove_file(dir.join(RECORD)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Reads `<dir>/meta.json`: `Ok(None)` when there is none; a record that does not parse is
/// `InvalidData`.
pub(crate) fn read_record(dir: &Path) -> io::Result<Option<Record>> {
    read_record_file(&dir.join(RECORD))
}

fn read_record_file(path: &Path) -> io::Result<Option<Record>> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The modification time of the record, when there is one.
pub(crate) fn record_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    fs::metadata(dir.join(RECORD))
        .and_then(|m| m.modified())
        .ok()
}

/// Every entry name directly in `dir` (empty when it does not exist).
pub(crate) fn entry_names(dir: &Path) -> io::Result<Vec<String>> {
    let reading = match fs::read_dir(dir) {
        Ok(reading) => reading,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in reading {
        if let Ok(name) = entry?.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// The names of the directories under the root that start with `prefix`, sorted.
pub(crate) fn names_under_root(root: &Path, prefix: &str) -> io::Result<Vec<String>> {
    Ok(entry_names(root)?
        .into_iter()
        .filter(|name| name.starts_with(prefix))
        .collect())
}

/// Deletes `<dir>/<name>`: a real directory recursively without following links, anything else
/// unlinked. Missing is fine. `""`, `.`, `..` and names holding a separator are never touched.
fn remove_entry(dir: &Path, name: &str) -> io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\']) {
        return Ok(());
    }
    let path = dir.join(name);
    let meta = match fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let removed = if meta.is_dir() {
        // `remove_dir_all` does not follow links inside the tree (std guarantees this on every
        // platform it supports), and the top was checked to be a real directory just above.
        fs::remove_dir_all(&path)
    } else {
        fs::remove_file(&path)
    };
    match removed {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The set of host entries a removal may delete afterwards, fixed **before** the removal: the
/// known generation, else (for a removal by name only) everything now in the directory, else
/// nothing. Entries made after this by a new create are never in it.
pub(crate) fn held_entries(
    dir: &Path,
    generation: Option<&str>,
    name_only: bool,
) -> io::Result<Vec<String>> {
    match generation {
        Some(generation) => Ok(vec![generation.to_owned()]),
        None if name_only => entry_names(dir),
        None => Ok(Vec::new()),
    }
}

/// Clears what a removed sandbox left: every held entry but the record; then the record is
/// detached (renamed aside) and read: when it names a workspace outside the held set it belongs
/// to a replacement, so it is put back with a hard link (a newer record already there wins).
/// Finally the name directory goes if it is empty.
pub(crate) fn clear(dir: &Path, held: &[String]) -> io::Result<()> {
    for name in held {
        if name != RECORD {
            remove_entry(dir, name)?;
        }
    }
    let detached = dir.join(format!(".{RECORD}.{}.drop", random_hex(16)?));
    match fs::rename(dir.join(RECORD), &detached) {
        Ok(()) => {
            let record = read_record_file(&detached);
            let belongs_elsewhere = match &record {
                Ok(Some(record)) => !held.contains(&record.workspace),
                // An unreadable record names nothing held: keep it rather than lose it.
                Ok(None) | Err(_) => held.is_empty(),
            };
            if belongs_elsewhere {
                match fs::hard_link(&detached, dir.join(RECORD)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
            }
            fs::remove_file(&detached)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    remove_dir_if_empty(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(workspace: &str, instance: Option<&str>) -> Record {
        Record {
            version: RECORD_VERSION,
            key: ["s".into(), "t".into(), "a".into(), "".into()],
            kind: "python".into(),
            work_dir: "/maf-sandbox/work".into(),
            image: None,
            image_id: None,
            workspace: workspace.into(),
            guest_mount: Some("/w".into()),
            egress_allow: None,
            egress_plan: None,
            instance_id: instance.map(str::to_owned),
            retired: None,
            retired_reason: None,
        }
    }

    #[test]
    fn the_record_shape_is_stable() {
        let mut r = record("ws-0123456789ab", Some("abc"));
        insta::assert_snapshot!(serde_json::to_string_pretty(&r).unwrap());
        r.retired = Some(true);
        r.retired_reason = Some("why".into());
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.ends_with(r#""instance_id":"abc","retired":true,"retired_reason":"why"}"#));
        assert!(r.retires("abc") && !r.retires("other"));
        // Unknown fields from other writers are ignored; missing optional ones read as None.
        let read: Record = serde_json::from_str(
            r#"{"version":1,"key":["s","t","a",""],"kind":"k","work_dir":"/w","image":null,
               "image_id":null,"workspace":"ws-0123456789ab","extra":5}"#,
        )
        .unwrap();
        assert_eq!(read.instance_id, None);
    }

    #[test]
    fn generation_names() {
        assert!(is_generation_name("ws-0123456789ab"));
        for bad in [
            "ws-0123456789a",
            "ws-0123456789abc",
            "ws-0123456789AB",
            "x-0123456789ab",
            "ws-../../etc",
        ] {
            assert!(!is_generation_name(bad), "{bad}");
        }
    }

    #[test]
    fn generations_records_and_clearing() {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path().join("root");
        let generation = new_generation(&root, "n1").unwrap();
        assert!(is_generation_name(&generation));
        let dir = name_dir(&root, "n1");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            for path in [&root, &dir, &dir.join(&generation)] {
                let mode = fs::metadata(path).unwrap().permissions().mode() & 0o777;
                assert_eq!(mode, 0o700, "{}", path.display());
            }
        }
        assert_eq!(read_record(&dir).unwrap(), None);
        assert!(claim_record(&dir, &record(&generation, None)).unwrap());
        // A second claim never replaces the first.
        assert!(!claim_record(&dir, &record("ws-aaaaaaaaaaaa", None)).unwrap());
        assert_eq!(read_record(&dir).unwrap().unwrap().workspace, generation);
        write_record(&dir, &record(&generation, Some("id1"))).unwrap();
        assert_eq!(
            read_record(&dir).unwrap().unwrap().instance_id.as_deref(),
            Some("id1")
        );
        assert_eq!(
            entry_names(&dir).unwrap(),
            vec![RECORD.to_owned(), generation.clone()]
        );

        // A replacement's generation and record appear after the held set was fixed.
        let held = held_entries(&dir, Some(&generation), false).unwrap();
        let newer = new_generation(&root, "n1").unwrap();
        write_record(&dir, &record(&newer, Some("id2"))).unwrap();
        clear(&dir, &held).unwrap();
        assert_eq!(
            entry_names(&dir).unwrap(),
            vec![RECORD.to_owned(), newer.clone()]
        );
        assert_eq!(
            read_record(&dir).unwrap().unwrap().instance_id.as_deref(),
            Some("id2")
        );

        // A name-only removal holds everything present; the directory goes.
        let held = held_entries(&dir, None, true).unwrap();
        clear(&dir, &held).unwrap();
        assert!(!dir.exists());
        assert_eq!(names_under_root(&root, "n").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn clearing_never_follows_a_link() {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path().join("root");
        let outside = temp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep"), b"x").unwrap();
        let generation = new_generation(&root, "n").unwrap();
        let dir = name_dir(&root, "n");
        #[cfg(unix)]
        std::os::unix::fs::symlink(&outside, dir.join(&generation).join("link")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(&outside, dir.join("ws-aaaaaaaaaaaa")).unwrap();
        let held = held_entries(&dir, None, true).unwrap();
        clear(&dir, &held).unwrap();
        assert!(outside.join("keep").exists());
        assert!(!dir.exists());
        // Names that could climb are skipped.
        remove_entry(temp.path(), "..").unwrap();
        remove_entry(temp.path(), "a/b").unwrap();
        assert!(outside.exists());
    }

    #[test]
    fn drop_generation_keeps_a_directory_with_other_content() {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path();
        let first = new_generation(root, "n").unwrap();
        let second = new_generation(root, "n").unwrap();
        assert!(claim_record(&name_dir(root, "n"), &record(&second, None)).unwrap());
        drop_generation(root, "n", &second, false).unwrap();
        assert_eq!(
            entry_names(&name_dir(root, "n")).unwrap(),
            vec![first.clone()]
        );
        drop_generation(root, "n", &first, false).unwrap();
        assert!(!name_dir(root, "n").exists());
    }
}
