//! An engine-side fingerprint of a sandbox (docs/conformance.md#confinement): the paths that differ
//! from its image and the programs running in it, seen by something the guest cannot answer for.
//!
//! [`Fingerprint`] is what the CONFINEMENT suite compares; a backend's live test supplies it through
//! [`HardeningHooks::fingerprint`](crate::isolation::HardeningHooks::fingerprint). For a sandbox that is one
//! container of a Docker engine (the Docker backend, and `sbx-sim`, which backs each sandbox with one),
//! [`docker_container_fingerprint`] builds it from three engine calls the caller runs: the engine's
//! change list (`docker container diff`), its process table (`docker container top`), and a trusted
//! observer container joined to the sandbox's PID namespace (no network, read-only, every capability
//! dropped but `SYS_PTRACE`) that hashes, through `/proc/1/root`, every changed path and the whole of
//! every other writable mount (tmpfs such as `/dev/shm`, bind mounts), which the change list cannot see.
//! The crate runs no process itself: the caller passes the `docker` runner.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;

use crate::error::ConformanceError;

/// What an engine-side view of a sandbox saw.
///
/// Compare two with [`Fingerprint::differences`]. A view with any [`unseen`](Self::unseen) entry is
/// incomplete and the CONFINEMENT suite rejects it: a path it could not read may hide anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fingerprint {
    /// Every path whose state differs from the sandbox's image (on the root file system) or that lies
    /// on another writable mount, with its state: kind, mode, owner, and the content digest of a
    /// regular file or the target of a link; `deleted` for a path removed from the image.
    pub changed_paths: BTreeMap<String, String>,
    /// Every running program (`user command line`) and how many processes run it.
    pub running_programs: BTreeMap<String, usize>,
    /// What the view could not see (an unreadable path, an answer it could not parse). Non-empty makes
    /// the fingerprint incomplete.
    pub unseen: Vec<String>,
}

impl Fingerprint {
    /// Whether the view saw everything.
    pub fn is_complete(&self) -> bool {
        self.unseen.is_empty()
    }

    /// Every way `after` differs from `self`, one line each (empty when they are equal): paths added,
    /// removed or changed, and programs started or ended.
    pub fn differences(&self, after: &Fingerprint) -> Vec<String> {
        let mut lines = Vec::new();
        for (path, state) in &after.changed_paths {
            match self.changed_paths.get(path) {
                None => lines.push(format!("new path {path} ({state})")),
                Some(before) if before != state => {
                    lines.push(format!("changed path {path} ({before} -> {state})"))
                }
                Some(_) => {}
            }
        }
        for (path, state) in &self.changed_paths {
            if !after.changed_paths.contains_key(path) {
                lines.push(format!(
                    "path back to the image's state {path} (was {state})"
                ));
            }
        }
        let programs = self
            .running_programs
            .keys()
            .chain(after.running_programs.keys());
        let mut seen = std::collections::BTreeSet::new();
        for program in programs {
            if !seen.insert(program) {
                continue;
            }
            let before = self.running_programs.get(program).copied().unwrap_or(0);
            let now = after.running_programs.get(program).copied().unwrap_or(0);
            if before != now {
                lines.push(format!("{now} processes run {program:?}, {before} before"));
            }
        }
        lines
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} changed paths, {} programs",
            self.changed_paths.len(),
            self.running_programs.values().sum::<usize>()
        )?;
        if !self.unseen.is_empty() {
            write!(f, ", incomplete: {}", self.unseen.join("; "))?;
        }
        Ok(())
    }
}

/// One answer of the `docker` CLI, as the caller of [`docker_container_fingerprint`] ran it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DockerAnswer {
    /// Whether it exited 0.
    pub succeeded: bool,
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error.
    pub stderr: Vec<u8>,
}

/// The observer's script: `sh -c OBSERVER_SCRIPT observe <A|C><changed path>...`, in a container of
/// the sandbox's own image joined to the sandbox's PID namespace, so `/proc/1/root` is the sandbox's
/// root with all its mounts and the observer's own root is the image as built.
///
/// It prints NUL-separated records: `m`, then kind, mode, uid, gid, size, link target and path (GNU
/// `find -printf`) for each changed path and for everything on each other writable mount (`-xdev`);
/// `h`, then `<sha256>  <path>` for each regular file among them; `i`, then an `m` record from its
/// own root for each path the engine calls changed (`C`) that the image has; then `end`. Pseudo file
/// systems (`proc`, `sysfs`, `devpts`, `mqueue`, `cgroup`) and read-only mounts are not walked: the
/// guest cannot write them. Any error reaches stderr and a non-zero exit, which the parser turns
/// into an incomplete view.
const OBSERVER_SCRIPT: &str = r#"r=/proc/1/root
[ -d "$r/" ] && [ -r /proc/1/mountinfo ] || { echo "the observer cannot see the sandbox's root" >&2; exit 3; }
m=$(while read -r _ _ _ _ p o x; do
  f=${x#*- }; f=${f%% *}
  case $o in rw|rw,*) ;; *) continue ;; esac
  case $f in proc|sysfs|devpts|mqueue|cgroup|cgroup2) continue ;; esac
  [ "$p" = / ] || printf '%s\n' "$p"
done </proc/1/mountinfo) || exit 3
k=
for p do
  shift
  set -- "$@" "$r${p#?}"
  case $p in C*) k="$k${p#?}
" ;; esac
done
s=0
IFS='
'
fmt='m\0%y\0%m\0%U\0%G\0%s\0%l\0%p\0'
if [ $# -gt 0 ]; then find "$@" -maxdepth 0 -printf "$fmt" || s=1; fi
for d in $m; do find "$r$d" -xdev -printf "$fmt" || s=1; done
printf 'h\0'
if [ $# -gt 0 ]; then find "$@" -maxdepth 0 -type f -exec sha256sum -z -- {} + || s=1; fi
for d in $m; do find "$r$d" -xdev -type f -exec sha256sum -z -- {} + || s=1; done
printf 'i\0'
for p in $k; do
  if [ -e "$p" ] || [ -L "$p" ]; then find "$p" -maxdepth 0 -printf "$fmt" || s=1; fi
done
printf 'end\0'
exit $s"#;

/// Where the observer sees the sandbox's root.
const OBSERVED_ROOT: &str = "/proc/1/root";

/// The fingerprint of a sandbox that is the Docker container `container`, from the engine: its change
/// list and process table, and an observer container of the sandbox's own image (which the guest
/// cannot change; it needs `sh`, GNU `find` and `sha256sum`) joined to its PID namespace. A directory
/// the engine calls changed whose kind, mode and owner are still the image's is no change of its own
/// (removing what a call created under it leaves it so).
///
/// `docker(args)` runs the `docker` CLI with `args` against the sandbox's engine, bounded, and returns
/// its answer; an `Err` from it is returned as is. A call that fails, or an answer that does not parse,
/// makes the fingerprint incomplete ([`Fingerprint::unseen`]), never partial.
///
/// # Errors
///
/// Only what `docker` itself returns.
///
/// # Cancel safety
///
/// Dropping the future drops the `docker` call in flight; the observer runs with `--rm`.
pub async fn docker_container_fingerprint<F, Fut>(
    container: &str,
    mut docker: F,
) -> Result<Fingerprint, ConformanceError>
where
    F: FnMut(Vec<String>) -> Fut,
    Fut: Future<Output = Result<DockerAnswer, ConformanceError>>,
{
    let mut fingerprint = Fingerprint::default();
    let inspect = docker(strings(&[
        "container",
        "inspect",
        "--format",
        "{{.Image}}",
        container,
    ]))
    .await?;
    let image = lossy(&inspect.stdout);
    if !inspect.succeeded || !image.starts_with("sha256:") {
        fingerprint.unseen.push(format!(
            "the engine names no image for {container}: {}",
            lossy(&inspect.stderr)
        ));
        return Ok(fingerprint);
    }
    let diff = docker(strings(&["container", "diff", container])).await?;
    let changes = if diff.succeeded {
        parse_engine_changes(&diff.stdout).unwrap_or_else(|why| {
            fingerprint.unseen.push(why);
            Vec::new()
        })
    } else {
        fingerprint.unseen.push(format!(
            "the engine's change list failed: {}",
            lossy(&diff.stderr)
        ));
        Vec::new()
    };
    let top = docker(strings(&[
        "container",
        "top",
        container,
        "-o",
        "pid,user,args",
    ]))
    .await?;
    if top.succeeded {
        match parse_engine_processes(&top.stdout) {
            Ok(programs) => fingerprint.running_programs = programs,
            Err(why) => fingerprint.unseen.push(why),
        }
    } else {
        fingerprint.unseen.push(format!(
            "the engine's process table failed: {}",
            lossy(&top.stderr)
        ));
    }
    let mut present = Vec::new();
    for (kind, path) in &changes {
        if *kind == 'D' {
            fingerprint
                .changed_paths
                .insert(path.clone(), "deleted".to_owned());
        } else {
            present.push(format!("{kind}{path}"));
        }
    }
    let mut args = strings(&[
        "run",
        "--rm",
        "--pull=never",
        "--network",
        "none",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--cap-add",
        "SYS_PTRACE",
        "--security-opt",
        "no-new-privileges",
        "--user",
        "0:0",
        "--pid",
    ]);
    args.push(format!("container:{container}"));
    args.extend(strings(&["--entrypoint", "sh", &image, "-c"]));
    args.push(OBSERVER_SCRIPT.to_owned());
    args.push("observe".to_owned());
    args.extend(present);
    let observed = docker(args).await?;
    read_observer(&observed, &changes, &mut fingerprint);
    Ok(fingerprint)
}

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_owned()
}

/// Parses the engine's change list: one `<A|C|D> <absolute path>` per line.
fn parse_engine_changes(stdout: &[u8]) -> Result<Vec<(char, String)>, String> {
    let text = std::str::from_utf8(stdout)
        .map_err(|_| "the engine's change list is not UTF-8".to_owned())?;
    let mut changes = Vec::new();
    for line in text.lines() {
        let mut chars = line.chars();
        let kind = chars.next();
        let rest = chars.as_str();
        match (kind, rest.strip_prefix(' ')) {
            (Some(kind @ ('A' | 'C' | 'D')), Some(path)) if path.starts_with('/') => {
                changes.push((kind, path.to_owned()))
            }
            _ => return Err(format!("the engine's change list has the line {line:?}")),
        }
    }
    Ok(changes)
}

/// Parses the engine's process table of `-o pid,user,args`: a header naming those columns, then one
/// row per process. Returns `user args` with how many processes run it.
fn parse_engine_processes(stdout: &[u8]) -> Result<BTreeMap<String, usize>, String> {
    let text = std::str::from_utf8(stdout)
        .map_err(|_| "the engine's process table is not UTF-8".to_owned())?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    if header != ["PID", "USER", "COMMAND"] {
        return Err(format!(
            "the engine's process table has the header {header:?}"
        ));
    }
    let mut programs = BTreeMap::new();
    for line in lines {
        let mut words = line.split_whitespace();
        let (Some(pid), Some(user)) = (words.next(), words.next()) else {
            return Err(format!("the engine's process table has the row {line:?}"));
        };
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("the engine's process table has the row {line:?}"));
        }
        let args: Vec<&str> = words.collect();
        *programs
            .entry(format!("{user} {}", args.join(" ")))
            .or_insert(0) += 1;
    }
    if programs.is_empty() {
        return Err("the engine's process table lists no process at all".to_owned());
    }
    Ok(programs)
}

/// One `m` record: the path as printed and its state.
fn read_record<'a>(
    fields: &mut impl Iterator<Item = &'a [u8]>,
) -> Option<(&'a [u8], String, bool)> {
    let record: Vec<&[u8]> = fields.take(7).collect();
    let [kind, mode, uid, gid, size, target, path] = record.as_slice() else {
        return None;
    };
    let kind = lossy(kind);
    let mut state = format!("{kind} {} {}:{}", lossy(mode), lossy(uid), lossy(gid));
    match kind.as_str() {
        "f" => state.push_str(&format!(" {} bytes", lossy(size))),
        "l" => state.push_str(&format!(" -> {}", String::from_utf8_lossy(target))),
        _ => {}
    }
    Some((path, state, kind == "f"))
}

/// Where the observer's answer is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Sandbox,
    Digests,
    Image,
}

/// Folds the observer's answer into `fingerprint`: every changed path the engine listed must be
/// described, every regular file must have a digest, and the answer must be whole. A changed
/// directory in the image's own state is dropped.
fn read_observer(answer: &DockerAnswer, changes: &[(char, String)], fingerprint: &mut Fingerprint) {
    let unseen = &mut fingerprint.unseen;
    if !answer.succeeded {
        unseen.push(format!("the observer failed: {}", lossy(&answer.stderr)));
    }
    for line in lossy(&answer.stderr).lines().filter(|l| !l.is_empty()) {
        unseen.push(format!("the observer could not see: {line}"));
    }
    let mut fields = answer.stdout.split(|b| *b == 0);
    let mut entries: BTreeMap<String, (String, bool)> = BTreeMap::new();
    let mut digests: BTreeMap<String, String> = BTreeMap::new();
    let mut image: BTreeMap<String, String> = BTreeMap::new();
    let mut ended = false;
    let mut phase = Phase::Sandbox;
    while let Some(field) = fields.next() {
        match (phase, field) {
            (_, b"end") => {
                ended = true;
                break;
            }
            (Phase::Sandbox, b"h") => phase = Phase::Digests,
            (Phase::Digests, b"i") => phase = Phase::Image,
            (Phase::Sandbox | Phase::Image, b"m") => {
                let Some((printed, state, regular)) = read_record(&mut fields) else {
                    unseen.push("the observer's answer ends inside a record".to_owned());
                    return;
                };
                if phase == Phase::Image {
                    match std::str::from_utf8(printed) {
                        Ok(path) if path.starts_with('/') => {
                            image.insert(path.to_owned(), state);
                        }
                        _ => unseen.push(format!("the image's record names {:?}", lossy(printed))),
                    }
                    continue;
                }
                match observed_path(printed) {
                    Some(path) => {
                        entries.insert(path, (state, regular));
                    }
                    None => unseen.push(format!("the observer named {:?}", lossy(printed))),
                }
            }
            (Phase::Digests, record) => {
                let text = String::from_utf8_lossy(record);
                match text.split_once("  ") {
                    Some((digest, path))
                        if digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()) =>
                    {
                        match observed_path(path.as_bytes()) {
                            Some(path) => {
                                digests.insert(path, digest.to_owned());
                            }
                            None => unseen.push(format!("the observer hashed {path:?}")),
                        }
                    }
                    _ => unseen.push(format!("the observer printed the digest record {text:?}")),
                }
            }
            (_, other) => {
                unseen.push(format!("the observer printed {:?}", lossy(other)));
                return;
            }
        }
    }
    if !ended {
        unseen.push("the observer's answer is cut short".to_owned());
    }
    for (_, path) in changes.iter().filter(|(kind, _)| *kind != 'D') {
        if !entries.contains_key(path) {
            unseen.push(format!(
                "the observer did not describe the changed path {path}"
            ));
        }
    }
    for (path, (mut state, regular)) in entries {
        if regular {
            match digests.remove(&path) {
                Some(digest) => state.push_str(&format!(" sha256:{digest}")),
                None => unseen.push(format!("the observer could not hash {path}")),
            }
        }
        let kind = changes.iter().find(|(_, p)| *p == path).map(|(k, _)| *k);
        if kind == Some('C') && state.starts_with("d ") && image.get(&path) == Some(&state) {
            continue;
        }
        if let Some(kind) = kind {
            state = format!("{kind} {state}");
        }
        fingerprint.changed_paths.insert(path, state);
    }
    for path in digests.keys() {
        unseen.push(format!(
            "the observer hashed {path}, which it did not describe"
        ));
    }
}

/// A path the observer printed, relative to the sandbox's root; `None` unless it lies there.
fn observed_path(printed: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(printed).ok()?;
    let rest = text.strip_prefix(OBSERVED_ROOT)?;
    if rest.is_empty() {
        return Some("/".to_owned());
    }
    rest.starts_with('/').then(|| rest.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: &str, mode: &str, size: &str, target: &str, path: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for field in ["m", kind, mode, "1000", "1000", size, target, path] {
            out.extend_from_slice(field.as_bytes());
            out.push(0);
        }
        out
    }

    fn digest(hex: char, path: &str) -> Vec<u8> {
        let mut out = format!("{}  {path}", hex.to_string().repeat(64)).into_bytes();
        out.push(0);
        out
    }

    fn answer(parts: &[Vec<u8>]) -> DockerAnswer {
        DockerAnswer {
            succeeded: true,
            stdout: parts.concat(),
            stderr: Vec::new(),
        }
    }

    fn observe(answer: &DockerAnswer, changes: &[(char, String)]) -> Fingerprint {
        let mut fingerprint = Fingerprint::default();
        read_observer(answer, changes, &mut fingerprint);
        fingerprint
    }

    #[test]
    fn the_change_list_parses_and_refuses_anything_else() {
        let changes =
            parse_engine_changes(b"C /usr\nA /usr/sbin/docker-init\nD /etc/motd\n").unwrap();
        assert_eq!(
            changes,
            [
                ('C', "/usr".to_owned()),
                ('A', "/usr/sbin/docker-init".to_owned()),
                ('D', "/etc/motd".to_owned())
            ]
        );
        for bad in [
            &b"X /usr\n"[..],
            b"A usr\n",
            b"A\n",
            b"/usr\n",
            b"\xff /x\n",
        ] {
            assert!(parse_engine_changes(bad).is_err(), "{bad:?}");
        }
        // A path holding a newline splits into a line the parser refuses: never a silent loss.
        assert!(parse_engine_changes(b"A /tmp/a\nb\n").is_err());
    }

    #[test]
    fn the_process_table_counts_programs_and_refuses_another_shape() {
        let table = b"PID   USER   COMMAND\n10  agent  sleep 600\n11  agent  sleep   600\n12 root /sbin/docker-init -- sh\n";
        let programs = parse_engine_processes(table).unwrap();
        assert_eq!(programs.get("agent sleep 600"), Some(&2));
        assert_eq!(programs.get("root /sbin/docker-init -- sh"), Some(&1));
        assert!(parse_engine_processes(b"UID PID CMD\n1 2 x\n").is_err());
        assert!(parse_engine_processes(b"PID USER COMMAND\nx agent sleep\n").is_err());
        assert!(parse_engine_processes(b"PID USER COMMAND\n").is_err());
    }

    #[test]
    fn the_observer_describes_and_hashes_every_path() {
        let changes = vec![('A', "/tmp/x".to_owned()), ('D', "/etc/motd".to_owned())];
        let seen = observe(
            &answer(&[
                record("f", "644", "2", "", "/proc/1/root/tmp/x"),
                record("d", "1777", "60", "", "/proc/1/root/dev/shm"),
                record("l", "777", "3", "/etc", "/proc/1/root/dev/shm/l"),
                b"h\0".to_vec(),
                digest('a', "/proc/1/root/tmp/x"),
                b"end\0".to_vec(),
            ]),
            &changes,
        );
        assert!(seen.is_complete(), "{seen}");
        assert_eq!(
            seen.changed_paths["/tmp/x"],
            format!("A f 644 1000:1000 2 bytes sha256:{}", "a".repeat(64))
        );
        assert_eq!(seen.changed_paths["/dev/shm"], "d 1777 1000:1000");
        assert_eq!(seen.changed_paths["/dev/shm/l"], "l 777 1000:1000 -> /etc");
    }

    #[test]
    fn a_content_change_is_a_difference() {
        let changes = vec![('A', "/tmp/x".to_owned())];
        let with = |hex| {
            observe(
                &answer(&[
                    record("f", "644", "2", "", "/proc/1/root/tmp/x"),
                    b"h\0".to_vec(),
                    digest(hex, "/proc/1/root/tmp/x"),
                    b"end\0".to_vec(),
                ]),
                &changes,
            )
        };
        let (before, after) = (with('a'), with('b'));
        assert_eq!(before.differences(&before), Vec::<String>::new());
        assert_eq!(before.differences(&after).len(), 1);
    }

    #[test]
    fn an_incomplete_answer_is_never_a_view() {
        let changes = vec![('A', "/tmp/x".to_owned())];
        let whole = [
            record("f", "644", "2", "", "/proc/1/root/tmp/x"),
            b"h\0".to_vec(),
            digest('a', "/proc/1/root/tmp/x"),
            b"end\0".to_vec(),
        ];
        // Cut short: no end marker, no digest, no description of a changed path.
        assert!(!observe(&answer(&whole[..3]), &changes).is_complete());
        assert!(!observe(
            &answer(&[whole[0].clone(), whole[1].clone(), whole[3].clone()]),
            &changes
        )
        .is_complete());
        assert!(!observe(&answer(&whole[1..]), &changes).is_complete());
        // An unreadable path: stderr and a failed exit.
        let mut denied = answer(&whole);
        denied.succeeded = false;
        denied.stderr = b"find: '/proc/1/root/home/agent': Permission denied\n".to_vec();
        assert!(!observe(&denied, &changes).is_complete());
        // A record cut inside, and a path outside the observed root.
        let mut cut = record("f", "644", "2", "", "/proc/1/root/tmp/x");
        cut.truncate(cut.len() - 20);
        assert!(!observe(&answer(&[cut]), &changes).is_complete());
        assert!(!observe(
            &answer(&[record("f", "644", "2", "", "/tmp/x"), b"h\0end\0".to_vec()]),
            &[]
        )
        .is_complete());
        // Every cut of a whole answer is incomplete.
        let bytes = whole.concat();
        for cut in 0..bytes.len() - 1 {
            let seen = observe(&answer(&[bytes[..cut].to_vec()]), &changes);
            assert!(!seen.is_complete(), "a cut at {cut} read as complete");
        }
    }

    fn image_record(kind: &str, mode: &str, path: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for field in ["m", kind, mode, "0", "0", "4096", "", path] {
            out.extend_from_slice(field.as_bytes());
            out.push(0);
        }
        out
    }

    #[test]
    fn a_changed_directory_in_the_image_state_is_no_change() {
        let mut dir = record("d", "1777", "60", "", "/proc/1/root/tmp");
        // The sandbox's /tmp is root's, like the image's.
        dir = String::from_utf8(dir)
            .unwrap()
            .replace("1000", "0")
            .into_bytes();
        let changes = vec![('C', "/tmp".to_owned())];
        let with_image = |mode: &str| {
            observe(
                &answer(&[
                    dir.clone(),
                    b"h\0i\0".to_vec(),
                    image_record("d", mode, "/tmp"),
                    b"end\0".to_vec(),
                ]),
                &changes,
            )
        };
        let same = with_image("1777");
        assert!(same.is_complete(), "{same}");
        assert!(same.changed_paths.is_empty(), "{:?}", same.changed_paths);
        // A mode the image does not have is a change.
        let chmodded = with_image("755");
        assert_eq!(chmodded.changed_paths["/tmp"], "C d 1777 0:0");
        // An image record outside the root, or an `i` before the digests, is not a view.
        let odd = observe(
            &answer(&[
                dir.clone(),
                b"h\0i\0".to_vec(),
                image_record("d", "1777", "tmp"),
                b"end\0".to_vec(),
            ]),
            &changes,
        );
        assert!(!odd.is_complete());
        let early = observe(&answer(&[dir, b"i\0h\0end\0".to_vec()]), &changes);
        assert!(!early.is_complete());
    }

    #[test]
    fn differences_name_paths_and_programs() {
        let mut before = Fingerprint::default();
        before.changed_paths.insert("/a".into(), "f".into());
        before.changed_paths.insert("/b".into(), "f".into());
        before.running_programs.insert("agent sleep".into(), 1);
        let mut after = before.clone();
        after.changed_paths.remove("/b");
        after.changed_paths.insert("/c".into(), "f".into());
        after.changed_paths.insert("/a".into(), "g".into());
        after.running_programs.insert("agent sleep".into(), 2);
        after.running_programs.insert("agent sh".into(), 1);
        let lines = before.differences(&after);
        assert_eq!(lines.len(), 5, "{lines:?}");
        assert_eq!(after.differences(&after), Vec::<String>::new());
    }
}
