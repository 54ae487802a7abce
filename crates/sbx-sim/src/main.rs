//! `sbx-sim`: a stand-in for Docker's `sbx` CLI, backed by the Docker engine.
//!
//! It reproduces the **behaviour of the CLI** the sbx backend drives (commands, JSON shapes,
//! exit statuses, error wording, a create that outlives its client, idle stop and restart) and
//! injects the faults real `sbx` shows (a lapsed login, a daemon without its VM backend, a
//! wedged create or exec, odd listing shapes), so the backend and its conformance suites run on
//! any Docker host, without KVM and without a login. It does **not** stand in for the microVM
//! boundary: every sandbox is a container with AppArmor unconfined and a seccomp profile that
//! allows everything but set-uid and set-gid file modes (the exec wrapper needs `unshare --user
//! --mount` and `mount --bind` inside it, which Docker's default profile refuses), every
//! capability dropped but `CAP_SETFCAP`, `no-new-privileges` (no set-uid binary, such as the
//! template's `sudo`, makes the guest root), sharing the host kernel. Commands run as the
//! workspace's owner, and whatever the guest is, no set-uid or set-gid file it makes appears in
//! the host's workspace (`chmod`, `open`, `mknod` and kin with such a mode fail with `EPERM`). `version` says so, and a backend that sees
//! `sbx-sim` there must declare the `container` isolation rung, never `microvm`.
//!
//! State lives in `$SBX_SIM_HOME` (else `$XDG_STATE_HOME/sbx-sim`, else
//! `~/.local/state/sbx-sim`); the engine is the source of truth for which sandboxes exist: the
//! container `sbx-sim-<home>-<name>`, where `<home>` is the first 12 hex digits of the SHA-256
//! of the state directory's absolute path, so two state homes never see each other's sandboxes.
//!
//! Exit statuses: 0 on success; `exec` exits with the command's status; 2 with the usage on
//! stderr for a command line it does not understand; 1 with one `ERROR: …` line on stderr for
//! any operational failure.
//!
//! ```text
//! $ SBX_SIM_HOME=/tmp/sim sbx-sim create shell --name demo --cpus 1 --memory 512m /tmp/ws
//! Created sandbox demo
//! $ SBX_SIM_HOME=/tmp/sim sbx-sim exec demo sh -c 'pwd -P'
//! /tmp/ws
//! $ SBX_SIM_HOME=/tmp/sim sbx-sim rm --force demo
//! Removed sandbox demo
//! ```
//!
//! What it cannot reproduce of real `sbx`: the microVM and its own kernel, virtiofs semantics
//! (ownership mapping, caching, inotify), enforcement of network policy (`policy allow` is only
//! recorded; `--deny-network **` is `--network none`), the MCP gateway, credential injection,
//! and the daemon's own state machine beyond what the faults mimic.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod background;
mod cli;
mod commands;
mod docker;
mod error;
mod faults;
mod state;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let raw: Vec<OsString> = std::env::args_os().collect();
    let cli = match cli::Cli::try_parse_from(&raw) {
        Ok(cli) => cli,
        // Help goes to stdout with 0; everything else is the usage on stderr with 2.
        Err(err) => err.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ERROR: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let after_command = raw.get(2..).unwrap_or_default();
    match runtime.block_on(commands::dispatch(cli, after_command)) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(err) => {
            eprintln!("{}", err.error_line());
            ExitCode::from(1)
        }
    }
}
