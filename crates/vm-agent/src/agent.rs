//! The agent: `/init` (modules, root switch, a reaping PID 1) and the protocol server.
//!
//! PID 1 loads the virtio and ext4 modules listed in the initramfs's `/modules/order`, mounts
//! `/dev/vda` and switches to it, mounts cgroup v2, then runs the server as a child (`serve`)
//! and reaps every orphan the guest's processes leave; a server that dies is started again.
//! The server serves every agent port (the virtio-serial ports `sbx.agent`, `sbx.agent.1`, ...,
//! as many as `vm_agent.ports=` on the kernel command line says), each on a thread of its own
//! and each an independent connection: several host processes use one VM at once, one port
//! each, and nothing on one port (a malformed frame, a failed call, a host gone) touches
//! another's calls. Each request runs on its own thread; a port's frames out are written whole
//! under that port's lock and only for its current session, so a reconnecting host never sees
//! a frame of an earlier session after its handshake answer.
//!
//! Every exec runs in its own cgroup v2 group (`/sys/fs/cgroup/sbx-<session>-<id>`, sessions
//! numbered across all ports), joined before `exec` so nothing it starts escapes; a timeout, a
//! `Kill`, the end of the exec's main process and the end of the session all write
//! `cgroup.kill`. Nothing an exec starts outlives it.
//!
//! Not here: any trust in the host's bytes beyond the protocol's bounds (a malformed frame ends
//! the session and the agent waits for a new handshake).

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use rustix::fs::Timespec;
use rustix::mount::{mount, mount_move, MountFlags};
use rustix::process::{pidfd_open, Pid, PidfdFlags, WaitOptions};
use vm_agent::proto::{
    self, encode, hello_prefix, Entry, ErrorCode, ExecRequest, ExitStatus, FileKind, FrameDecoder,
    GuestMsg, HostMsg, Stat, CHUNK, WINDOW,
};

/// How long boot waits for a device node (the root disk, the port).
const DEVICE_WAIT: Duration = Duration::from_secs(20);

/// How long an exec's output threads may run on after its group was killed.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Entries per `Entries` frame: names are at most 255 bytes, so a frame stays well under the
/// payload bound.
const ENTRIES_PER_FRAME: usize = 2048;

/// The agent's behaviour, from `vm_agent.mode=` on the kernel command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Serves the protocol.
    Serve,
    /// Test mode: answers the handshake, then answers every request with malformed frames.
    Garbage,
    /// Test mode: serves every request but `Exec`, which it takes and never answers (a guest
    /// whose commands never start).
    SilentExec,
}

pub fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    match args.get(1).and_then(|arg| arg.to_str()) {
        Some("serve") => {
            let mode = match args.get(2).and_then(|arg| arg.to_str()) {
                Some("garbage") => Mode::Garbage,
                Some("silent-exec") => Mode::SilentExec,
                _ => Mode::Serve,
            };
            serve(mode)
        }
        _ if std::process::id() == 1 => init(),
        _ => {
            eprintln!("vm-agent: run as the guest's /init, or `vm-agent serve`");
            ExitCode::from(2)
        }
    }
}

fn say(message: &str) {
    eprintln!("vm-agent: {message}");
}

// ---------------------------------------------------------------------------------------------
// PID 1
// ---------------------------------------------------------------------------------------------

fn init() -> ExitCode {
    if let Err(message) = boot() {
        say(&format!("boot failed: {message}"));
        // With `-no-reboot` the host's QEMU exits, which the driver reports as a failed boot.
        rustix::fs::sync();
        let _ = rustix::system::reboot(rustix::system::RebootCommand::Restart);
    }
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    // Passed to the server as it is: the server's parse is the one list of modes.
    let mode = cmdline
        .split_whitespace()
        .find_map(|word| word.strip_prefix("vm_agent.mode="))
        .unwrap_or("serve");
    let mut server = start_server(mode);
    loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, _))) => {
                if Some(pid.as_raw_nonzero().get() as u32) == server {
                    thread::sleep(Duration::from_millis(100));
                    server = start_server(mode);
                }
            }
            _ => thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn start_server(mode: &str) -> Option<u32> {
    match Command::new("/proc/self/exe").args(["serve", mode]).spawn() {
        Ok(child) => Some(child.id()),
        Err(error) => {
            say(&format!("cannot start the server: {error}"));
            None
        }
    }
}

fn boot() -> Result<(), String> {
    for (source, target, fstype) in [
        ("devtmpfs", "/dev", "devtmpfs"),
        ("proc", "/proc", "proc"),
        ("sysfs", "/sys", "sysfs"),
    ] {
        let _ = std::fs::create_dir_all(target);
        mount(source, target, fstype, MountFlags::empty(), None)
            .map_err(|error| format!("mount {target}: {error}"))?;
    }
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    load_modules(&cmdline);
    let disk = Path::new("/dev/vda");
    wait_for(|| disk.exists(), "the root disk /dev/vda")?;
    std::fs::create_dir_all("/newroot").map_err(|error| format!("mkdir /newroot: {error}"))?;
    mount(disk, "/newroot", "ext4", MountFlags::NOATIME, None)
        .map_err(|error| format!("mount /dev/vda: {error}"))?;
    for dir in ["dev", "proc", "sys"] {
        let target = Path::new("/newroot").join(dir);
        let _ = std::fs::create_dir_all(&target);
        mount_move(Path::new("/").join(dir), &target)
            .map_err(|error| format!("move /{dir}: {error}"))?;
    }
    std::env::set_current_dir("/newroot").map_err(|error| format!("chdir: {error}"))?;
    mount_move(".", "/").map_err(|error| format!("move the root: {error}"))?;
    rustix::process::chroot(".").map_err(|error| format!("chroot: {error}"))?;
    std::env::set_current_dir("/").map_err(|error| format!("chdir /: {error}"))?;
    mount(
        "cgroup2",
        "/sys/fs/cgroup",
        "cgroup2",
        MountFlags::empty(),
        None,
    )
    .map_err(|error| format!("mount cgroup2: {error}"))?;
    let _ = std::fs::create_dir_all("/tmp");
    let _ = mount("tmpfs", "/tmp", "tmpfs", MountFlags::NOSUID, None);
    let _ = std::fs::create_dir_all("/dev/pts");
    let _ = mount("devpts", "/dev/pts", "devpts", MountFlags::empty(), None);
    if let Err(error) = raise_loopback() {
        say(&format!("loopback left down: {error}"));
    }
    Ok(())
}

/// Brings the loopback interface up, which the kernel leaves down: guest processes reach the
/// host's services on `127.0.0.1` (`HostMsg::Accept`), and many programs expect it.
fn raise_loopback() -> Result<(), String> {
    /// `struct ifreq` as `SIOCGIFFLAGS` and `SIOCSIFFLAGS` read and write it: the name, then
    /// the flags in the union (40 bytes in all on 64-bit Linux).
    #[repr(C)]
    struct InterfaceFlags {
        name: [u8; 16],
        flags: i16,
        rest: [u8; 22],
    }
    const SIOCGIFFLAGS: rustix::ioctl::Opcode = 0x8913;
    const SIOCSIFFLAGS: rustix::ioctl::Opcode = 0x8914;
    const IFF_UP: i16 = 0x1;
    let socket = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )
    .map_err(|error| format!("socket: {error}"))?;
    let mut request = InterfaceFlags {
        name: [0; 16],
        flags: 0,
        rest: [0; 22],
    };
    request.name[..2].copy_from_slice(b"lo");
    // SAFETY: both opcodes take a `struct ifreq`, whose layout `InterfaceFlags` has (the
    // name, then the flags at offset 16, 40 bytes in all); the kernel reads and writes only
    // within it.
    #[allow(unsafe_code)]
    unsafe {
        rustix::ioctl::ioctl(
            &socket,
            rustix::ioctl::Updater::<SIOCGIFFLAGS, InterfaceFlags>::new(&mut request),
        )
        .map_err(|error| format!("SIOCGIFFLAGS lo: {error}"))?;
        request.flags |= IFF_UP;
        rustix::ioctl::ioctl(
            &socket,
            rustix::ioctl::Updater::<SIOCSIFFLAGS, InterfaceFlags>::new(&mut request),
        )
        .map_err(|error| format!("SIOCSIFFLAGS lo: {error}"))?;
    }
    Ok(())
}

/// Loads the modules named in `/modules/order`, in that order, with any `module.param=value`
/// of the kernel command line (the kernel applies those only to built-in code; `modprobe` would
/// pass them to modules). A module that fails (already loaded, or for hardware this guest
/// lacks) is reported and skipped: the boot fails later, by name, if something needed is
/// missing.
fn load_modules(cmdline: &str) {
    let order = std::fs::read_to_string("/modules/order").unwrap_or_default();
    for name in order.lines().map(str::trim).filter(|name| !name.is_empty()) {
        let module = name.replace('-', "_");
        let params: Vec<&str> = cmdline
            .split_whitespace()
            .filter_map(|word| {
                let (head, rest) = word.split_once('.')?;
                (head.replace('-', "_") == module).then_some(rest)
            })
            .collect();
        let params = CString::new(params.join(" ")).unwrap_or_default();
        let path = Path::new("/modules").join(format!("{name}.ko"));
        let loaded = File::open(&path)
            .map_err(|error| {
                rustix::io::Errno::from_io_error(&error).unwrap_or(rustix::io::Errno::IO)
            })
            .and_then(|file| rustix::system::finit_module(&file, &params, 0));
        match loaded {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(error) => say(&format!("module {name}: {error}")),
        }
    }
}

fn wait_for(ready: impl Fn() -> bool, what: &str) -> Result<(), String> {
    let deadline = Instant::now() + DEVICE_WAIT;
    while !ready() {
        if Instant::now() > deadline {
            return Err(format!("{what} did not appear"));
        }
        thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

/// The agent ports present now: (index, device path) for every virtio-serial port named
/// `proto::port_name(index)` with `index < count`.
fn find_ports(count: u32) -> Vec<(u32, PathBuf)> {
    let names: HashMap<String, u32> = (0..count).map(|i| (proto::port_name(i), i)).collect();
    let Ok(entries) = std::fs::read_dir("/sys/class/virtio-ports") else {
        return Vec::new();
    };
    let mut found: Vec<(u32, PathBuf)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = std::fs::read_to_string(entry.path().join("name")).ok()?;
            let index = *names.get(name.trim())?;
            Some((index, Path::new("/dev").join(entry.file_name())))
        })
        .collect();
    found.sort();
    found
}

/// The port's write side: whole frames under one lock, only for the current session.
struct Port {
    file: Mutex<File>,
    session: AtomicU64,
}

impl Port {
    /// Sends `message` for request `id` of session `session`; false when that session is over
    /// or the port failed.
    fn send(&self, session: u64, id: u32, message: &GuestMsg) -> bool {
        let frame = encode(id, message);
        let Ok(mut file) = self.file.lock() else {
            return false;
        };
        if self.session.load(Ordering::SeqCst) != session {
            return false;
        }
        file.write_all(&frame).is_ok()
    }

    fn error(&self, session: u64, id: u32, code: ErrorCode, message: String) {
        let mut message = message;
        message.truncate(4096);
        self.send(session, id, &GuestMsg::Error { code, message });
    }
}

/// Byte credit a stream's sender waits on.
struct Credit {
    available: Mutex<u64>,
    changed: Condvar,
    closed: AtomicBool,
}

impl Credit {
    fn new() -> Arc<Credit> {
        Arc::new(Credit {
            available: Mutex::new(u64::from(WINDOW)),
            changed: Condvar::new(),
            closed: AtomicBool::new(false),
        })
    }

    /// Waits for `n` bytes of credit; false once closed.
    fn take(&self, n: u64) -> bool {
        let Ok(mut available) = self.available.lock() else {
            return false;
        };
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return false;
            }
            if *available >= n {
                *available -= n;
                return true;
            }
            available = match self.changed.wait(available) {
                Ok(guard) => guard,
                Err(_) => return false,
            };
        }
    }

    fn give(&self, n: u32) {
        if let Ok(mut available) = self.available.lock() {
            *available = available.saturating_add(u64::from(n));
        }
        self.changed.notify_all();
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _guard = self.available.lock();
        self.changed.notify_all();
    }
}

/// Input to a stream the agent consumes (an exec's stdin, a file being written).
enum Input {
    Data(Vec<u8>),
    Eof,
}

/// A request in flight, as the reader thread routes frames to it.
struct Inflight {
    /// Where `Data` and `Eof` go, for requests that take input.
    input: Option<mpsc::Sender<Input>>,
    /// Input received and not yet credited back, bounded by the window.
    unacked: Arc<AtomicU64>,
    /// The credit of the request's output stream.
    output: Arc<Credit>,
    /// The exec's cgroup, for `Kill` and the session's end.
    cgroup: Option<PathBuf>,
    killed: Arc<AtomicBool>,
    /// An accepted connection, shut for `Kill` and the session's end.
    connection: Connection,
}

/// An `Accept`'s connection once a guest process made it.
type Connection = Arc<Mutex<Option<TcpStream>>>;

/// Shuts both ways of `connection`, which ends its threads' reads and writes.
fn shut(connection: &Connection) {
    if let Ok(slot) = connection.lock() {
        if let Some(stream) = slot.as_ref() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

struct Session {
    id: u64,
    requests: Mutex<HashMap<u32, Inflight>>,
}

impl Session {
    fn end(&self) {
        if let Ok(mut requests) = self.requests.lock() {
            for (_, request) in requests.drain() {
                request.output.close();
                request.killed.store(true, Ordering::SeqCst);
                shut(&request.connection);
                if let Some(cgroup) = &request.cgroup {
                    kill_cgroup(cgroup);
                }
            }
        }
    }

    fn finish(&self, id: u32) {
        if let Ok(mut requests) = self.requests.lock() {
            requests.remove(&id);
        }
    }
}

fn kill_cgroup(cgroup: &Path) {
    let _ = std::fs::write(cgroup.join("cgroup.kill"), b"1");
}

/// Sessions are numbered across every port, so two ports' execs never share a cgroup name.
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// Serves every agent port the kernel command line names (`vm_agent.ports=`), each on a thread
/// of its own: each port is an independent connection (its own sessions, decoder and write
/// lock), so a malformed frame, a failed call or a host gone on one port touches no other
/// port's calls. A port thread that fails is started again.
fn serve(mode: Mode) -> ExitCode {
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let count = proto::ports_from_cmdline(&cmdline);
    let started = Instant::now();
    let mut served: Vec<u32> = Vec::new();
    let mut threads = Vec::new();
    loop {
        for (index, path) in find_ports(count) {
            if served.contains(&index) {
                continue;
            }
            served.push(index);
            threads.push(thread::spawn(move || loop {
                let path = path.clone();
                let outcome = std::panic::catch_unwind(move || serve_port(&path, mode));
                say(&format!(
                    "port {index} stopped ({outcome:?}); serving it again"
                ));
                thread::sleep(Duration::from_millis(100));
            }));
        }
        if served.len() as u32 == count {
            break;
        }
        if started.elapsed() > DEVICE_WAIT {
            if served.is_empty() {
                say("no agent port appeared");
                return ExitCode::FAILURE;
            }
            say(&format!("{} of {count} agent ports appeared", served.len()));
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    for thread in threads {
        let _ = thread.join();
    }
    ExitCode::FAILURE
}

/// Serves one port until it cannot be opened or read.
fn serve_port(path: &Path, mode: Mode) -> Result<(), String> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|error| format!("open {}: {error}", path.display()))?;
    let mut reader = file
        .try_clone()
        .map_err(|error| format!("dup {}: {error}", path.display()))?;
    let port = Arc::new(Port {
        file: Mutex::new(file),
        session: AtomicU64::new(0),
    });
    let prefix = hello_prefix();
    let mut decoder = FrameDecoder::<HostMsg>::new();
    let mut session: Option<Arc<Session>> = None;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(n) => n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => 0,
        };
        if n == 0 {
            // The host is gone (or not yet there): end the session, wait for a connection.
            if let Some(old) = session.take() {
                end_session(&port, &old);
            }
            decoder = FrameDecoder::new();
            wait_for_host(&reader);
            continue;
        }
        decoder.push(&buf[..n]);
        loop {
            if session.is_none() && !decoder.skip_to(&prefix) {
                break;
            }
            match decoder.next_message() {
                Ok(None) => break,
                Ok(Some((_, HostMsg::Hello { nonce }))) => {
                    if let Some(old) = session.take() {
                        end_session(&port, &old);
                    }
                    let id = NEXT_SESSION.fetch_add(1, Ordering::SeqCst);
                    port.session.store(id, Ordering::SeqCst);
                    let fresh = Arc::new(Session {
                        id,
                        requests: Mutex::new(HashMap::new()),
                    });
                    port.send(id, 0, &GuestMsg::HelloAck { nonce });
                    session = Some(fresh);
                }
                Ok(Some((id, message))) => {
                    let Some(current) = &session else {
                        continue;
                    };
                    let ok = if mode == Mode::Garbage {
                        send_garbage(&port);
                        true
                    } else if mode == Mode::SilentExec && matches!(message, HostMsg::Exec(_)) {
                        true
                    } else {
                        dispatch(&port, current, id, message)
                    };
                    if !ok {
                        if let Some(old) = session.take() {
                            end_session(&port, &old);
                        }
                        decoder = FrameDecoder::new();
                    }
                }
                Err(error) => {
                    say(&format!("malformed frame, session closed: {error}"));
                    if let Some(old) = session.take() {
                        end_session(&port, &old);
                    }
                    decoder = FrameDecoder::new();
                    break;
                }
            }
        }
    }
}

fn end_session(port: &Port, session: &Session) {
    // No frame of the old session is written from here on.
    port.session
        .compare_exchange(session.id, 0, Ordering::SeqCst, Ordering::SeqCst)
        .ok();
    session.end();
}

/// Sleeps until the host end of the port is connected again.
///
/// While no host is connected the port polls as hung up and readable at once (a read returns
/// 0), so a plain `poll` loop spins; with several ports, idle ones then took most of a TCG
/// guest's CPU (8 ports: QEMU at 78% idle, `true` 0.53 s instead of 0.05 s). The kernel wakes
/// the port's wait queue when the host connects, so an edge-triggered `epoll` sleeps until then;
/// a wake-up each second covers a missed edge.
fn wait_for_host(reader: &File) {
    let hung_up = || {
        let mut fds = [PollFd::new(reader, PollFlags::IN)];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match poll(&mut fds, Some(&now)) {
            Ok(_) => fds[0].revents().contains(PollFlags::HUP),
            Err(_) => false,
        }
    };
    let waiter = rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC).and_then(
        |waiter| {
            rustix::event::epoll::add(
                &waiter,
                reader,
                rustix::event::epoll::EventData::new_u64(0),
                rustix::event::epoll::EventFlags::IN | rustix::event::epoll::EventFlags::ET,
            )
            .map(|()| waiter)
        },
    );
    let second = Timespec {
        tv_sec: 1,
        tv_nsec: 0,
    };
    let mut events = Vec::with_capacity(1);
    while hung_up() {
        match &waiter {
            Ok(waiter) => {
                events.clear();
                let _ = rustix::event::epoll::wait(
                    waiter,
                    rustix::buffer::spare_capacity(&mut events),
                    Some(&second),
                );
            }
            // No epoll (it cannot fail on a kernel that has virtio-serial): a slow poll.
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A frame of an unknown kind followed by a header announcing an oversized payload.
fn send_garbage(port: &Port) {
    let mut bytes = vec![0, 0, 0, 16, proto::VERSION, 250, 0, 0, 0, 1];
    bytes.extend_from_slice(&[0xa5; 16]);
    bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, proto::VERSION, 66, 0, 0, 0, 1]);
    if let Ok(mut file) = port.file.lock() {
        let _ = file.write_all(&bytes);
    }
}

/// Routes one message; false when the host broke the protocol (the session ends).
fn dispatch(port: &Arc<Port>, session: &Arc<Session>, id: u32, message: HostMsg) -> bool {
    let sid = session.id;
    match message {
        HostMsg::Data(bytes) => {
            let Ok(requests) = session.requests.lock() else {
                return false;
            };
            let Some(request) = requests.get(&id) else {
                // A request that already ended (its error raced the host's data).
                return true;
            };
            let Some(input) = &request.input else {
                return false;
            };
            let unacked = request
                .unacked
                .fetch_add(bytes.len() as u64, Ordering::SeqCst)
                + bytes.len() as u64;
            if unacked > u64::from(WINDOW) {
                say("the host overran an input window");
                return false;
            }
            let _ = input.send(Input::Data(bytes));
            true
        }
        HostMsg::Eof => {
            if let Ok(requests) = session.requests.lock() {
                if let Some(input) = requests.get(&id).and_then(|r| r.input.as_ref()) {
                    let _ = input.send(Input::Eof);
                }
            }
            true
        }
        HostMsg::Credit(n) => {
            if let Ok(requests) = session.requests.lock() {
                if let Some(request) = requests.get(&id) {
                    request.output.give(n);
                }
            }
            true
        }
        HostMsg::Kill => {
            if let Ok(requests) = session.requests.lock() {
                if let Some(request) = requests.get(&id) {
                    request.killed.store(true, Ordering::SeqCst);
                    shut(&request.connection);
                    if let Some(cgroup) = &request.cgroup {
                        kill_cgroup(cgroup);
                    }
                }
            }
            true
        }
        HostMsg::Hello { .. } => true,
        request => {
            let duplicate = session
                .requests
                .lock()
                .map(|requests| requests.contains_key(&id))
                .unwrap_or(true);
            if duplicate || id == 0 {
                return false;
            }
            let takes_input = matches!(
                &request,
                HostMsg::Exec(ExecRequest { stdin: true, .. })
                    | HostMsg::Write { .. }
                    | HostMsg::Accept { .. }
            );
            let (sender, receiver) = mpsc::channel();
            let cgroup = matches!(request, HostMsg::Exec(_))
                .then(|| PathBuf::from(format!("/sys/fs/cgroup/sbx-{sid}-{id}")));
            let inflight = Inflight {
                input: takes_input.then_some(sender),
                unacked: Arc::new(AtomicU64::new(0)),
                output: Credit::new(),
                cgroup,
                killed: Arc::new(AtomicBool::new(false)),
                connection: Arc::new(Mutex::new(None)),
            };
            let job = Job {
                port: Arc::clone(port),
                session: Arc::clone(session),
                id,
                output: Arc::clone(&inflight.output),
                unacked: Arc::clone(&inflight.unacked),
                cgroup: inflight.cgroup.clone(),
                killed: Arc::clone(&inflight.killed),
                input: Mutex::new(Some(receiver)),
                connection: Arc::clone(&inflight.connection),
            };
            if let Ok(mut requests) = session.requests.lock() {
                requests.insert(id, inflight);
            }
            // Listening before the next frame is read: a command the host starts after its
            // `Accept` finds the port open. (A failure is the job's to report.)
            if let HostMsg::Accept { port } = request {
                let _ = loopback_listener(port);
            }
            thread::spawn(move || job.run(request));
            true
        }
    }
}

/// One request's worker.
struct Job {
    port: Arc<Port>,
    session: Arc<Session>,
    id: u32,
    output: Arc<Credit>,
    unacked: Arc<AtomicU64>,
    cgroup: Option<PathBuf>,
    killed: Arc<AtomicBool>,
    input: Mutex<Option<mpsc::Receiver<Input>>>,
    connection: Connection,
}

impl Job {
    fn take_input(&self) -> Option<mpsc::Receiver<Input>> {
        self.input.lock().ok().and_then(|mut slot| slot.take())
    }

    fn send(&self, message: &GuestMsg) -> bool {
        self.port.send(self.session.id, self.id, message)
    }

    fn fail(&self, code: ErrorCode, message: String) {
        self.port.error(self.session.id, self.id, code, message);
    }

    fn io_fail(&self, what: &str, path: &[u8], error: &std::io::Error) {
        self.fail(
            ErrorCode::from_io(error),
            format!("{what} {}: {error}", String::from_utf8_lossy(path)),
        );
    }

    fn run(self, request: HostMsg) {
        match request {
            HostMsg::Exec(exec) => self.exec(exec),
            HostMsg::Stat { path } => match std::fs::symlink_metadata(OsStr::from_bytes(&path)) {
                Ok(meta) => {
                    self.send(&GuestMsg::Stat(stat_of(&meta)));
                }
                Err(error) => self.io_fail("stat", &path, &error),
            },
            HostMsg::Read { path, limit } => self.read(&path, limit),
            HostMsg::Write { path, mode } => self.write(&path, mode),
            HostMsg::List { path } => self.list(&path),
            HostMsg::Remove { path, recursive } => {
                let target = Path::new(OsStr::from_bytes(&path));
                let removed = match std::fs::symlink_metadata(target) {
                    Ok(meta) if meta.is_dir() && recursive => std::fs::remove_dir_all(target),
                    Ok(meta) if meta.is_dir() => std::fs::remove_dir(target),
                    Ok(_) => std::fs::remove_file(target),
                    Err(error) => Err(error),
                };
                match removed {
                    Ok(()) => {
                        self.send(&GuestMsg::Done);
                    }
                    Err(error) => self.io_fail("remove", &path, &error),
                }
            }
            HostMsg::Reclaim => {
                let before_kib = mem_available_kib();
                rustix::fs::sync();
                let _ = std::fs::write("/proc/sys/vm/drop_caches", b"3");
                let _ = std::fs::write("/proc/sys/vm/compact_memory", b"1");
                self.send(&GuestMsg::Reclaimed {
                    before_kib,
                    after_kib: mem_available_kib(),
                });
            }
            HostMsg::Renew {
                entropy,
                unix_nanos,
                identity,
            } => match renew(&entropy, unix_nanos, &identity) {
                Ok(()) => {
                    self.send(&GuestMsg::Done);
                }
                Err(message) => self.fail(ErrorCode::Io, message),
            },
            HostMsg::Accept { port } => self.accept(port),
            HostMsg::Shutdown => {
                self.send(&GuestMsg::Done);
                self.session.end();
                rustix::fs::sync();
                // `reboot=t` and QEMU's `-no-reboot` turn a restart into QEMU's exit.
                let _ = rustix::system::reboot(rustix::system::RebootCommand::Restart);
            }
            _ => {}
        }
        self.session.finish(self.id);
    }

    fn read(&self, path: &[u8], limit: u64) {
        // Past `limit` the host has what it asked for: stopping here spares sending, and the
        // host receiving, the rest of a file it would drop or refuse.
        let mut file = match File::open(OsStr::from_bytes(path)) {
            Ok(file) => file.take(limit),
            Err(error) => return self.io_fail("open", path, &error),
        };
        let mut buf = vec![0u8; CHUNK];
        loop {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if !self.output.take(n as u64) || !self.send(&GuestMsg::Data(buf[..n].to_vec()))
                    {
                        return;
                    }
                }
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => return self.io_fail("read", path, &error),
            }
        }
        self.send(&GuestMsg::Done);
    }

    fn write(&self, path: &[u8], mode: u32) {
        let opened = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode & 0o7777)
            .open(OsStr::from_bytes(path));
        let mut file = match opened {
            Ok(file) => file,
            Err(error) => return self.io_fail("create", path, &error),
        };
        let Some(input) = self.take_input() else {
            return;
        };
        let mut failed = None;
        loop {
            match input.recv() {
                Ok(Input::Data(bytes)) => {
                    if failed.is_none() {
                        if let Err(error) = file.write_all(&bytes) {
                            failed = Some(error);
                        }
                    }
                    let n = bytes.len() as u32;
                    self.unacked.fetch_sub(u64::from(n), Ordering::SeqCst);
                    if !self.send(&GuestMsg::Credit(n)) {
                        return;
                    }
                }
                Ok(Input::Eof) => break,
                Err(_) => return,
            }
        }
        match failed {
            Some(error) => self.io_fail("write", path, &error),
            None => {
                self.send(&GuestMsg::Done);
            }
        }
    }

    fn list(&self, path: &[u8]) {
        let entries = match std::fs::read_dir(OsStr::from_bytes(path)) {
            Ok(entries) => entries,
            Err(error) => return self.io_fail("list", path, &error),
        };
        let mut batch = Vec::new();
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            batch.push(Entry {
                name: entry.file_name().into_vec(),
                kind: kind_of(&meta),
                size: meta.len(),
            });
            if batch.len() == ENTRIES_PER_FRAME
                && !self.send(&GuestMsg::Entries(std::mem::take(&mut batch)))
            {
                return;
            }
        }
        if !batch.is_empty() && !self.send(&GuestMsg::Entries(batch)) {
            return;
        }
        self.send(&GuestMsg::Done);
    }

    fn exec(&self, request: ExecRequest) {
        let Some(cgroup) = self.cgroup.clone() else {
            return;
        };
        if let Err(error) = std::fs::create_dir(&cgroup) {
            return self.fail(
                ErrorCode::Io,
                format!("cgroup {}: {error}", cgroup.display()),
            );
        }
        let started = self.spawn(&request, &cgroup);
        let mut child = match started {
            Ok(child) => child,
            Err(NotStarted::Workdir(error)) => {
                let _ = std::fs::remove_dir(&cgroup);
                let dir = if request.workdir.is_empty() {
                    "/".into()
                } else {
                    String::from_utf8_lossy(&request.workdir)
                };
                return self.fail(
                    ErrorCode::WorkdirUnusable,
                    format!("cd: {dir}: {}", plain_reason(&error)),
                );
            }
            Err(NotStarted::Spawn(error)) => {
                let _ = std::fs::remove_dir(&cgroup);
                let code = match error.kind() {
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                        ErrorCode::from_io(&error)
                    }
                    _ => ErrorCode::SpawnFailed,
                };
                return self.fail(
                    code,
                    format!(
                        "spawn {}: {error}",
                        String::from_utf8_lossy(&request.argv[0])
                    ),
                );
            }
        };
        self.send(&GuestMsg::Started { pid: child.id() });
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let mut pumps = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            pumps.push(self.pump(stdout, true, done_tx.clone()));
        }
        if let Some(stderr) = child.stderr.take() {
            pumps.push(self.pump(stderr, false, done_tx.clone()));
        }
        drop(done_tx);
        if let Some(stdin) = child.stdin.take() {
            self.feed(stdin);
        }
        let timed_out = wait_exit(&child, request.timeout_ms);
        if timed_out {
            kill_cgroup(&cgroup);
        }
        let status = child.wait();
        // The exec is over: whatever it started goes with it.
        kill_cgroup(&cgroup);
        let grace = Instant::now() + DRAIN_GRACE;
        while done_rx
            .recv_timeout(grace.saturating_duration_since(Instant::now()))
            .is_ok()
        {}
        if Instant::now() >= grace {
            self.output.close();
        }
        for pump in pumps {
            let _ = pump.join();
        }
        remove_cgroup(&cgroup);
        let status = match status {
            Ok(status) => ExitStatus {
                code: status.code(),
                signal: status.signal(),
                timed_out,
                killed: self.killed.load(Ordering::SeqCst),
            },
            Err(error) => {
                return self.fail(ErrorCode::Io, format!("wait: {error}"));
            }
        };
        self.send(&GuestMsg::Exited(status));
    }

    /// Waits for a guest process's connection to `127.0.0.1:port` and carries it (see
    /// `HostMsg::Accept`). Several requests wait on one listener at once; each connection goes
    /// to one of them. The wait ends with the session or a `Kill`.
    fn accept(&self, port: u16) {
        let listener = match loopback_listener(port) {
            Ok(listener) => listener,
            Err(error) => {
                return self.fail(
                    ErrorCode::from_io(&error),
                    format!("listen on 127.0.0.1:{port}: {error}"),
                )
            }
        };
        let stream = loop {
            if self.killed.load(Ordering::SeqCst) || self.output.closed.load(Ordering::SeqCst) {
                return;
            }
            let mut fds = [PollFd::new(&*listener, PollFlags::IN)];
            let _ = poll(&mut fds, Some(&ACCEPT_POLL));
            // A wait killed while it polled leaves the connection to a live one.
            if self.killed.load(Ordering::SeqCst) {
                return;
            }
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(error) => {
                    return self.fail(ErrorCode::Io, format!("accept on port {port}: {error}"))
                }
            }
        };
        let (Ok(()), Ok(reader), Ok(writer)) = (
            stream.set_nonblocking(false),
            stream.try_clone(),
            stream.try_clone(),
        ) else {
            return self.fail(ErrorCode::Io, "an accepted connection".to_owned());
        };
        if let Ok(mut slot) = self.connection.lock() {
            *slot = Some(stream);
        }
        // A kill or the session's end that came while the connection was being set up.
        if self.killed.load(Ordering::SeqCst) {
            shut(&self.connection);
        }
        if !self.send(&GuestMsg::Connected) {
            shut(&self.connection);
            return;
        }
        let outward = self.forward(reader);
        self.feed_socket(writer);
        let _ = outward.join();
        shut(&self.connection);
        self.send(&GuestMsg::Done);
    }

    /// A thread that moves what the guest process sends to the host in credited `Data`
    /// chunks, then `Eof`.
    fn forward(&self, mut socket: TcpStream) -> thread::JoinHandle<()> {
        let port = Arc::clone(&self.port);
        let session = self.session.id;
        let id = self.id;
        let credit = Arc::clone(&self.output);
        thread::spawn(move || {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match socket.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let sent = credit.take(n as u64)
                            && port.send(session, id, &GuestMsg::Data(buf[..n].to_vec()));
                        if !sent {
                            break;
                        }
                    }
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            port.send(session, id, &GuestMsg::Eof);
        })
    }

    /// Writes the host's `Data` to the guest process's connection (crediting each chunk back
    /// once written), on this thread, until the host's `Eof`, which shuts the connection's
    /// write side.
    fn feed_socket(&self, mut socket: TcpStream) {
        let Some(input) = self.take_input() else {
            return;
        };
        let mut open = true;
        loop {
            match input.recv_timeout(KILL_CHECK) {
                Ok(Input::Data(bytes)) => {
                    if open && socket.write_all(&bytes).is_err() {
                        open = false;
                    }
                    let n = bytes.len() as u32;
                    self.unacked.fetch_sub(u64::from(n), Ordering::SeqCst);
                    self.send(&GuestMsg::Credit(n));
                }
                Ok(Input::Eof) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                // A killed connection was shut; its host sends nothing more.
                Err(mpsc::RecvTimeoutError::Timeout) if self.killed.load(Ordering::SeqCst) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
        let _ = socket.shutdown(Shutdown::Write);
    }

    /// Starts the request's process in `cgroup`, in its working directory, which the child
    /// enters itself just before its exec (after taking the request's user, so that user's
    /// permissions decide): a directory that is missing, not a directory or not searchable is
    /// told apart from a program that cannot start by a marker byte the child writes on a pipe
    /// of its own before it fails. One check, at the moment that counts: no window between a
    /// check and the start in which the directory could go.
    fn spawn(&self, request: &ExecRequest, cgroup: &Path) -> Result<Child, NotStarted> {
        if request.argv.is_empty() {
            return Err(NotStarted::Spawn(std::io::Error::from(
                std::io::ErrorKind::InvalidInput,
            )));
        }
        let workdir = if request.workdir.is_empty() {
            c"/".to_owned()
        } else {
            CString::new(request.workdir.clone()).map_err(|_| {
                NotStarted::Workdir(std::io::Error::from(std::io::ErrorKind::InvalidInput))
            })?
        };
        let (marker_read, marker_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| NotStarted::Spawn(e.into()))?;
        let procs = OpenOptions::new()
            .write(true)
            .open(cgroup.join("cgroup.procs"))
            .map_err(NotStarted::Spawn)?;
        let mut command = Command::new(OsStr::from_bytes(&request.argv[0]));
        command
            .args(request.argv[1..].iter().map(|arg| OsStr::from_bytes(arg)))
            .env_clear()
            .envs(
                request
                    .env
                    .iter()
                    .map(|(name, value)| (OsStr::from_bytes(name), OsStr::from_bytes(value))),
            )
            .stdin(if request.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = request.user {
            command.uid(uid).gid(gid);
        }
        // SAFETY: the closure runs in the forked child before exec and makes only
        // async-signal-safe system calls (write, chdir, setsid) on descriptors and a path made
        // before the fork; it allocates nothing and takes no lock.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                // Join the exec's group before anything runs, so nothing it starts escapes.
                rustix::io::write(&procs, b"0")?;
                if let Err(error) = rustix::process::chdir(workdir.as_c_str()) {
                    let _ = rustix::io::write(&marker_write, b"w");
                    return Err(error.into());
                }
                rustix::process::setsid()?;
                Ok(())
            });
        }
        let spawned = command.spawn();
        // The closure holds the parent's write end: once it is gone, a read ends at once.
        drop(command);
        spawned.map_err(|error| {
            let mut marker = [0u8; 1];
            match rustix::io::read(&marker_read, &mut marker) {
                Ok(1) => NotStarted::Workdir(error),
                _ => NotStarted::Spawn(error),
            }
        })
    }

    /// A thread that moves one output pipe to the host in credited chunks.
    fn pump(
        &self,
        mut pipe: impl Read + Send + 'static,
        stdout: bool,
        done: mpsc::Sender<()>,
    ) -> thread::JoinHandle<()> {
        let port = Arc::clone(&self.port);
        let session = self.session.id;
        let id = self.id;
        let credit = Arc::clone(&self.output);
        thread::spawn(move || {
            let mut buf = vec![0u8; CHUNK];
            let mut sending = true;
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) if sending => {
                        let chunk = buf[..n].to_vec();
                        let message = if stdout {
                            GuestMsg::Stdout(chunk)
                        } else {
                            GuestMsg::Stderr(chunk)
                        };
                        // Once the host stops taking output, the pipe is still drained so
                        // the process is never stuck on a full pipe.
                        sending = credit.take(n as u64) && port.send(session, id, &message);
                    }
                    Ok(_) => {}
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = done.send(());
        })
    }

    /// A thread that writes the host's stdin chunks to the process, crediting each one back
    /// once written (so the host never has more than a window in flight).
    fn feed(&self, mut stdin: std::process::ChildStdin) {
        let port = Arc::clone(&self.port);
        let session = self.session.id;
        let id = self.id;
        let unacked = Arc::clone(&self.unacked);
        let Some(input) = self.take_input() else {
            return;
        };
        thread::spawn(move || {
            let mut open = true;
            while let Ok(item) = input.recv() {
                match item {
                    Input::Data(bytes) => {
                        if open && stdin.write_all(&bytes).is_err() {
                            open = false;
                        }
                        let n = bytes.len() as u32;
                        unacked.fetch_sub(u64::from(n), Ordering::SeqCst);
                        port.send(session, id, &GuestMsg::Credit(n));
                    }
                    Input::Eof => break,
                }
            }
            drop(stdin);
        });
    }
}

/// How often a connection's host side looks at its kill.
const KILL_CHECK: Duration = Duration::from_millis(200);

/// How often a waiting `Accept` looks at its kill and its session.
const ACCEPT_POLL: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 200_000_000,
};

/// The listener on `127.0.0.1:port` (non-blocking), made by the first `Accept` of the port and
/// kept: later ones, of any session, wait on the same one.
fn loopback_listener(port: u16) -> std::io::Result<Arc<TcpListener>> {
    static LISTENERS: Mutex<Option<HashMap<u16, Arc<TcpListener>>>> = Mutex::new(None);
    let mut listeners = LISTENERS
        .lock()
        .map_err(|_| std::io::Error::other("listeners poisoned"))?;
    let listeners = listeners.get_or_insert_with(HashMap::new);
    if let Some(listener) = listeners.get(&port) {
        return Ok(Arc::clone(listener));
    }
    let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))?;
    listener.set_nonblocking(true)?;
    let listener = Arc::new(listener);
    listeners.insert(port, Arc::clone(&listener));
    Ok(listener)
}

/// Waits for the process to exit, at most `timeout_ms` (0: no limit); true when the limit
/// passed first.
fn wait_exit(child: &Child, timeout_ms: u64) -> bool {
    let Some(pid) = Pid::from_raw(child.id() as i32) else {
        return false;
    };
    let Ok(pidfd) = pidfd_open(pid, PidfdFlags::empty()) else {
        return false;
    };
    let deadline = (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms));
    loop {
        let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
        let timeout = deadline.map(|deadline| {
            let left = deadline.saturating_duration_since(Instant::now());
            Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            }
        });
        match poll(&mut fds, timeout.as_ref()) {
            Ok(0) => return true,
            Ok(_) => return false,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return false,
        }
    }
}

/// Removes an exec's group once its killed processes are gone (rmdir fails while any is).
fn remove_cgroup(cgroup: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::remove_dir(cgroup).is_err() && Instant::now() < deadline {
        kill_cgroup(cgroup);
        thread::sleep(Duration::from_millis(5));
    }
}

fn kind_of(meta: &std::fs::Metadata) -> FileKind {
    let kind = meta.file_type();
    if kind.is_symlink() {
        FileKind::Symlink
    } else if kind.is_dir() {
        FileKind::Dir
    } else if kind.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

fn stat_of(meta: &std::fs::Metadata) -> Stat {
    Stat {
        kind: kind_of(meta),
        size: meta.len(),
        mode: meta.permissions().mode() & 0o7777,
        mtime: meta.mtime(),
    }
}

/// `struct rand_pool_info` with room for the most entropy a renewal carries.
#[repr(C)]
struct RandPoolInfo {
    entropy_count: i32,
    buf_size: i32,
    buf: [u8; proto::MAX_RENEW_ENTROPY],
}

/// `RNDADDENTROPY`, `_IOW('R', 0x03, int[2])`: adds bytes to the input pool and credits them.
const RNDADDENTROPY: rustix::ioctl::Opcode = rustix::ioctl::opcode::write::<[i32; 2]>(b'R', 0x03);

/// `RNDRESEEDCRNG`, `_IO('R', 0x07)`: reseeds the generator from the input pool now.
const RNDRESEEDCRNG: rustix::ioctl::Opcode = rustix::ioctl::opcode::none(b'R', 0x07);

/// Makes this guest, restored from a saved state, a machine of its own (`HostMsg::Renew`).
///
/// The generator's state was saved with the rest of memory, so every guest restored from one
/// state would draw the same bytes: a write to `/dev/urandom` only mixes into the pool, and the
/// generator keeps its key until its next scheduled reseed (up to a minute away). So the host's
/// bytes are added and credited (`RNDADDENTROPY`) and the generator is reseeded from the pool at
/// once (`RNDRESEEDCRNG`): every reader after this draws from a key that depends on them.
fn renew(entropy: &[u8], unix_nanos: u64, identity: &[u8]) -> Result<(), String> {
    if entropy.len() > proto::MAX_RENEW_ENTROPY || !proto::valid_identity(identity) {
        return Err("a renewal outside the protocol's bounds".to_owned());
    }
    let random = OpenOptions::new()
        .write(true)
        .open("/dev/urandom")
        .map_err(|error| format!("open /dev/urandom: {error}"))?;
    let mut info = RandPoolInfo {
        entropy_count: (entropy.len() * 8) as i32,
        buf_size: entropy.len() as i32,
        buf: [0; proto::MAX_RENEW_ENTROPY],
    };
    info.buf[..entropy.len()].copy_from_slice(entropy);
    // SAFETY: RNDADDENTROPY reads a `struct rand_pool_info`, two ints then `buf_size` bytes;
    // `RandPoolInfo` is that layout with room for MAX_RENEW_ENTROPY bytes, at least `buf_size`.
    #[allow(unsafe_code)]
    unsafe {
        rustix::ioctl::ioctl(
            &random,
            rustix::ioctl::Setter::<RNDADDENTROPY, RandPoolInfo>::new(info),
        )
    }
    .map_err(|error| format!("RNDADDENTROPY: {error}"))?;
    // SAFETY: RNDRESEEDCRNG takes no argument.
    #[allow(unsafe_code)]
    unsafe { rustix::ioctl::ioctl(&random, rustix::ioctl::NoArg::<RNDRESEEDCRNG>::new()) }
        .map_err(|error| format!("RNDRESEEDCRNG: {error}"))?;
    let now = rustix::time::Timespec {
        tv_sec: (unix_nanos / 1_000_000_000) as i64,
        tv_nsec: (unix_nanos % 1_000_000_000) as i64,
    };
    rustix::time::clock_settime(rustix::time::ClockId::Realtime, now)
        .map_err(|error| format!("set the clock: {error}"))?;
    rustix::system::sethostname(identity).map_err(|error| format!("set the host name: {error}"))?;
    Ok(())
}

fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

/// Why an exec's process did not start.
enum NotStarted {
    /// Its working directory could not be entered.
    Workdir(std::io::Error),
    /// Anything else: the program, the cgroup, the descriptors.
    Spawn(std::io::Error),
}

/// The system's message for `error`, without Rust's ` (os error N)` suffix.
fn plain_reason(error: &std::io::Error) -> String {
    let text = error.to_string();
    match text.find(" (os error ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}
