//! # exec-wrapper
//!
//! The guest-side `sh` wrapper protocol both sandbox backends run every command through. The
//! host runs the wrapper's argv with `bounded-process` (or the engine's exec API) and reads what
//! came back with this crate.
//!
//! ## The protocol
//!
//! Each step is a public module, named by what it does: [`encoding`], [`call`], [`wrapper`],
//! [`outcome`], [`kill`], [`init`] and [`tool_probe`]; [`scripts`] holds the script texts. The
//! root keeps the names nearly every caller needs: [`Nonce`] and [`new_nonce`], the end of a
//! call ([`WrapperOutcome`], [`WrapperOutput`]), and [`Error`] and [`Result`].
//!
//! 1. **Encoding.** The working directory and every argv element are raw bytes, sent as `x`
//!    followed by base64 ([`encoding::encode_arg`], [`encoding::encode_invocation`]), or, in the
//!    sbx shape, as `r` followed by the value itself when it is plain text
//!    ([`encoding::encode_arg_plain`], [`encoding::plain_invocation`]). NUL is refused
//!    ([`Error::Nul`]), as is an empty argv ([`Error::EmptyArgv`]), before anything runs.
//! 2. **Per-call names.** A fresh [`Nonce`] ([`new_nonce`]) names the pid file
//!    ([`call::pid_file`]) and cancel file ([`call::cancel_file`]) of this call only.
//! 3. **The wrapper** ([`DOCKER_WRAPPER`](scripts::DOCKER_WRAPPER), run stage only;
//!    [`SBX_WRAPPER`](scripts::SBX_WRAPPER), `bind` / `run` under the `unshare` its argv starts
//!    with) decodes every `x` value (failure: exit 125 with no nonce), enters the working directory
//!    (failure: the `<nonce>-nocwd` line and the shell's message, exit 125, no nonce), prints the
//!    nonce line on stderr, and starts the command with `setsid` in a new session. The command's
//!    first shell writes its pid (the group id) to the pid file, then runs the command only if no
//!    cancel file exists. In the sbx PID-namespace shape
//!    ([`wrapper::sbx_pid_namespace_wrapper_argv`]) there is no pid file: the run stage checks the
//!    cancel file before the nonce line and starts the command with `setsid` directly.
//! 4. **The result** ([`outcome::parse_result`], fed incrementally by [`outcome::NonceSplitter`]
//!    however the chunks cut the line): stderr after the first nonce line is the command's; no
//!    nonce line means the engine, the transport or the wrapper failed, never the command
//!    ([`WrapperOutcome::NoNonce`]); `<nonce>-nocwd` ([`WrapperOutcome::NoWorkingDirectory`]) and
//!    `<nonce>-unmounted` are outcomes of their own.
//! 5. **The kill** ([`KILL_SCRIPT`](scripts::KILL_SCRIPT), run by a second, separate exec,
//!    [`kill::kill_argv`]) creates the cancel file, then reads the pid file and sends SIGKILL to
//!    the recorded group, then polls until no member is left. The exact kills
//!    ([`TREE_KILL_SCRIPT`](scripts::TREE_KILL_SCRIPT),
//!    [`NAMESPACE_KILL_SCRIPT`](scripts::NAMESPACE_KILL_SCRIPT)) find the call's init or PID
//!    namespace by facts the command cannot forge and kill every process in it, falling back to the
//!    group kill; [`kill::KillReport`] says which kill landed. [`kill::KillOutcome::from_exit`]
//!    reads its status; only `Killed` and `NeverStarted` have [`kill::KillOutcome::landed`],
//!    anything else means the sandbox is retired.
//! 6. **The exec init** ([`wrapper::exec_init_argv`], the `sandbox-exec-init` binary, [`init`]):
//!    the Docker init shape's wrapper as one static program an image may carry at
//!    [`wrapper::EXEC_INIT_PATH`], with the same protocol, statuses and kill, two program starts
//!    fewer per call.
//! 7. **The tool probe** ([`tool_probe::tool_probe_argv`], [`tool_probe::read_tool_probe`]) names
//!    every tool the wrapper needs that a guest lacks, before the first wrapper call.
//!
//! ## Platforms
//!
//! The host side (building argv, reading results and kill statuses) builds for Linux, macOS and
//! Windows hosts. The guest side (the wrapper, kill and probe scripts) is POSIX `sh` run inside
//! the guest whatever the host is; the example below runs it with the host's own `sh`, so it is
//! Unix-only. The exec init is Unix-only, Linux to run; its one `unsafe` block is an empty
//! `pre_exec` hook (it makes std fork and exec rather than `posix_spawn`).
//!
//! ## Limits
//!
//! - What a kill reaches depends on the shape ([`kill::KillMode`], docs/wrapper-protocol.md): the
//!   Docker init shape ([`wrapper::docker_init_wrapper_argv`], [`kill::tree_kill_argv`]) kills the
//!   call's whole subreaper tree, the sbx PID-namespace shape
//!   ([`wrapper::sbx_pid_namespace_wrapper_argv`], [`kill::namespace_kill_argv`]) its whole PID
//!   namespace; the group shapes reach the command's own process group only, which a command leaves
//!   with `setsid`, `setpgrp` or a double fork.
//! - A kill that finds nothing after the host saw the nonce line is not "never started" but
//!   [`kill::KillFailure::StartedButUnrecorded`] ([`kill::KillReport::after_start`]): the sandbox
//!   is retired. A command can bring that about on purpose (kill its own init, delete its pid
//!   file), never keep its processes running in a sandbox that is kept.
//! - The nonce authenticates nothing against a hostile guest: a command can print it again or
//!   forge text after it, which only changes its own result. It cannot write before the real
//!   nonce line, so it cannot forge an engine failure, an unmounted workspace or a working
//!   directory that could not be entered.
//! - Orphans of a killed group must be reaped by the guest's init (docker `--init`, sbx's VM
//!   init); zombies left behind read as a surviving member (exit 6, the sandbox is retired).
//!
//! ## What this crate does not do
//!
//! It starts no container or VM, chooses no image, knows no sandbox type, writes no env file
//! and validates no environment names: the backends do, and convert this crate's types into the
//! core contract's. It runs no host process either: the host-side runner, its deadline, budget
//! and process-tree kill are `bounded-process`, whose outcome ([`bounded_process::ExitKind`],
//! [`bounded_process::RunOutput`]) this crate reads. That is its only dependency on another
//! crate of the project.
//!
//! ## Example
//!
//! Run the Docker-shape wrapper with the local `sh`, as a container's `docker exec` would:
//!
//! ```
//! use std::time::Duration;
//! use bounded_process::BoundedCommand;
//! use exec_wrapper::encoding::encode_invocation;
//! use exec_wrapper::outcome::parse_run_output;
//! use exec_wrapper::wrapper::docker_wrapper_argv;
//! use exec_wrapper::{new_nonce, WrapperOutcome};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let nonce = new_nonce()?;
//! let invocation = encode_invocation(b"/", &[b"printf".as_slice(), b"%s|", b"a b", b"\n"])?;
//! let argv = docker_wrapper_argv(&nonce, &invocation);
//! let output = BoundedCommand::new(&argv[0], Duration::from_secs(10))
//!     .args(&argv[1..])
//!     .env("PATH", "/usr/local/bin:/usr/bin:/bin")
//!     .run()
//!     .await?;
//! match parse_run_output(output, &nonce) {
//!     WrapperOutcome::Ran(ran) => {
//!         assert_eq!(ran.status, 0);
//!         assert_eq!(ran.stdout, b"a b|\n|");
//!         assert!(ran.stderr.is_empty());
//!     }
//!     other => panic!("the wrapper did not run the command: {other:?}"),
//! }
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![deny(unsafe_code)]

mod argv_encoding;
mod call_identity;
mod error;
#[cfg(unix)]
mod exec_init;
mod group_kill;
mod nonce_result;
mod nonce_splitter;
pub mod tool_probe;
mod wrapper_scripts;

pub use call_identity::{new_nonce, Nonce};
pub use error::{Error, Result};
pub use nonce_result::{WrapperOutcome, WrapperOutput};

/// Step 1, the encoding: the working directory, argv and env entries as values that cross a `sh`
/// argument or an env file byte-exact (`x` + base64, or `r` + plain text in the sbx shape).
pub mod encoding {
    pub use crate::argv_encoding::{
        decode_arg, encode_arg, encode_arg_plain, encode_env_file, encode_invocation,
        plain_invocation, raw_invocation, EncodedInvocation, RawInvocation,
    };
}

/// Step 2, a call's identity: its [`Nonce`] and the guest files named after it (pid file,
/// cancel file, sbx env file).
pub mod call {
    pub use crate::call_identity::{cancel_file, new_nonce, pid_file, sbx_env_file_name, Nonce};
}

/// Step 3, the wrapper: one argv per shape (Docker group, Docker init, exec init, sbx, sbx PID
/// namespace), the guest paths and markers they use, and the exec init's recorded status.
pub mod wrapper {
    pub use crate::wrapper_scripts::{
        docker_init_wrapper_argv, docker_wrapper_argv, exec_init_argv, init_status_argv,
        recorded_status, sbx_pid_namespace_wrapper_argv, sbx_wrapper_argv, SbxMount,
        DOCKER_INIT_PATH, EXEC_INIT_PATH, RECORDED_STATUS, SCRIPT_NAME, SIGNAL_STATUSES,
        WORKSPACE_MARKER,
    };
}

/// Step 4, the result: a call's output read against its nonce, whole
/// ([`outcome::parse_result`]) or as it streams ([`outcome::NonceSplitter`]).
pub mod outcome {
    pub use crate::nonce_result::{
        nonce_line_seen, parse_result, parse_run_output, WrapperOutcome, WrapperOutput,
        NO_CWD_REASON_BYTES, STDERR_TAIL_BYTES,
    };
    pub use crate::nonce_splitter::{NonceSplitter, StderrPhase};
}

/// Step 5, the kill: the group, tree and namespace kills' argv, the probes that say which kill a
/// guest supports, and the reading of a kill's exit (keep the sandbox or retire it).
pub mod kill {
    pub use crate::group_kill::{
        KillFailure, KillMode, KillOutcome, KillReport, KILL_OUTPUT_BUDGET,
    };
    pub use crate::wrapper_scripts::{
        docker_init_probe_argv, kill_argv, namespace_kill_argv, pid_namespace_probe_argv,
        read_kill_mode_probe, tree_kill_argv,
    };
}

/// Step 6, the exec init's call parsing and, on Linux, the program itself (the
/// `sandbox-exec-init` binary).
#[cfg(unix)]
pub mod init {
    #[cfg(target_os = "linux")]
    pub use crate::exec_init::run;
    pub use crate::exec_init::{
        no_cwd_lines, parse_init_args, spawn_failure, status_file, InitCall, INIT_REFUSED,
    };
}

/// The script texts themselves, for review and snapshot tests: every `*_argv` function passes
/// one of them to `sh -c`, and docs/wrapper-protocol.md explains each line.
pub mod scripts {
    pub use crate::tool_probe::TOOL_PROBE_SCRIPT;
    pub use crate::wrapper_scripts::{
        DOCKER_INIT_WRAPPER, DOCKER_WRAPPER, INIT_STATUS_SCRIPT, KILL_SCRIPT,
        NAMESPACE_KILL_SCRIPT, SBX_WRAPPER, TREE_KILL_SCRIPT,
    };
}

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
