//! One VM: its QEMU command line, its detached process, its state directory, QMP.
//!
//! A VM lives in a directory the driver creates (`<parent>/<name>`): `qmp.sock` and the agent
//! ports' sockets (`agent.sock`, `agent-1.sock`, ...), bound by the driver before QEMU starts
//! and handed to it as listening descriptors (so no other process can take a path between a
//! bind and QEMU's start), the ports' lock files (see `crate::ports`), `vm.json` (QEMU's pid,
//! the accelerator, the limits, the port count) and, when asked, `console.log`. QEMU
//! runs in its own session, so the VM outlives the process that made it; any process can
//! [`Vm::attach`] to the directory later. The root disk is `root.qcow2` in the VM's directory, a
//! qcow2 overlay over the image's raw root that the driver makes before QEMU starts: the guest's
//! writes land there, the base is never written, and the overlay goes with the directory.
//!
//! Not here: the agent's protocol (see [`crate::AgentClient`]).

use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::client::AgentClient;
use crate::disk::{create_overlay, option_value, QEMU_IMG_PROGRAM, ROOT_OVERLAY};
use crate::error::VmError;
use crate::image::VmImage;
use crate::ports::{self, DEFAULT_AGENT_PORTS};
use crate::qmp::QmpSession;
use crate::run_as::{RunAs, Spelling};
use crate::snapshot::INCOMING_FD;

/// How a VM's CPU is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Accel {
    /// Hardware virtualisation.
    Kvm,
    /// QEMU's emulator.
    Tcg,
}

impl Accel {
    /// QEMU's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Accel> {
        match name {
            "kvm" => Some(Accel::Kvm),
            "tcg" => Some(Accel::Tcg),
            _ => None,
        }
    }
}

/// The deadline of each QMP exchange.
const QMP_TIMEOUT: Duration = Duration::from_secs(10);

/// How often [`Vm::agent`] looks for a port another connection let go of.
const PORT_POLL: Duration = Duration::from_millis(50);

/// The least time a connection on a port taken late gets for its handshake.
const MIN_HANDSHAKE: Duration = Duration::from_secs(2);

/// How long a killed QEMU may take to go.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// How long [`Vm::run_on_after_save`] waits for a cancelled migration to end.
const SAVE_SETTLE: Duration = Duration::from_secs(10);

/// How often [`Vm::run_on_after_save`] asks whether the migration has ended.
const SETTLE_POLL: Duration = Duration::from_millis(20);

/// What a VM is started with.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// The image.
    pub image: VmImage,
    /// The directory the VM's own directory is made in.
    pub parent_dir: PathBuf,
    /// The VM's name (its directory's name): ASCII letters, digits, `-` and `_`.
    pub name: String,
    /// Guest memory, MiB.
    pub memory_mib: u32,
    /// Guest CPUs.
    pub cpus: u32,
    /// The accelerator (see [`crate::probe_accel`]).
    pub accel: Accel,
    /// The QEMU program.
    pub qemu: PathBuf,
    /// Extra kernel command-line words (test modes, debugging).
    pub kernel_args: Vec<String>,
    /// Whether the guest's serial console goes to `console.log` in the VM's directory (for
    /// debugging a boot; the guest can write to it without bound, so off by default).
    pub console_log: bool,
    /// The agent ports, `1..=`[`crate::MAX_AGENT_PORTS`]: how many host processes can use the
    /// VM at once (each holds one port while its connection lives).
    pub agent_ports: u32,
    /// The user QEMU runs as once its set-up is done (see [`RunAs`]).
    pub run_as: RunAs,
    /// The `qemu-img` program that makes the root overlay.
    pub qemu_img: PathBuf,
}

/// The QEMU program a [`VmConfig`] runs unless told otherwise, looked up on `PATH`.
pub const QEMU_PROGRAM: &str = "qemu-system-x86_64";

impl VmConfig {
    /// A config with 512 MiB, one CPU, TCG, [`QEMU_PROGRAM`] and [`QEMU_IMG_PROGRAM`] from `PATH`,
    /// [`DEFAULT_AGENT_PORTS`] agent ports, and QEMU dropping to ids of its own when this
    /// process is root ([`RunAs::OwnIdsUnderRoot`]).
    pub fn new(image: VmImage, parent_dir: impl Into<PathBuf>, name: impl Into<String>) -> Self {
        VmConfig {
            image,
            parent_dir: parent_dir.into(),
            name: name.into(),
            memory_mib: 512,
            cpus: 1,
            accel: Accel::Tcg,
            qemu: PathBuf::from(QEMU_PROGRAM),
            kernel_args: Vec::new(),
            console_log: false,
            agent_ports: DEFAULT_AGENT_PORTS,
            run_as: RunAs::OwnIdsUnderRoot,
            qemu_img: PathBuf::from(QEMU_IMG_PROGRAM),
        }
    }

    /// The VM's directory.
    pub fn dir(&self) -> PathBuf {
        self.parent_dir.join(&self.name)
    }

    /// QEMU's arguments, with the QMP listener on descriptor 3 and agent port `i`'s on `4 + i`,
    /// the drop to [`VmConfig::run_as`] spelled as `spelling` says.
    pub fn qemu_args(&self, tsc_khz: Option<u64>, spelling: Spelling) -> Vec<String> {
        let dir = self.dir();
        let mut append = vec![
            "quiet".to_owned(),
            "panic=-1".to_owned(),
            "reboot=t".to_owned(),
            "rdinit=/init".to_owned(),
        ];
        if self.console_log {
            append.push("console=ttyS0".to_owned());
        }
        if let (Accel::Tcg, Some(khz)) = (self.accel, tsc_khz) {
            // Without it the guest calibrates the TSC against an emulated timer and hangs.
            append.push(format!("tsc_early_khz={khz}"));
            // Every vCPU reads the host's invariant TSC, but the guest's boot check finds them
            // unsynchronised and falls back to jiffies, whose emulated tick drifts (a `sleep 2`
            // measured 1.88 s on the host): the TSC is the one clock that keeps host time.
            append.push("tsc=reliable".to_owned());
        }
        append.push(format!(
            "{}{}",
            vm_agent::proto::PORTS_ARG,
            self.agent_ports
        ));
        append.extend(self.kernel_args.iter().cloned());
        let mut args: Vec<String> = vec![
            "-name".into(),
            format!("sbx-vm-{}", self.name),
            "-nodefaults".into(),
            "-no-user-config".into(),
            "-nographic".into(),
            "-no-reboot".into(),
            // QEMU's own seccomp filter: a subverted device model cannot start programs, raise
            // its privileges, change its scheduling or use obsolete system calls.
            "-sandbox".into(),
            self.run_as.sandbox_option().into(),
            "-M".into(),
            "microvm".into(),
            "-accel".into(),
            self.accel.name().into(),
        ];
        if self.accel == Accel::Kvm {
            args.extend(["-cpu".into(), "host".into()]);
        }
        args.extend([
            "-m".into(),
            format!("{}M", self.memory_mib),
            "-smp".into(),
            self.cpus.to_string(),
            "-kernel".into(),
            self.image.kernel.display().to_string(),
            "-initrd".into(),
            self.image.initramfs.display().to_string(),
            "-append".into(),
            append.join(" "),
            "-drive".into(),
            // Read-write for the VM's life. Left to `auto-read-only`, the end of a save (which
            // makes the image inactive) failed (`bdrv_inactivate_all() failed`) for the VMs
            // `sandboxctl` makes with its default directories, so every acquire booted and no
            // fork could be made.
            format!(
                "id=root,file={},format=qcow2,if=none,file.auto-read-only=off",
                option_value(&dir.join(ROOT_OVERLAY))
            ),
            "-device".into(),
            "virtio-blk-device,drive=root".into(),
            "-device".into(),
            "virtio-serial-device,id=vser".into(),
        ]);
        for index in 0..self.agent_ports {
            args.extend([
                "-chardev".into(),
                format!("socket,id=agent{index},fd={},server=on,wait=off", 4 + index),
                "-device".into(),
                format!(
                    "virtserialport,bus=vser.0,chardev=agent{index},name={}",
                    vm_agent::proto::port_name(index)
                ),
            ]);
        }
        args.extend([
            "-chardev".into(),
            "socket,id=qmp,fd=3,server=on,wait=off".into(),
            "-mon".into(),
            "chardev=qmp,mode=control".into(),
            "-serial".into(),
        ]);
        if self.console_log {
            args.push(format!("file:{}", dir.join("console.log").display()));
        } else {
            args.push("none".into());
        }
        args.extend(self.run_as.qemu_args(spelling));
        args
    }
}

/// A VM's directory made and its config resolved, before QEMU starts.
pub(crate) struct Prepared {
    /// The config, QEMU's user resolved.
    pub(crate) config: VmConfig,
    /// The VM's directory, made.
    pub(crate) dir: PathBuf,
    /// How QEMU spells the drop to its user.
    pub(crate) spelling: Spelling,
}

/// QEMU's run state, from QMP `query-status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmStatus {
    /// Whether the guest's CPUs run.
    pub running: bool,
    /// QEMU's status word (`running`, `paused`, `shutdown`, ...).
    pub status: String,
}

/// A running VM, made here or attached to.
#[derive(Debug)]
pub struct Vm {
    dir: PathBuf,
    pid: i32,
    accel: Accel,
    agent_ports: u32,
    /// Reaps QEMU when this process made it, so it never lingers as a zombie.
    reaper: Option<std::thread::JoinHandle<()>>,
}

impl Vm {
    /// Starts QEMU for `config` and returns once its QMP monitor answers (the guest is then
    /// booting; [`Vm::agent`] waits for it).
    ///
    /// # Errors
    /// Io when the directory exists or cannot be made; Spawn or ToolFailed when `qemu-img`
    /// cannot make the root overlay; Spawn when QEMU cannot start; QemuExited when it exits at
    /// once (its log's tail says why); Qmp or Deadline when its monitor does not answer.
    ///
    /// # Cancel safety and drop
    /// A future dropped while the overlay is made leaves the directory without a QEMU (a
    /// caller's discard of the directory removes it);
    /// one dropped after QEMU started leaves that VM running (it is detached by
    /// design); [`Vm::attach`] finds it by its directory.
    pub async fn start(config: &VmConfig) -> Result<Vm, VmError> {
        let prepared = Vm::prepare(config).await?;
        let overlay = create_overlay(
            &config.qemu_img,
            &config.image.rootfs,
            &prepared.dir.join(ROOT_OVERLAY),
        )
        .await;
        if let Err(error) = overlay {
            let _ = std::fs::remove_dir_all(&prepared.dir);
            return Err(error);
        }
        Vm::launch(&prepared, None).await
    }

    /// Checks `config`, resolves QEMU's user and makes the VM's directory.
    pub(crate) async fn prepare(config: &VmConfig) -> Result<Prepared, VmError> {
        if config.name.is_empty()
            || !config
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(VmError::Invalid(format!("VM name {:?}", config.name)));
        }
        if !(1..=vm_agent::proto::MAX_PORTS).contains(&config.agent_ports) {
            return Err(VmError::Invalid(format!(
                "{} agent ports (1 to {})",
                config.agent_ports,
                vm_agent::proto::MAX_PORTS
            )));
        }
        let dir = config.dir();
        std::fs::create_dir_all(&config.parent_dir)
            .map_err(|e| VmError::io("creating", &config.parent_dir, e))?;
        let resolved = VmConfig {
            run_as: config.run_as.resolve()?,
            ..config.clone()
        };
        let spelling = match resolved.run_as {
            RunAs::Ids { .. } => Spelling::of(&config.qemu).await?,
            _ => Spelling::RunWith,
        };
        std::fs::create_dir(&dir).map_err(|e| VmError::io("creating", &dir, e))?;
        Ok(Prepared {
            config: resolved,
            dir,
            spelling,
        })
    }

    /// Starts QEMU in a prepared directory whose root overlay is in place, restoring from
    /// `incoming` when given, and returns once its monitor answers; on failure nothing runs
    /// and the directory is gone.
    pub(crate) async fn launch(
        prepared: &Prepared,
        incoming: Option<&std::fs::File>,
    ) -> Result<Vm, VmError> {
        let dir = &prepared.dir;
        let started = give_overlay(&prepared.config, dir)
            .and_then(|()| Vm::spawn(&prepared.config, dir, prepared.spelling, incoming));
        if started.is_err() {
            // Nothing runs there: the directory goes with the failure.
            let _ = std::fs::remove_dir_all(dir);
        }
        let vm = started?;
        match vm.status().await {
            Ok(_) => Ok(vm),
            Err(error) => {
                let detail = vm.log_tail();
                let _ = vm.kill().await;
                Err(match error {
                    VmError::Qmp { .. } | VmError::ChannelClosed { .. } | VmError::Io { .. } => {
                        VmError::QemuExited { detail }
                    }
                    other => other,
                })
            }
        }
    }

    fn spawn(
        config: &VmConfig,
        dir: &Path,
        spelling: Spelling,
        incoming: Option<&std::fs::File>,
    ) -> Result<Vm, VmError> {
        let dir = dir.to_owned();
        let qmp = std::os::unix::net::UnixListener::bind(dir.join("qmp.sock"))
            .map_err(|e| VmError::io("binding", dir.join("qmp.sock"), e))?;
        let mut agents = Vec::new();
        for index in 0..config.agent_ports {
            let socket = ports::socket_path(&dir, index);
            agents.push(
                std::os::unix::net::UnixListener::bind(&socket)
                    .map_err(|e| VmError::io("binding", &socket, e))?,
            );
        }
        // Above every target (3 and 4 + the ports), so a dup2 in the child never lands on a
        // source not yet placed and always makes a fresh, inheritable copy.
        let first_free = 4 + vm_agent::proto::MAX_PORTS + 1;
        let qmp_fd = rustix::io::fcntl_dupfd_cloexec(qmp.as_fd(), first_free as i32)
            .map_err(|e| VmError::io("duplicating", dir.join("qmp.sock"), e.into()))?;
        let mut agent_fds = Vec::new();
        for (index, agent) in agents.iter().enumerate() {
            agent_fds.push(
                rustix::io::fcntl_dupfd_cloexec(agent.as_fd(), first_free as i32).map_err(|e| {
                    VmError::io(
                        "duplicating",
                        ports::socket_path(&dir, index as u32),
                        e.into(),
                    )
                })?,
            );
        }
        let log_path = dir.join("qemu.log");
        let incoming_fd = incoming
            .map(|file| {
                rustix::io::fcntl_dupfd_cloexec(file.as_fd(), first_free as i32).map_err(|e| {
                    VmError::io("duplicating", dir.join("(snapshot memory)"), e.into())
                })
            })
            .transpose()?;
        let mut args = config.qemu_args(host_tsc_khz(), spelling);
        if incoming_fd.is_some() {
            args.extend(["-incoming".into(), format!("fd:{INCOMING_FD}")]);
        }
        let mut command = std::process::Command::new(&config.qemu);
        command
            .args(args)
            .env("TMPDIR", &dir)
            .stdin(std::process::Stdio::null())
            .stdout(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(&log_path)
                    .map_err(|e| VmError::io("opening", &log_path, e))?,
            )
            .stderr(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(&log_path)
                    .map_err(|e| VmError::io("opening", &log_path, e))?,
            );
        let qmp_raw = raw(&qmp_fd);
        let agent_raws: Vec<i32> = agent_fds.iter().map(raw).collect();
        let incoming_raw = incoming_fd.as_ref().map(raw);
        // SAFETY: as above: only dup2 (through the raw-descriptor helper) and setsid run in the
        // child between fork and exec; the descriptor list was made before the fork and is
        // only read.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                place_fd(qmp_raw, 3)?;
                for (index, agent_raw) in agent_raws.iter().enumerate() {
                    place_fd(*agent_raw, 4 + index as i32)?;
                }
                if let Some(incoming_raw) = incoming_raw {
                    place_fd(incoming_raw, INCOMING_FD)?;
                }
                rustix::process::setsid()?;
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(|source| VmError::Spawn {
            program: config.qemu.display().to_string(),
            source,
        })?;
        drop((qmp_fd, agent_fds, qmp, agents, incoming_fd));
        let pid = child.id() as i32;
        let state = serde_json::json!({
            "pid": pid,
            "accel": config.accel.name(),
            "memory_mib": config.memory_mib,
            "cpus": config.cpus,
            "agent_ports": config.agent_ports,
        });
        std::fs::write(dir.join("vm.json"), state.to_string())
            .map_err(|e| VmError::io("writing", dir.join("vm.json"), e))?;
        let reaper = std::thread::spawn(move || {
            let _ = child.wait();
        });
        Ok(Vm {
            dir,
            pid,
            accel: config.accel,
            agent_ports: config.agent_ports,
            reaper: Some(reaper),
        })
    }

    /// The VM whose directory is `dir`, made by this or another process.
    ///
    /// # Errors
    /// NotRunning when `vm.json` is missing, its pid is gone, or the process there is not the
    /// QEMU of this directory.
    pub fn attach(dir: &Path) -> Result<Vm, VmError> {
        let state = std::fs::read_to_string(dir.join("vm.json"))
            .map_err(|e| VmError::not_running(dir, format!("no vm.json: {e}")))?;
        let value: serde_json::Value = serde_json::from_str(&state)
            .map_err(|e| VmError::not_running(dir, format!("vm.json: {e}")))?;
        let pid = value
            .get("pid")
            .and_then(serde_json::Value::as_i64)
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| VmError::not_running(dir, "vm.json has no pid"))?;
        let accel = value
            .get("accel")
            .and_then(serde_json::Value::as_str)
            .and_then(Accel::parse)
            .ok_or_else(|| VmError::not_running(dir, "vm.json has no accelerator"))?;
        // A VM started before ports were counted has the one.
        let agent_ports = value
            .get("agent_ports")
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(1)
            .clamp(1, vm_agent::proto::MAX_PORTS);
        let vm = Vm {
            dir: dir.to_owned(),
            pid,
            accel,
            agent_ports,
            reaper: None,
        };
        if !vm.is_alive() {
            return Err(VmError::not_running(
                dir,
                format!("pid {pid} is not its QEMU"),
            ));
        }
        Ok(vm)
    }

    /// The VM's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// QEMU's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The accelerator it runs under.
    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// Its agent ports: how many connections (one per host process) it serves at once.
    pub fn agent_ports(&self) -> u32 {
        self.agent_ports
    }

    /// Whether QEMU still runs and is this directory's (its command line names the
    /// directory's QMP socket... through the fixed `-name`).
    pub fn is_alive(&self) -> bool {
        let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", self.pid)) else {
            return false;
        };
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        // A zombie has exited; its command line is empty anyway, but say so explicitly.
        if stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        {
            return false;
        }
        let name = self
            .dir
            .file_name()
            .map(|n| format!("sbx-vm-{}", n.to_string_lossy()))
            .unwrap_or_default();
        let tmpdir_ok = std::fs::read(format!("/proc/{}/environ", self.pid))
            .map(|env| {
                let want = format!("TMPDIR={}", self.dir.display());
                env.split(|b| *b == 0).any(|var| var == want.as_bytes())
            })
            .unwrap_or(false);
        cmdline.split(|b| *b == 0).any(|arg| arg == name.as_bytes()) && tmpdir_ok
    }

    /// Connects to the guest agent on a free agent port (see `crate::ports`), waiting up to
    /// `timeout` for one that another connection lets go of and for the agent's answer (a
    /// booting guest answers once its agent runs). The port is this connection's until the
    /// last clone of the client and every exec it started are dropped.
    ///
    /// # Errors
    /// PortsBusy when every port stays held by other connections for `timeout`; BootTimeout
    /// when the agent does not answer in time; QemuExited when QEMU is gone; Handshake or
    /// Protocol when the guest answers with something else.
    ///
    /// # Cancel safety and drop
    /// Dropping the future closes the connection and lets its port go; the agent then waits
    /// for the next one on that port.
    pub async fn agent(&self, timeout: Duration) -> Result<AgentClient, VmError> {
        let started = Instant::now();
        let lease = loop {
            match ports::take_free_port(&self.dir, self.agent_ports) {
                Ok(Some(lease)) => break lease,
                Ok(None) => {}
                Err(error) if self.is_alive() => return Err(error),
                Err(_) => {
                    return Err(VmError::QemuExited {
                        detail: self.log_tail(),
                    })
                }
            }
            if !self.is_alive() {
                return Err(VmError::QemuExited {
                    detail: self.log_tail(),
                });
            }
            if started.elapsed() >= timeout {
                return Err(VmError::PortsBusy {
                    ports: self.agent_ports,
                    after: timeout,
                });
            }
            tokio::time::sleep(PORT_POLL).await;
        };
        // A port freed late still gets a handshake's worth of time.
        let budget = timeout;
        let timeout = timeout.saturating_sub(started.elapsed()).max(MIN_HANDSHAKE);
        let started = Instant::now();
        let connect = AgentClient::connect_leased(lease, timeout);
        tokio::pin!(connect);
        loop {
            tokio::select! {
                result = &mut connect => {
                    return match result {
                        Err(VmError::Deadline { .. }) => Err(VmError::BootTimeout { after: budget }),
                        Err(error) if !self.is_alive() => {
                            Err(VmError::QemuExited { detail: format!("{error}; {}", self.log_tail()) })
                        }
                        other => other,
                    };
                }
                () = tokio::time::sleep(Duration::from_millis(200)) => {
                    if !self.is_alive() {
                        return Err(VmError::QemuExited { detail: self.log_tail() });
                    }
                    if started.elapsed() > timeout + Duration::from_secs(1) {
                        return Err(VmError::BootTimeout { after: budget });
                    }
                }
            }
        }
    }

    /// QEMU's run state.
    ///
    /// # Errors
    /// Qmp, Deadline, or Io/ChannelClosed when the monitor is gone.
    pub async fn status(&self) -> Result<VmStatus, VmError> {
        let answer = self.qmp("query-status").await?;
        let ret = answer.get("return").ok_or_else(|| VmError::Qmp {
            message: format!("query-status answered {answer}"),
        })?;
        Ok(VmStatus {
            running: ret.get("running").and_then(serde_json::Value::as_bool) == Some(true),
            status: ret
                .get("status")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("")
                .to_owned(),
        })
    }

    /// Runs a paused VM on (after [`crate::Snapshot::save`]).
    ///
    /// # Errors
    /// Qmp, Deadline, or Io/ChannelClosed when the monitor is gone.
    pub async fn resume(&self) -> Result<(), VmError> {
        self.qmp_value(serde_json::json!({"execute": "cont"}))
            .await
            .map(drop)
    }

    /// Runs the guest on after a save, whatever became of the save: one still under way (its
    /// process died, or gave up at its deadline) is cancelled and waited out first, because
    /// QEMU stops the guest again when a migration ends, so a guest run on while it was under
    /// way would be found stopped later with nothing left to run it. Then a guest a save left
    /// stopped (`paused`, `postmigrate`) runs on; a running one is left as it is.
    ///
    /// # Errors
    /// Deadline when the migration has not ended within 10 s; Qmp, or
    /// Io/ChannelClosed when the monitor is gone.
    pub async fn run_on_after_save(&self) -> Result<(), VmError> {
        let deadline = Instant::now() + SAVE_SETTLE;
        let mut cancelled = false;
        loop {
            let answer = self.qmp("query-migrate").await?;
            // No status: this QEMU never migrated.
            let status = answer
                .pointer("/return/status")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("none");
            if matches!(status, "none" | "completed" | "failed" | "cancelled") {
                break;
            }
            if !cancelled && status != "cancelling" {
                self.qmp("migrate_cancel").await?;
                cancelled = true;
            }
            if Instant::now() >= deadline {
                return Err(VmError::Deadline {
                    what: "the end of an interrupted save",
                    after: SAVE_SETTLE,
                });
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
        let status = self.status().await?;
        if !status.running && matches!(status.status.as_str(), "paused" | "postmigrate") {
            self.resume().await?;
        }
        Ok(())
    }

    /// Asks QEMU to quit at once (QMP `quit`), then waits for it to go.
    ///
    /// # Errors
    /// As [`Vm::status`]; Deadline when QEMU does not exit.
    pub async fn quit(self) -> Result<(), VmError> {
        let incarnation = self.incarnation();
        let _ = self.qmp("quit").await;
        self.wait_gone(incarnation, EXIT_WAIT).await?;
        self.cleanup();
        Ok(())
    }

    /// Kills QEMU (SIGKILL), waits for it to go and removes the VM's directory.
    ///
    /// # Errors
    /// Deadline when it does not go; Io when the directory cannot be removed.
    pub async fn kill(self) -> Result<(), VmError> {
        let incarnation = self.incarnation();
        if self.is_alive() {
            if let Some(pid) = rustix::process::Pid::from_raw(self.pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        self.wait_gone(incarnation, EXIT_WAIT).await?;
        self.cleanup();
        Ok(())
    }

    /// Shuts the guest down through its agent, waits up to `timeout` for QEMU to exit, and
    /// kills it if it does not.
    ///
    /// # Errors
    /// As [`Vm::kill`].
    pub async fn shutdown(self, timeout: Duration) -> Result<(), VmError> {
        let incarnation = self.incarnation();
        if let Ok(client) = self.agent(Duration::from_secs(2)).await {
            let _ = client.shutdown().await;
        }
        if self.wait_gone(incarnation, timeout).await.is_ok() {
            self.cleanup();
            return Ok(());
        }
        self.kill().await
    }

    /// QEMU's start time while it runs: with its pid, it names this very process, whatever
    /// process gets the pid after it.
    fn incarnation(&self) -> Option<u64> {
        self.is_alive()
            .then(|| process_stat(self.pid).map(|stat| stat.started))
            .flatten()
    }

    /// Waits until QEMU has exited: gone or a zombie, so its descriptors are closed and what it
    /// held open (its disk overlay) no longer takes room. Its command line reads empty earlier,
    /// while its memory is torn down (a while for a large guest), with its files still open: so
    /// `incarnation`, the process seen running before, counts as running until then.
    async fn wait_gone(&self, incarnation: Option<u64>, timeout: Duration) -> Result<(), VmError> {
        let deadline = Instant::now() + timeout;
        loop {
            // Reaps QEMU when it is a child of this process without a reaper thread (it was
            // made by a process that exited, and this one is its subreaper); otherwise ECHILD.
            if let Some(pid) = rustix::process::Pid::from_raw(self.pid) {
                if self.reaper.is_none() {
                    let _ =
                        rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG);
                }
            }
            let exiting = incarnation.is_some_and(|started| {
                process_stat(self.pid).is_some_and(|stat| stat.started == started && !stat.exited)
            });
            if !self.is_alive() && !exiting {
                break;
            }
            if Instant::now() > deadline {
                return Err(VmError::Deadline {
                    what: "QEMU's exit",
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    fn cleanup(mut self) {
        if let Some(reaper) = self.reaper.take() {
            let _ = reaper.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// The end of QEMU's own log (its errors), for reports.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read(self.dir.join("qemu.log")).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        let tail = String::from_utf8_lossy(&text[start..]).trim().to_owned();
        if tail.is_empty() {
            "QEMU's log is empty".to_owned()
        } else {
            tail
        }
    }

    /// One QMP command on a fresh connection (greeting, capabilities, the command), every
    /// line capped and the whole exchange under a deadline.
    async fn qmp(&self, command: &str) -> Result<serde_json::Value, VmError> {
        self.qmp_value(serde_json::json!({ "execute": command }))
            .await
    }

    /// As [`Vm::qmp`], for a command with arguments.
    pub(crate) async fn qmp_value(
        &self,
        command: serde_json::Value,
    ) -> Result<serde_json::Value, VmError> {
        let path = self.dir.join("qmp.sock");
        let exchange = async {
            let mut session = QmpSession::open(&path).await?;
            session.execute(command, None).await
        };
        tokio::time::timeout(QMP_TIMEOUT, exchange)
            .await
            .map_err(|_| VmError::Deadline {
                what: "a QMP exchange",
                after: QMP_TIMEOUT,
            })?
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        // Detached by design: dropping the handle leaves the VM running. The reaper thread
        // stays with QEMU and reaps it whenever it exits.
        drop(self.reaper.take());
    }
}

fn raw(fd: &std::os::fd::OwnedFd) -> i32 {
    use std::os::fd::AsRawFd;
    fd.as_raw_fd()
}

/// Makes descriptor `target` a copy of `source` without close-on-exec.
fn place_fd(source: i32, target: i32) -> std::io::Result<()> {
    // SAFETY: both numbers are descriptors of this (forked) process: `source` was opened
    // before the fork and is kept open by the parent until spawn returns.
    #[allow(unsafe_code)]
    let source = unsafe { std::os::fd::BorrowedFd::borrow_raw(source) };
    // SAFETY: `target` is a descriptor number this child is about to own; dup2 replaces
    // whatever was there, and the OwnedFd is forgotten so it is never closed here.
    #[allow(unsafe_code)]
    let mut target =
        unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(target) };
    let result = rustix::io::dup2(source, &mut target);
    std::mem::forget(target);
    result.map_err(std::io::Error::from)
}

/// Makes the root overlay QEMU's own when QEMU drops to ids of its own: it opens the overlay
/// before the drop, but opens it again after (a save inactivates the disk, and the next `cont`
/// reopens it for writing), which fails on a file it cannot write.
fn give_overlay(config: &VmConfig, dir: &Path) -> Result<(), VmError> {
    if let RunAs::Ids { uid, gid } = config.run_as {
        let overlay = dir.join(ROOT_OVERLAY);
        rustix::fs::chown(
            &overlay,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(|e| VmError::io("giving QEMU's user", &overlay, e.into()))?;
    }
    Ok(())
}

/// A QEMU of this driver's that runs: every QEMU is started with `TMPDIR` set to its VM's
/// directory, so its environment says which VM it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningQemu {
    /// The QEMU's process id.
    pub pid: i32,
    /// Its VM's directory, as its environment names it.
    pub vm_dir: PathBuf,
}

/// Every running QEMU (not a zombie) whose VM directory lies below `dir`, whichever process
/// started it: what a test or a run looks for when it asks whether anything of it is left.
pub fn qemus_under(dir: &Path) -> Vec<RunningQemu> {
    let prefix = format!("TMPDIR={}/", dir.display());
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            if zombie {
                return None;
            }
            let vm_dir = environ.split(|b| *b == 0).find_map(|var| {
                let below = std::str::from_utf8(var).ok()?.strip_prefix(&prefix)?;
                Some(dir.join(below.trim_end_matches('/')))
            })?;
            Some(RunningQemu { pid, vm_dir })
        })
        .collect()
}

/// The host's TSC frequency in kHz: sysfs when the kernel exports it, else cpu0's MHz from
/// `/proc/cpuinfo` (the frequency the kernel calibrated).
pub fn host_tsc_khz() -> Option<u64> {
    if let Ok(text) = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/tsc_freq_khz") {
        if let Ok(khz) = text.trim().parse() {
            return Some(khz);
        }
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("cpu MHz"))
        .and_then(|rest| rest.split(':').nth(1))?
        .trim();
    let (whole, frac) = mhz.split_once('.').unwrap_or((mhz, "0"));
    let frac = format!("{frac:0<3}");
    Some(whole.parse::<u64>().ok()? * 1000 + frac[..3].parse::<u64>().ok()?)
}

/// What `/proc/<pid>` says of a process: when it started (clock ticks after boot) and whether
/// it has exited: a zombie (or dead) with no thread left but that one. A thread group's leader
/// reads as a zombie as soon as its own thread ends, while its other threads may still hold the
/// process's open files; each thread leaves `/proc/<pid>/task` only after letting go of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcessStat {
    started: u64,
    exited: bool,
}

/// `/proc/<pid>/stat` read, or `None` when there is no such process.
fn process_stat(pid: i32) -> Option<ProcessStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields are counted after
    // its last `)`, from field 3 (the state); the start time is field 22.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
    Some(ProcessStat {
        started: fields.get(22 - 3)?.parse().ok()?,
        exited: matches!(state, 'Z' | 'X') && threads <= 1,
    })
}

#[cfg(test)]
mod tests {
    /// A running process reads as started and not exited, the same start time each time; once
    /// it has exited (a zombie, not yet reaped) it reads as exited with that start time; reaped,
    /// it reads as nothing. (This process itself, several threads, is running.)
    #[test]
    fn process_stat_tells_a_running_process_from_an_exited_one() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let running = super::process_stat(pid).expect("the child is there");
        assert!(!running.exited);
        assert!(running.started > 0);
        assert_eq!(super::process_stat(pid), Some(running));
        child.kill().unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let exited = loop {
            let stat = super::process_stat(pid).expect("a zombie until reaped");
            if stat.exited || std::time::Instant::now() > until {
                break stat;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(
            exited,
            super::ProcessStat {
                started: running.started,
                exited: true
            }
        );
        child.wait().unwrap();
        assert_eq!(super::process_stat(pid), None);
        assert_eq!(super::process_stat(0), None);
        let own = super::process_stat(i32::try_from(std::process::id()).unwrap());
        assert!(own.is_some_and(|own| !own.exited));
    }

    /// A thread group whose leader's thread has ended while another thread runs on reads as a
    /// zombie in `/proc/<pid>/stat` yet has not exited; killed, it has.
    #[test]
    fn a_zombie_leader_with_a_thread_left_has_not_exited() {
        let script = "import ctypes, threading, time\n\
                      threading.Thread(target=time.sleep, args=(30,)).start()\n\
                      time.sleep(0.2)\n\
                      ctypes.CDLL(None).pthread_exit(None)\n";
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let leader_ended = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !leader_ended() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(leader_ended(), "the leader's thread ended");
        let stat = super::process_stat(pid).expect("the group is there");
        assert!(!stat.exited, "a thread is left: {stat:?}");
        child.kill().unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while super::process_stat(pid).is_some_and(|stat| !stat.exited)
            && std::time::Instant::now() < until
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(super::process_stat(pid).is_some_and(|stat| stat.exited));
        child.wait().unwrap();
    }

    #[test]
    fn qemus_under_finds_a_process_by_its_vm_directory_and_not_a_zombie() {
        let root = tempfile::tempdir().unwrap();
        let vm_dir = root.path().join("vms").join("vm-1");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("TMPDIR", &vm_dir)
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        // The child shows its environment once it has exec'd `sleep`, a moment after the spawn.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut found = super::qemus_under(&root.path().join("vms"));
        while found.iter().all(|q| q.pid != pid) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
            found = super::qemus_under(&root.path().join("vms"));
        }
        assert!(
            found.contains(&super::RunningQemu {
                pid,
                vm_dir: vm_dir.clone()
            }),
            "{found:?}"
        );
        // Not below another directory, nor below the VM's own (its TMPDIR is the directory).
        assert!(super::qemus_under(&root.path().join("other"))
            .iter()
            .all(|q| q.pid != pid));
        assert!(super::qemus_under(&vm_dir).iter().all(|q| q.pid != pid));
        child.kill().unwrap();
        // Killed and not yet reaped: a zombie, no longer running.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while super::qemus_under(&root.path().join("vms"))
            .iter()
            .any(|q| q.pid == pid)
        {
            assert!(
                std::time::Instant::now() < until,
                "the killed process still counts"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.wait().unwrap();
    }

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn config(accel: Accel) -> VmConfig {
        let image = VmImage {
            kernel: "/img/vmlinux".into(),
            initramfs: "/img/initramfs".into(),
            rootfs: "/img/rootfs.ext4".into(),
            kernel_release: "6.1.0-test".into(),
            digest: "0".repeat(64),
        };
        VmConfig {
            accel,
            ..VmConfig::new(image, "/run/vms", "t")
        }
    }

    fn kernel_line(args: &[String]) -> &str {
        let at = args.iter().position(|a| a == "-append").expect("-append");
        &args[at + 1]
    }

    #[test]
    fn qemu_runs_under_its_seccomp_sandbox_with_every_deny() {
        let dropping = RunAs::Ids {
            uid: 2_000_000_001,
            gid: 2_000_000_001,
        };
        for accel in [Accel::Tcg, Accel::Kvm] {
            for (run_as, elevate, drop) in [
                (RunAs::Invoker, "deny", None),
                (dropping, "allow", Some("user=2000000001:2000000001")),
            ] {
                let args = VmConfig {
                    run_as,
                    ..config(accel)
                }
                .qemu_args(None, Spelling::RunWith);
                let at = args.iter().position(|a| a == "-sandbox").expect("-sandbox");
                assert_eq!(
                    args[at + 1],
                    format!(
                        "on,obsolete=deny,elevateprivileges={elevate},spawn=deny,resourcecontrol=deny"
                    )
                );
                let at = args.iter().position(|a| a == "-run-with");
                assert_eq!(at.map(|at| args[at + 1].as_str()), drop);
            }
        }
    }

    #[test]
    fn the_root_is_the_overlay_in_the_vms_directory_and_never_the_base() {
        let args = config(Accel::Tcg).qemu_args(None, Spelling::RunWith);
        let at = args.iter().position(|a| a == "-drive").expect("-drive");
        assert_eq!(
            args[at + 1],
            "id=root,file=/run/vms/t/root.qcow2,format=qcow2,if=none,file.auto-read-only=off"
        );
        assert!(!args
            .iter()
            .any(|a| a.contains("rootfs.ext4") || a.contains("snapshot=")));
    }

    #[test]
    fn under_tcg_the_guest_clock_is_the_calibrated_tsc() {
        let args = config(Accel::Tcg).qemu_args(Some(2_300_000), Spelling::RunWith);
        let line = kernel_line(&args);
        assert!(line.contains(" tsc_early_khz=2300000 "), "{line}");
        assert!(line.split(' ').any(|w| w == "tsc=reliable"), "{line}");
        let unknown = config(Accel::Tcg).qemu_args(None, Spelling::RunWith);
        assert!(
            !kernel_line(&unknown).contains("tsc"),
            "no frequency, no TSC words"
        );
    }

    #[test]
    fn under_kvm_the_guest_keeps_its_own_clock_choice() {
        let args = config(Accel::Kvm).qemu_args(Some(2_300_000), Spelling::RunWith);
        assert!(
            !kernel_line(&args).contains("tsc"),
            "{}",
            kernel_line(&args)
        );
    }

    #[test]
    fn every_agent_port_is_a_socket_chardev_on_its_own_descriptor_and_named_for_the_agent() {
        let mut four = config(Accel::Tcg);
        four.agent_ports = 4;
        let args = four.qemu_args(None, Spelling::RunWith);
        for index in 0..4u32 {
            let chardev = format!("socket,id=agent{index},fd={},server=on,wait=off", 4 + index);
            assert!(args.contains(&chardev), "{chardev} in {args:?}");
            let port = format!(
                "virtserialport,bus=vser.0,chardev=agent{index},name={}",
                vm_agent::proto::port_name(index)
            );
            assert!(args.contains(&port), "{port} in {args:?}");
        }
        assert!(!args.iter().any(|a| a.contains("id=agent4")));
        assert!(args.contains(&"socket,id=qmp,fd=3,server=on,wait=off".to_owned()));
        let line = kernel_line(&args);
        assert_eq!(vm_agent::proto::ports_from_cmdline(line), 4, "{line}");
        assert!(args.contains(&"socket,id=agent0,fd=4,server=on,wait=off".to_owned()));
        let one = config(Accel::Tcg).qemu_args(None, Spelling::RunWith);
        assert_eq!(
            vm_agent::proto::ports_from_cmdline(kernel_line(&one)),
            DEFAULT_AGENT_PORTS
        );
    }

    /// A stand-in for a VM's QEMU in `dir` (a process whose command line and environment
    /// make `Vm::attach` take it for the directory's QEMU) with `ports` agent ports.
    fn fake_vm(dir: &Path, ports: u32) -> (std::process::Child, Vm) {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let child = std::process::Command::new("sleep")
            .arg0(format!("sbx-vm-{name}"))
            .arg("60")
            .env("TMPDIR", dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let state = serde_json::json!({"pid": child.id(), "accel": "tcg", "agent_ports": ports});
        std::fs::write(dir.join("vm.json"), state.to_string()).unwrap();
        // Until the child has exec'd, its command line and environment are this process's.
        let deadline = Instant::now() + Duration::from_secs(10);
        let vm = loop {
            match Vm::attach(dir) {
                Ok(vm) => break vm,
                Err(error) if Instant::now() > deadline => panic!("the stand-in: {error}"),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        assert_eq!(vm.agent_ports(), ports);
        (child, vm)
    }

    /// Answers one handshake on `socket` the way the agent does, then keeps the connection
    /// open until the client closes it.
    fn fake_agent(socket: PathBuf) -> tokio::task::JoinHandle<()> {
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let mut decoder = vm_agent::proto::FrameDecoder::<vm_agent::proto::HostMsg>::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    decoder.push(&buf[..n]);
                    if let Ok(Some((_, vm_agent::proto::HostMsg::Hello { nonce }))) =
                        decoder.next_message()
                    {
                        let ack = vm_agent::proto::GuestMsg::HelloAck { nonce };
                        let _ = stream.write_all(&vm_agent::proto::encode(0, &ack)).await;
                    }
                }
            }
        })
    }

    #[tokio::test]
    async fn a_connection_takes_a_free_port_and_past_the_wait_every_port_held_is_busy() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("vm-test");
        std::fs::create_dir(&dir).unwrap();
        let (mut child, vm) = fake_vm(&dir, 2);
        let agents: Vec<_> = (0..2)
            .map(|i| fake_agent(ports::socket_path(&dir, i)))
            .collect();

        let first = vm.agent(Duration::from_secs(5)).await.unwrap();
        let second = vm.agent(Duration::from_secs(5)).await.unwrap();
        assert_eq!((first.port(), second.port()), (Some(0), Some(1)));
        let started = Instant::now();
        let busy = vm.agent(Duration::from_millis(300)).await.unwrap_err();
        assert!(
            matches!(busy, VmError::PortsBusy { ports: 2, .. }),
            "{busy:?}"
        );
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
            "a bounded wait: {waited:?}"
        );

        // A weak reference keeps nothing; the port goes with the last clone.
        let weak = second.downgrade();
        let clone = weak.upgrade().expect("alive while a clone is");
        drop(second);
        assert!(weak.upgrade().is_some());
        // Let go of during the wait: the waiting connection takes it.
        let waiting = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(clone);
        });
        let third = vm.agent(Duration::from_secs(5)).await.unwrap();
        assert_eq!(third.port(), Some(1));
        assert!(weak.upgrade().is_none(), "the old connection is gone");
        waiting.await.unwrap();
        drop((first, third));
        for agent in agents {
            agent.abort();
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
