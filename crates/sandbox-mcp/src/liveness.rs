//! Which server owns which sandboxes, and whether that server is still alive.
//!
//! Every server names itself by its process's identity: its pid, the kernel's start time of that
//! process (clock ticks since boot, so a reused pid has another), its effective user id, its pid
//! namespace and the boot id, plus random bits that keep two servers of one process apart. Each
//! sandbox the server makes has the thread id `<owner id>-<n>`, so the engine itself records the
//! owner with the sandbox.
//!
//! A starting server lists its scope and disposes of a sandbox only when the kernel proves its
//! owner gone: the owner is of this boot, this pid namespace and this user, and its pid is free,
//! a zombie, or another process (another start time). Anything else is never judged gone: another
//! host or boot (a remote engine serves several machines, and boot ids cannot tell a reboot from
//! another host), another pid namespace, another user (whose processes a `hidepid` procfs hides),
//! a thread not of this form, a process that cannot be read. No file decides it: a lock that is
//! missing, replaced or deleted proves nothing, so servers with different state directories, a
//! temp cleaner and a guest's bytes copied over a lock cannot make a live server's sandboxes look
//! abandoned.
//!
//! The server also keeps `<state dir>/<owner id>.lock`, locked while it runs: the running
//! servers of a state directory as an operator sees them. A cleanly ended server removes it; a
//! starting server removes those whose owners the kernel proves gone (crashed servers).

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::state_dir::{StateDir, StateDirError};

/// The largest `/proc/<pid>/stat` read (the kernel writes well under 1 KiB).
const MAX_STAT_BYTES: u64 = 4096;

/// The suffix of a server's lock file.
const LOCK_SUFFIX: &str = ".lock";

/// This server's id and its lock in the state directory.
#[derive(Debug)]
pub struct Liveness {
    id: String,
    me: Option<Owner>,
    dir: StateDir,
    lock: File,
    ended: AtomicBool,
}

/// Why the server's liveness could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LivenessError {
    /// The state directory is unfit or cannot be used.
    #[error(transparent)]
    StateDir(#[from] StateDirError),
    /// The lock file could not be written or locked.
    #[error("the lock {path} cannot be held: {source}")]
    Lock {
        /// The lock file.
        path: std::path::PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The operating system's random source failed, so no id could be drawn.
    #[error("no server id could be drawn: {0}")]
    Random(std::io::Error),
}

/// What a starting server concludes about the owner of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// The sandbox is this server's.
    Mine,
    /// The owner's process runs.
    Alive,
    /// The kernel proves the owner's process ended: its sandboxes may be disposed of.
    Gone,
    /// The owner cannot be judged from here (another host, boot, pid namespace or user, a thread
    /// of another form, a process that cannot be read): its sandboxes are left alone.
    NotJudged,
}

/// A server's process, as the kernel names it for the lifetime of one boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    pid: u32,
    /// The process's start time, in clock ticks since boot.
    start: u64,
    uid: u32,
    /// The inode of the process's pid namespace.
    pid_ns: u64,
    /// The boot id, 32 lowercase hex digits.
    boot: String,
}

/// What the kernel says of a pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Process {
    /// No process has the pid.
    Absent,
    /// The process has ended and awaits its parent (a zombie).
    Ended,
    /// A process started at `start` (clock ticks since boot) runs with the pid.
    Running {
        /// Its start time.
        start: u64,
    },
    /// The kernel's answer could not be read.
    Unreadable,
}

impl Liveness {
    /// Names this server, checks its state directory `dir` (made private when missing), removes
    /// the locks there of servers the kernel proves gone, and locks `<dir>/<id>.lock`.
    ///
    /// # Errors
    /// [`LivenessError::StateDir`] when the directory is unfit ([`StateDir::open`]),
    /// [`LivenessError::Lock`] when the lock cannot be made or held, [`LivenessError::Random`]
    /// when the random source fails.
    pub fn start(dir: &Path) -> Result<Self, LivenessError> {
        let dir = StateDir::open(dir)?;
        let me = Owner::of(std::process::id());
        // Random bits in every id: two servers in one process (a library host) never share a
        // thread id, and a server without a process identity still has a unique one.
        let random = host_state::random_hex(32).map_err(LivenessError::Random)?;
        let id = match &me {
            Some(me) => format!("{}.{}", me.id(), &random[..16]),
            None => random.to_owned(),
        };
        for name in dir.names() {
            if let Some(owner) = name.strip_suffix(LOCK_SUFFIX) {
                if judge_id(me.as_ref(), &id, owner, probe) == Verdict::Gone {
                    dir.remove(&name);
                }
            }
        }
        let name = format!("{id}{LOCK_SUFFIX}");
        let lock_error = |source| LivenessError::Lock {
            path: dir.path().join(&name),
            source,
        };
        let mut lock = dir.create_new(&name)?;
        lock.try_lock().map_err(|e| lock_error(e.into()))?;
        lock.write_all(format!("{id}\n").as_bytes())
            .map_err(lock_error)?;
        Ok(Liveness {
            id,
            me,
            dir,
            lock,
            ended: AtomicBool::new(false),
        })
    }

    /// This server's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether this server can prove other servers gone: false where the kernel does not name
    /// processes (no procfs), and then no sandbox is ever judged gone.
    pub fn judges(&self) -> bool {
        self.me.is_some()
    }

    /// The thread id of this server's `n`th sandbox.
    pub fn thread(&self, n: u64) -> String {
        format!("{}-{n}", self.id)
    }

    /// What this server concludes about the owner of `thread` (see the module's rules).
    pub fn verdict(&self, thread: &str) -> Verdict {
        match owner_of(thread) {
            Some(owner) => judge_id(self.me.as_ref(), &self.id, owner, probe),
            None => Verdict::NotJudged,
        }
    }

    /// Whether the kernel proves the server that made `thread` ended.
    pub fn owner_is_gone(&self, thread: &str) -> bool {
        self.verdict(thread) == Verdict::Gone
    }

    /// Removes this server's lock file, if it is still the one this server made; the lock itself
    /// is held until the process ends. Called at a clean end (and on drop); later calls do
    /// nothing.
    pub fn end(&self) {
        if !self.ended.swap(true, Ordering::AcqRel) {
            self.dir
                .remove_if_same(&format!("{}{LOCK_SUFFIX}", self.id), &self.lock);
        }
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.end();
    }
}

impl Owner {
    /// The identity of process `pid`, in this process's boot and pid namespace, as this user;
    /// `None` where procfs does not tell.
    pub(crate) fn of(pid: u32) -> Option<Owner> {
        let Process::Running { start } = probe(pid) else {
            return None;
        };
        let boot = read_capped(Path::new("/proc/sys/kernel/random/boot_id"))?;
        let boot: String = boot.trim().chars().filter(|c| *c != '-').collect();
        let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let pid_ns = ns
            .to_str()?
            .strip_prefix("pid:[")?
            .strip_suffix(']')?
            .parse()
            .ok()?;
        let owner = Owner {
            pid,
            start,
            uid: rustix::process::geteuid().as_raw(),
            pid_ns,
            boot: boot.to_ascii_lowercase(),
        };
        // The same parser that reads other servers' ids must read this one back.
        (Owner::parse(&owner.id()).as_ref() == Some(&owner)).then_some(owner)
    }

    /// `<pid>.<start>.<uid>.<pid namespace>.<boot id>`.
    pub(crate) fn id(&self) -> String {
        format!(
            "{}.{}.{}.{}.{}",
            self.pid, self.start, self.uid, self.pid_ns, self.boot
        )
    }

    /// Reads an owner id (the random part after it, if any, is not part of the identity).
    fn parse(id: &str) -> Option<Owner> {
        let mut parts = id.split('.');
        let mut number = || -> Option<u64> {
            let part = parts.next()?;
            // Digits only, no sign and no leading zero: one spelling per number.
            let canonical = !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_digit())
                && (part == "0" || !part.starts_with('0'));
            canonical.then(|| part.parse().ok()).flatten()
        };
        let pid = u32::try_from(number()?).ok()?;
        let start = number()?;
        let uid = u32::try_from(number()?).ok()?;
        let pid_ns = number()?;
        let boot = parts.next()?;
        let hex = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if boot.len() != 32 || !hex(boot) {
            return None;
        }
        match (parts.next(), parts.next()) {
            (None, _) => {}
            (Some(random), None) if !random.is_empty() && hex(random) => {}
            _ => return None,
        }
        Some(Owner {
            pid,
            start,
            uid,
            pid_ns,
            boot: boot.to_owned(),
        })
    }
}

/// The owner id of a thread made by [`Liveness::thread`], if it has that form.
fn owner_of(thread: &str) -> Option<&str> {
    let (owner, n) = thread.rsplit_once('-')?;
    (!owner.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(owner)
}

/// The verdict on the owner id `owner` for the server `me` whose own id is `my_id`, with
/// `probe` asking the kernel about a pid. Only a kernel answer about a process this server can
/// see as its own kind (same boot, pid namespace and user) ever gives [`Verdict::Gone`].
pub(crate) fn judge_id(
    me: Option<&Owner>,
    my_id: &str,
    owner: &str,
    probe: impl FnOnce(u32) -> Process,
) -> Verdict {
    if owner == my_id {
        return Verdict::Mine;
    }
    let (Some(me), Some(owner)) = (me, Owner::parse(owner)) else {
        return Verdict::NotJudged;
    };
    if (owner.boot.as_str(), owner.pid_ns, owner.uid) != (me.boot.as_str(), me.pid_ns, me.uid) {
        return Verdict::NotJudged;
    }
    match probe(owner.pid) {
        Process::Absent | Process::Ended => Verdict::Gone,
        Process::Running { start } if start == owner.start => Verdict::Alive,
        // The pid now names another process: the owner ended and its pid was reused.
        Process::Running { .. } => Verdict::Gone,
        Process::Unreadable => Verdict::NotJudged,
    }
}

/// What procfs says of `pid`.
pub(crate) fn probe(pid: u32) -> Process {
    match File::open(format!("/proc/{pid}/stat")) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Process::Absent,
        Err(_) => Process::Unreadable,
        Ok(file) => {
            let mut text = String::new();
            match file.take(MAX_STAT_BYTES).read_to_string(&mut text) {
                Ok(_) => parse_stat(&text),
                Err(_) => Process::Unreadable,
            }
        }
    }
}

/// Reads a `/proc/<pid>/stat` line: the state (field 3) and the start time (field 22), counted
/// after the command name's closing parenthesis (the name itself may hold spaces and parentheses).
fn parse_stat(text: &str) -> Process {
    let Some((_, rest)) = text.rsplit_once(')') else {
        return Process::Unreadable;
    };
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    match (fields.first(), fields.get(19).and_then(|s| s.parse().ok())) {
        (Some(&("Z" | "X" | "x")), Some(_)) => Process::Ended,
        (Some(_), Some(start)) => Process::Running { start },
        _ => Process::Unreadable,
    }
}

/// A small text file of procfs, whole, or `None`.
fn read_capped(path: &Path) -> Option<String> {
    let mut text = String::new();
    File::open(path)
        .ok()?
        .take(MAX_STAT_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A state directory of the test's own, private as the server requires.
    fn private_dir() -> tempfile::TempDir {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    fn me() -> Owner {
        Owner::of(std::process::id()).expect("procfs names this process")
    }

    /// A real process that runs until killed.
    fn child() -> std::process::Child {
        Command::new("sleep")
            .arg("600")
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    }

    fn lock_files(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(LOCK_SUFFIX))
            .collect()
    }

    #[test]
    fn a_missing_lock_never_makes_a_live_server_gone() {
        // Two servers of one scope with different state directories: neither finds the other's
        // lock, and neither judges the other gone.
        let (a, b) = (private_dir(), private_dir());
        let first = Liveness::start(a.path()).unwrap();
        let second = Liveness::start(b.path()).unwrap();
        assert_eq!(second.verdict(&first.thread(0)), Verdict::Alive);
        assert!(!second.owner_is_gone(&first.thread(0)));
        assert!(!first.owner_is_gone(&second.thread(7)));
    }

    #[test]
    fn a_deleted_or_replaced_lock_never_makes_a_live_server_gone() {
        let dir = private_dir();
        let first = Liveness::start(dir.path()).unwrap();
        let second = Liveness::start(dir.path()).unwrap();
        let lock = dir.path().join(format!("{}.lock", first.id()));
        std::fs::remove_file(&lock).unwrap();
        assert!(!second.owner_is_gone(&first.thread(1)), "deleted lock");
        // A file copied over it: a new, unlocked file of the same name.
        std::fs::write(&lock, b"guest bytes").unwrap();
        assert!(!second.owner_is_gone(&first.thread(1)), "replaced lock");
        // A third server starting there leaves the replacement (its name is a live owner's).
        let third = Liveness::start(dir.path()).unwrap();
        assert!(lock.exists());
        assert!(!third.owner_is_gone(&first.thread(1)));
        // The first server's end leaves a file that is not its own lock.
        first.end();
        assert_eq!(std::fs::read(&lock).unwrap(), b"guest bytes");
    }

    #[test]
    fn an_ended_process_is_gone_and_a_running_one_alive() {
        let me = me();
        let mut child = child();
        let pid = child.id();
        let owner = Owner::of(pid).unwrap();
        let id = format!("{}.0123456789abcdef", owner.id());
        assert_eq!(judge_id(Some(&me), "x", &id, probe), Verdict::Alive);
        child.kill().unwrap();
        // Killed but not yet reaped: a zombie, ended all the same.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while probe(pid) != Process::Ended {
            assert!(std::time::Instant::now() < deadline, "{:?}", probe(pid));
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(judge_id(Some(&me), "x", &id, probe), Verdict::Gone);
        child.wait().unwrap();
        assert_eq!(probe(pid), Process::Absent);
        assert_eq!(judge_id(Some(&me), "x", &id, probe), Verdict::Gone);
    }

    #[test]
    fn the_verdict_table() {
        let me = me();
        let live = |start| move |_| Process::Running { start };
        let other = |f: &dyn Fn(&mut Owner)| {
            let mut o = me.clone();
            o.pid = 4242;
            f(&mut o);
            o.id()
        };
        let same = other(&|_| {});
        let s = me.start;
        assert_eq!(judge_id(Some(&me), &same, &same, live(s)), Verdict::Mine);
        assert_eq!(judge_id(Some(&me), "x", &same, live(s)), Verdict::Alive);
        // The pid reused by a process started at another time: the owner ended.
        assert_eq!(judge_id(Some(&me), "x", &same, live(s + 1)), Verdict::Gone);
        assert_eq!(
            judge_id(Some(&me), "x", &same, |_| Process::Absent),
            Verdict::Gone
        );
        assert_eq!(
            judge_id(Some(&me), "x", &same, |_| Process::Ended),
            Verdict::Gone
        );
        assert_eq!(
            judge_id(Some(&me), "x", &same, |_| Process::Unreadable),
            Verdict::NotJudged
        );
        // Owners this server cannot see as processes of its own kind are never gone, whatever
        // the kernel says of their pid here.
        let foreign = [
            other(&|o| o.boot = "f".repeat(32)),
            other(&|o| o.pid_ns += 1),
            other(&|o| o.uid += 1),
        ];
        for id in &foreign {
            assert_eq!(
                judge_id(Some(&me), "x", id, |_| Process::Absent),
                Verdict::NotJudged,
                "{id}"
            );
        }
        // Ids of another form: an older server's random id, another host's thread, garbage.
        for id in [
            "0123456789abcdef0123456789abcdef".to_owned(),
            "some".to_owned(),
            String::new(),
            "1.2.3".to_owned(),
            format!("+{same}"),
            format!("0{same}"),
            format!("{same}.XYZ"),
            format!("{same}.ab.cd"),
        ] {
            assert_eq!(
                judge_id(Some(&me), "x", &id, |_| Process::Absent),
                Verdict::NotJudged,
                "{id}"
            );
        }
        // A server that cannot name its own process judges nobody.
        assert_eq!(
            judge_id(None, "x", &same, |_| Process::Absent),
            Verdict::NotJudged
        );
    }

    #[test]
    fn threads_carry_their_owner() {
        let dir = private_dir();
        let me = Liveness::start(dir.path()).unwrap();
        assert!(me.judges());
        assert_eq!(me.verdict(&me.thread(3)), Verdict::Mine);
        assert_eq!(owner_of(&me.thread(3)), Some(me.id()));
        assert_eq!(me.verdict("some-thread"), Verdict::NotJudged);
        assert_eq!(me.verdict("0123"), Verdict::NotJudged);
        assert_eq!(me.verdict(&format!("{}-", me.id())), Verdict::NotJudged);
    }

    #[test]
    fn stat_lines_are_read_after_the_name() {
        let line = |state: &str| {
            format!(
                "77 (a) b (c) {state} 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 424242 19 20\n"
            )
        };
        assert_eq!(parse_stat(&line("S")), Process::Running { start: 424242 });
        assert_eq!(parse_stat(&line("Z")), Process::Ended);
        assert_eq!(parse_stat("77 (a) S 1 2"), Process::Unreadable);
        assert_eq!(parse_stat("garbage"), Process::Unreadable);
    }

    #[test]
    fn a_clean_end_removes_the_lock_and_a_start_removes_those_of_ended_servers() {
        let dir = private_dir();
        let server = Liveness::start(dir.path()).unwrap();
        assert_eq!(lock_files(dir.path()), [format!("{}.lock", server.id())]);
        drop(server);
        assert_eq!(lock_files(dir.path()), Vec::<String>::new());

        // A crashed server's lock (its process ended) goes at the next start; a live process's,
        // and a file that names no owner, stay.
        let mut ended = child();
        let ended_owner = Owner::of(ended.id()).unwrap();
        ended.kill().unwrap();
        ended.wait().unwrap();
        let mut running = child();
        let running_owner = Owner::of(running.id()).unwrap();
        let crashed = format!("{}.00000000000000aa.lock", ended_owner.id());
        let live = format!("{}.00000000000000bb.lock", running_owner.id());
        for name in [&crashed, &live, &"notes.lock".to_owned()] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let server = Liveness::start(dir.path()).unwrap();
        let mut left = lock_files(dir.path());
        left.sort();
        let mut expected = vec![
            live.clone(),
            "notes.lock".to_owned(),
            format!("{}.lock", server.id()),
        ];
        expected.sort();
        assert_eq!(left, expected);
        running.kill().unwrap();
        running.wait().unwrap();
    }

    #[test]
    fn an_unfit_state_directory_is_a_typed_error() {
        use std::os::unix::fs::PermissionsExt as _;
        let base = tempfile::tempdir().unwrap();
        let shared = base.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let refused = Liveness::start(&shared).unwrap_err();
        assert!(
            matches!(
                refused,
                LivenessError::StateDir(StateDirError::NotPrivate { .. })
            ),
            "{refused}"
        );
        assert_eq!(lock_files(&shared), Vec::<String>::new(), "nothing written");
    }
}
