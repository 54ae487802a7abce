//! The CONFINEMENT fingerprint of a VM (docs/conformance.md#confinement), taken over an agent
//! connection of the test's own, never through the guest's utilities:
//!
//! - the mounts, the boot time and the process table are read by the agent itself (its `Read` and
//!   `List` requests, the project's code from the initramfs, not the guest's root);
//! - the file systems the guest can write (every read-write mount but the kernel's pseudo file
//!   systems; of the cgroup tree, its directories) are walked by the host's static BusyBox,
//!   written fresh into the guest's `/tmp` under a random name for each view, run through the
//!   agent with an empty `PATH` (every tool named as an applet of that binary), and removed;
//!   every path's kind, mode, owner and size is read (not a directory's size or times, which a
//!   created and removed entry changes), a link's target, and its ctime, which no call can set
//!   back. A path changed since the guest booted (ctime at or after the boot) is recorded, a
//!   regular file with its content digest, unless it is a directory whose state is still the
//!   image's; a path of the image seen at the VM's first view and gone since is `deleted`. So
//!   the changed paths are the differences from the image, as the Docker view's are;
//! - on the host: the VM's directory (its entries' names) and whether its QEMU still runs.
//!
//! What it cannot see, and so does not claim: kernel state outside the file systems (sysctls,
//! `/sys`, loaded modules, the clock). A call as root that subverts the guest kernel or the agent
//! could hide from any view taken inside the guest; the qemu backend's commands run as root, so
//! this view holds against calls that leave residue, not against ones that attack the kernel.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use conformance::isolation::Fingerprint;
use conformance::ConformanceError;
use qemu_vm::{AgentClient, ExecRequest, RunLimits};

/// The suite the errors name.
const SUITE: &str = "CONFINEMENT";

/// How long one observer exec may take under TCG.
const OBSERVER_DEADLINE: Duration = Duration::from_secs(120);

/// The file systems the guest cannot keep state in (or whose state is the kernel's): not walked.
/// `cgroup2` is walked for its directories only.
const NOT_WALKED: &[&str] = &[
    "proc",
    "sysfs",
    "devpts",
    "mqueue",
    "cgroup",
    "cgroup2",
    "securityfs",
    "debugfs",
    "tracefs",
    "bpf",
    "pstore",
    "configfs",
    "fusectl",
];

/// Walks the start points given (`$4…`, each on its own device with `-xdev`) and prints one line
/// per path: device, type, mode, uid, gid, size, ctime, name, and the name with a link's target.
/// Names holding a newline are named on a line of their own (the view is then incomplete); the
/// observer's own binary (`$2`) and the exec's own cgroup are left out; cgroup directories (`$3`
/// is the cgroup mount) are listed without their files.
const WALK_SCRIPT: &str = r#"bb=$1; own=$2; cg=$3; shift 3
set -e
IFS= read -r mine </proc/self/cgroup
mine=$cg${mine#0::}
"$bb" find "$@" -xdev -path "$own" -prune -o -name '*
*' -exec "$bb" printf 'newline-in-name\n' \; -o -exec "$bb" stat -c '%d|%F|%a|%u|%g|%s|%Z|%n|%N' {} +
[ ! -d "$cg" ] || "$bb" find "$cg" -xdev -type d ! -path "$mine" -exec "$bb" stat -c 'cgroup|%F|%a|%u|%g|0|0|%n|%n' {} +
echo end"#;

/// Prints `<sha256>  <path>` for each regular file given.
const HASH_SCRIPT: &str = r#"bb=$1; shift; [ $# -eq 0 ] || exec "$bb" sha256sum -- "$@""#;

/// A static BusyBox on the host: `$BUSYBOX`, else `busybox` on `PATH`.
pub fn host_busybox() -> Result<Vec<u8>, ConformanceError> {
    let path = match std::env::var_os("BUSYBOX") {
        Some(path) => PathBuf::from(path),
        None => std::env::var_os("PATH")
            .into_iter()
            .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
            .map(|dir| dir.join("busybox"))
            .find(|candidate| candidate.is_file())
            .ok_or_else(|| harness("no busybox on PATH (install busybox-static)"))?,
    };
    let bytes = std::fs::read(&path).map_err(|e| harness(format!("{}: {e}", path.display())))?;
    if !is_static_elf(&bytes) {
        return Err(harness(format!(
            "{} is not a static executable: the observer must not load the guest's libraries",
            path.display()
        )));
    }
    Ok(bytes)
}

/// A 64-bit little-endian ELF executable with no program interpreter.
pub fn is_static_elf(bytes: &[u8]) -> bool {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return false;
    }
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(bytes[32..40].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(54), u16_at(56));
    (0..count).all(|i| {
        let at = phoff + i * size;
        // PT_INTERP is 3; a header past the end is not a static executable either.
        at + 4 <= bytes.len() && u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) != 3
    })
}

fn harness(message: impl Into<String>) -> ConformanceError {
    ConformanceError::harness(SUITE, message.into())
}

/// One mount of the guest, from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted.
    pub point: String,
    /// Its file-system type.
    pub fstype: String,
    /// Its mount options (`rw,...`).
    pub options: String,
}

/// The mounts of a `mountinfo` text; `Err` names a line that does not parse.
pub fn parse_mountinfo(text: &str) -> Result<Vec<Mount>, String> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let (head, tail) = line
                .split_once(" - ")
                .ok_or_else(|| format!("mountinfo line without a separator: {line:?}"))?;
            let head: Vec<&str> = head.split(' ').collect();
            let fstype = tail.split(' ').next().unwrap_or_default();
            match (head.get(4), head.get(5)) {
                (Some(point), Some(options)) if !fstype.is_empty() => Ok(Mount {
                    point: unescape_octal(point),
                    fstype: fstype.to_owned(),
                    options: (*options).to_owned(),
                }),
                _ => Err(format!("mountinfo line of too few fields: {line:?}")),
            }
        })
        .collect()
}

/// `mountinfo` writes space, tab, newline and backslash in paths as `\ooo`.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes.get(i + 1..i + 4);
        if bytes[i] == b'\\' {
            if let Some(digits) = digits.filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b))) {
                out.push(
                    digits
                        .iter()
                        .fold(0u8, |v, d| v.wrapping_mul(8) + (d - b'0')),
                );
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the guest can keep state on `mount` (read-write, not a kernel pseudo file system).
fn walked(mount: &Mount) -> bool {
    let writable = mount.options == "rw" || mount.options.starts_with("rw,");
    writable && !NOT_WALKED.contains(&mount.fstype.as_str())
}

/// One path as the walk printed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkedPath {
    /// Its path.
    pub path: String,
    /// Its kind (`stat`'s `%F`).
    pub kind: String,
    /// The state recorded for it: kind, mode, owner, and size or link target.
    pub state: String,
    /// Its ctime, seconds since the epoch (0 for cgroup directories).
    pub ctime: i64,
}

/// The walk's output: every path, and what did not parse (which makes the view incomplete).
pub fn parse_walk(text: &str) -> (Vec<WalkedPath>, Vec<String>) {
    let mut paths = Vec::new();
    let mut unseen = Vec::new();
    let mut ended = false;
    for line in text.lines() {
        if ended {
            unseen.push(format!("output after the walk's end: {line:?}"));
            continue;
        }
        if line == "end" {
            ended = true;
            continue;
        }
        if line == "newline-in-name" {
            unseen.push("a path whose name holds a newline".to_owned());
            continue;
        }
        match parse_walk_line(line) {
            Some(path) => paths.push(path),
            None => unseen.push(format!("a walk line that does not parse: {line:?}")),
        }
    }
    if !ended {
        unseen.push("the walk did not reach its end".to_owned());
    }
    (paths, unseen)
}

fn parse_walk_line(line: &str) -> Option<WalkedPath> {
    let mut fields = line.splitn(8, '|');
    let _device = fields.next()?;
    let kind = fields.next()?;
    let mode = fields.next()?;
    let uid = fields.next()?;
    let gid = fields.next()?;
    let size = fields.next()?;
    let ctime: i64 = fields.next()?.parse().ok()?;
    let rest = fields.next()?;
    // `%n|%N`: the name, then the name again, with ` -> 'target'` for a link (quoted).
    let (name, shown) = split_name(rest)?;
    let state = match kind {
        "directory" => format!("{kind} {mode} {uid}:{gid}"),
        "symbolic link" => {
            let target = shown
                .strip_prefix(&format!("'{name}' -> '"))
                .and_then(|t| t.strip_suffix('\''))?;
            format!("{kind} {mode} {uid}:{gid} -> {target}")
        }
        _ => format!("{kind} {mode} {uid}:{gid} {size} bytes"),
    };
    Some(WalkedPath {
        path: name.to_owned(),
        kind: kind.to_owned(),
        state,
        ctime,
    })
}

/// Splits `name|shown`, where `shown` is `name` itself or `'name' -> 'target'`.
fn split_name(rest: &str) -> Option<(&str, &str)> {
    for (at, _) in rest.match_indices('|') {
        let (name, shown) = (&rest[..at], &rest[at + 1..]);
        if shown == name || shown.starts_with(&format!("'{name}' -> '")) {
            return Some((name, shown));
        }
    }
    None
}

/// The view's inputs from the host: the VM's directory and its QEMU.
#[derive(Debug, Clone)]
pub struct HostSide {
    /// The VM's own directory.
    pub vm_dir: PathBuf,
}

/// The image's paths as a VM's first view saw them (path to state): untouched since the boot.
pub type ImageView = BTreeMap<String, String>;

/// The fingerprint of the VM `agent` talks to; see the module's documentation. `image` is the
/// VM's image view, taken by this call when it is `None`.
pub async fn fingerprint(
    agent: &AgentClient,
    busybox: &[u8],
    host: &HostSide,
    image: &mut Option<ImageView>,
) -> Result<Fingerprint, ConformanceError> {
    let mut view = Fingerprint::default();
    let read = |path: &'static str| async move {
        agent
            .read_file(path.as_bytes(), 1 << 20, Duration::from_secs(30))
            .await
            .map_err(|e| harness(format!("the agent's read of {path}: {e}")))
    };
    let mounts = parse_mountinfo(&String::from_utf8_lossy(
        &read("/proc/self/mountinfo").await?,
    ))
    .map_err(harness)?;
    let booted = boot_time(&String::from_utf8_lossy(&read("/proc/stat").await?))
        .ok_or_else(|| harness("/proc/stat names no boot time"))?;
    for mount in &mounts {
        view.changed_paths.insert(
            format!("mount {}", mount.point),
            format!("{} {}", mount.fstype, mount.options),
        );
    }
    let starts: Vec<String> = mounts
        .iter()
        .filter(|mount| walked(mount))
        .map(|mount| mount.point.clone())
        .collect();
    let cgroup = mounts
        .iter()
        .find(|mount| mount.fstype == "cgroup2")
        .map(|mount| mount.point.clone())
        .unwrap_or_else(|| "/nonexistent".to_owned());

    // BusyBox runs the applet its argv[1] names when its own name starts with `busybox`.
    let own = format!("/tmp/busybox-maf-observer-{}", random_hex());
    agent
        .write_file(own.as_bytes(), 0o700, busybox, Duration::from_secs(60))
        .await
        .map_err(|e| harness(format!("uploading the observer: {e}")))?;
    let observed = observe(agent, &own, &cgroup, &starts, booted, image, &mut view).await;
    let removed = agent
        .remove(own.as_bytes(), false, Duration::from_secs(60))
        .await;
    observed?;
    removed.map_err(|e| harness(format!("removing the observer: {e}")))?;

    processes(agent, &mut view).await?;

    // Its sockets, log and record; an agent port's lock file appears when a host process first
    // takes the port, which says nothing of the guest.
    let mut entries: Vec<String> = std::fs::read_dir(&host.vm_dir)
        .map_err(|e| harness(format!("the VM's directory {}: {e}", host.vm_dir.display())))?
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(".lock"))
        .collect();
    entries.sort();
    view.changed_paths
        .insert("host: the VM's directory".to_owned(), entries.join(" "));
    let qemu = qemu_vm::Vm::attach(&host.vm_dir)
        .map(|vm| format!("host: QEMU pid {}", vm.pid()))
        .unwrap_or_else(|e| format!("host: no QEMU ({e})"));
    view.running_programs.insert(qemu, 1);
    Ok(view)
}

/// The walk and the digests, through the uploaded observer.
async fn observe(
    agent: &AgentClient,
    own: &str,
    cgroup: &str,
    starts: &[String],
    booted: i64,
    image: &mut Option<ImageView>,
    view: &mut Fingerprint,
) -> Result<(), ConformanceError> {
    let mut args = vec![own, "sh", "-c", WALK_SCRIPT, "observe", own, own, cgroup];
    args.extend(starts.iter().map(String::as_str));
    let walk = run(agent, &args).await?;
    let (paths, unseen) = parse_walk(&walk);
    view.unseen.extend(unseen);
    let image = image.get_or_insert_with(|| image_view(&paths, booted));
    let changed = changed_paths(&paths, booted, image);
    let to_hash: Vec<&str> = paths
        .iter()
        .filter(|path| path.kind.starts_with("regular") && changed.contains_key(&path.path))
        .map(|path| path.path.as_str())
        .collect();
    let mut digests: BTreeMap<String, String> = BTreeMap::new();
    for batch in to_hash.chunks(256) {
        let mut args = vec![own, "sh", "-c", HASH_SCRIPT, "hash", own];
        args.extend(batch.iter().copied());
        let hashed = run(agent, &args).await?;
        for line in hashed.lines() {
            match line.split_once("  ") {
                Some((digest, path)) if digest.len() == 64 => {
                    digests.insert(path.to_owned(), digest.to_owned());
                }
                _ => view
                    .unseen
                    .push(format!("a digest line that does not parse: {line:?}")),
            }
        }
    }
    for (path, mut state) in changed {
        if to_hash.contains(&path.as_str()) {
            match digests.get(&path) {
                Some(digest) => {
                    state.push_str(" sha256:");
                    state.push_str(digest);
                }
                None => view.unseen.push(format!("no digest of {path}")),
            }
        }
        view.changed_paths.insert(path, state);
    }
    Ok(())
}

/// Whether a walked path was untouched since the boot (a second of slack for the clock's
/// granularity). Cgroup directories carry no time and count as changed.
fn untouched(path: &WalkedPath, booted: i64) -> bool {
    path.ctime != 0 && path.ctime < booted - 1
}

/// The image's paths in a first view: those untouched since the boot.
pub fn image_view(paths: &[WalkedPath], booted: i64) -> ImageView {
    paths
        .iter()
        .filter(|path| untouched(path, booted))
        .map(|path| (path.path.clone(), path.state.clone()))
        .collect()
}

/// The differences from the image: every path changed since the boot (a directory whose state
/// is still the image's is no change of its own), and every image path gone (`deleted`).
pub fn changed_paths(paths: &[WalkedPath], booted: i64, image: &ImageView) -> ImageView {
    let mut changed = ImageView::new();
    let mut present = std::collections::BTreeSet::new();
    for path in paths {
        present.insert(path.path.as_str());
        if untouched(path, booted)
            || (path.kind == "directory" && image.get(&path.path) == Some(&path.state))
        {
            continue;
        }
        changed.insert(path.path.clone(), path.state.clone());
    }
    for path in image.keys() {
        if !present.contains(path.as_str()) {
            changed.insert(path.clone(), "deleted".to_owned());
        }
    }
    changed
}

/// Runs the observer (argv as given, no `PATH`) and returns its stdout; anything on stderr or a
/// non-zero exit is a harness error.
async fn run(agent: &AgentClient, argv: &[&str]) -> Result<String, ConformanceError> {
    let request = ExecRequest {
        argv: argv.iter().map(|a| a.as_bytes().to_vec()).collect(),
        env: vec![(b"PATH".to_vec(), b"/nonexistent".to_vec())],
        workdir: b"/".to_vec(),
        stdin: false,
        timeout_ms: OBSERVER_DEADLINE.as_millis() as u64,
        user: None,
    };
    let limits = RunLimits {
        output_cap: 64 << 20,
        deadline: OBSERVER_DEADLINE + Duration::from_secs(10),
    };
    // The first exec of the observer just written was once refused "Text file busy" (ETXTBSY:
    // something in the guest still held it open for writing; 300 writes and runs of a program
    // in a row did not show it again): it is tried again.
    let mut tries = 0;
    let out = loop {
        match agent.run(request.clone(), None, limits).await {
            Err(qemu_vm::VmError::Agent { message, .. })
                if message.contains("Text file busy") && tries < 20 =>
            {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => break other.map_err(|e| harness(format!("the observer: {e}")))?,
        }
    };
    if out.status.code != Some(0) || !out.stderr.is_empty() {
        return Err(harness(format!(
            "the observer ended {:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every user process (`uid command line`, kernel threads left out), read by the agent.
async fn processes(agent: &AgentClient, view: &mut Fingerprint) -> Result<(), ConformanceError> {
    let entries = agent
        .list(b"/proc", Duration::from_secs(60))
        .await
        .map_err(|e| harness(format!("the agent's listing of /proc: {e}")))?;
    for entry in entries {
        let Ok(pid) = String::from_utf8_lossy(&entry.name).parse::<u32>() else {
            continue;
        };
        let read = |file: &str| {
            let path = format!("/proc/{pid}/{file}");
            async move {
                agent
                    .read_file(path.as_bytes(), 1 << 20, Duration::from_secs(30))
                    .await
            }
        };
        // A process that ended since the listing is gone, not unseen.
        let Ok(stat) = read("stat").await else {
            continue;
        };
        let Some((comm, ppid)) = parse_stat(&String::from_utf8_lossy(&stat)) else {
            view.unseen.push(format!("/proc/{pid}/stat does not parse"));
            continue;
        };
        if pid == 2 || ppid == 2 {
            continue;
        }
        let (Ok(status), Ok(cmdline)) = (read("status").await, read("cmdline").await) else {
            continue;
        };
        let uid = String::from_utf8_lossy(&status)
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().next().map(str::to_owned))
            .unwrap_or_else(|| "?".to_owned());
        let command: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|arg| !arg.is_empty())
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect();
        let command = if command.is_empty() {
            format!("[{comm}]")
        } else {
            command.join(" ")
        };
        *view
            .running_programs
            .entry(format!("{uid} {command}"))
            .or_default() += 1;
    }
    Ok(())
}

/// The command name and parent pid of a `/proc/<pid>/stat` line.
fn parse_stat(stat: &str) -> Option<(String, u32)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    let _state = rest.next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((comm, ppid))
}

/// `btime` of `/proc/stat`.
fn boot_time(stat: &str) -> Option<i64> {
    stat.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse().ok())
}

fn random_hex() -> String {
    let mut bytes = [0u8; 8];
    let _ = std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").expect("/dev/urandom"),
        &mut bytes,
    );
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
