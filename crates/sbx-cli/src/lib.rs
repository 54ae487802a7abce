//! # sbx-cli
//!
//! A typed async driver for the `sbx` commands (Docker Sandboxes' CLI) a microVM backend uses:
//! `version`, `settings get`, `mcp ls`, `ls`, `create`, `exec` (default user, `-u root`, `-i`
//! with stdin), `rm`, and the read-only `secret ls`, `policy ls` and `policy check network`.
//!
//! - **One method per command** on [`SbxCli`], with typed arguments ([`SbxName`] holds only names
//!   `sbx` accepts, [`MemorySize`], [`CreateRequest`], [`ExecRequest`]) and typed, parsed output
//!   ([`LsRow`], [`McpServer`], [`PolicyList`], [`PolicyCheck`], [`SecretList`]).
//! - **Every call is bounded**: it goes through [`bounded_process::run_bounded`] with a deadline
//!   (60 s by default, `create` 600 s, `exec` the caller's), an output budget (64 KiB for small
//!   calls, 8 MiB for listings, 1 MiB for `create`, the caller's for `exec`), stdin closed unless
//!   `exec -i` carries bytes, and the process killed and reaped on every early exit. There is no
//!   unbounded `sbx` call: the daemon can wedge.
//! - **Explicit environments**: management calls get the management environment (by default a
//!   snapshot of this process's environment); `exec` calls, which start guest programs, get it
//!   through a caller-supplied filter, since `sbx` may forward its client environment into the
//!   VM. Callers pass the project's secret-name denylist as that filter. `SBX_NO_TELEMETRY=1`
//!   is added to both unless turned off.
//! - **Classified failures** ([`Error`], [`classify`]): login lapsed, daemon fault, template
//!   cannot start, already exists, not found, timeout, output limit, spawn failure naming the
//!   path, failed with the stderr tail, malformed output. Each message names its fix
//!   (`sbx login`, `sbx daemon restart`, …).
//! - **Strict shapes**: unknown JSON fields are ignored, but output of the wrong shape is
//!   [`Error::Malformed`], never "nothing there" (an unreadable `ls` is not "no sandboxes").
//!
//! ## Example
//!
//! Drive a stand-in `sbx` (here a two-line script) and list its sandboxes:
//!
//! ```
//! # #[cfg(unix)]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::os::unix::fs::PermissionsExt as _;
//! use sbx_cli::{Error, SbxCli, SbxName};
//!
//! let dir = tempfile::tempdir()?;
//! let fake_sbx = dir.path().join("sbx");
//! std::fs::write(
//!     &fake_sbx,
//!     "#!/bin/sh\n\
//!      [ \"$1\" = ls ] && { echo '[{\"name\":\"maf-1\",\"id\":\"42\",\"workspaces\":[\"/w\"]}]'; exit 0; }\n\
//!      echo 'ERROR: You are not logged in. Run sbx login to sign in.' >&2; exit 1\n",
//! )?;
//! std::fs::set_permissions(&fake_sbx, std::fs::Permissions::from_mode(0o755))?;
//!
//! // Names holding TOKEN never reach `exec` calls (a stand-in for the real denylist).
//! let sbx = SbxCli::builder(&fake_sbx, |name| !name.to_string_lossy().contains("TOKEN"))
//!     .management_env([("PATH", "/usr/bin:/bin")])
//!     .build()?;
//!
//! let rows = sbx.ls().await?;
//! assert_eq!(rows[0].name, "maf-1");
//! assert_eq!(rows[0].id.as_deref(), Some("42"));
//!
//! // Any other command fails here, classified from its stderr.
//! let err = sbx.rm(&SbxName::new("maf-1")?).await.unwrap_err();
//! assert!(matches!(err, Error::LoginRequired { .. }));
//! assert!(err.to_string().contains("run `sbx login`"));
//! # Ok(())
//! # }
//! # #[cfg(not(unix))]
//! # fn main() {}
//! ```
//!
//! ## Platforms
//!
//! Paths and arguments are `PathBuf`/`OsString` throughout and the crate uses no platform API of
//! its own. On Windows, an `sbx_path` without an extension gets `.exe` (`sbx` starts `sbx.exe`,
//! searched on the management environment's `PATH` when it is a bare name); a path with any
//! extension is used as given.
//!
//! ## Threat model
//!
//! `sbx` and its daemon are trusted to do what they say, but their output is treated as
//! untrusted bytes: every parser is total (no input panics it; a property test feeds it arbitrary
//! bytes and JSON), every call is bounded in time and output, and quoted stderr is a 2000
//! character tail. Arguments cannot smuggle options: names are [`SbxName`]s, free-text words
//! (setting keys, hosts, templates) and the program of an `exec` may not start with `-`, empty
//! arguments and NUL bytes are refused before anything runs. The management environment never
//! reaches an `exec` call unfiltered. A child's environment is exactly the configured one (by
//! default a snapshot taken when the driver is built), never what this process holds later.
//!
//! ## What this crate does not do
//!
//! - It knows nothing of keys, specs, sandboxes' contents or the workspace layout: it passes
//!   names and paths it is given. Ownership, records and retries are its callers'.
//! - It never runs `sbx login`, a daemon probe, or any setting change: login and daemon faults
//!   are read from whichever call failed.
//! - It does not interpret `exec` results: [`SbxCli::exec`] returns the raw output, whose exit
//!   status may be the guest command's or `sbx`'s own; the exec wrapper's nonce protocol tells
//!   them apart ([`SbxCli::exec_checked`] is for probes whose non-zero status is `sbx`'s).
//! - It does not end guest commands whose client was killed: dropping an `exec` future kills
//!   only the local `sbx` client.
//! - It holds no secret-name denylist of its own: the guest filter is the caller's.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod driver;
mod error;
mod name;
mod shapes;

pub use bounded_process::{ExitKind, OutputSink, RunOutput, Stream};
pub use driver::{
    CreateRequest, ExecRequest, ExecUser, Removal, SbxCli, SbxCliBuilder, CREATE_OUTPUT_BUDGET,
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CREATE_TIMEOUT, DEFAULT_EXEC_OUTPUT_BUDGET,
    LISTING_OUTPUT_BUDGET, NO_TELEMETRY_VAR, SMALL_OUTPUT_BUDGET,
};
pub use error::{classify, classify_output, failure_detail, Call, Error, STDERR_TAIL_CHARS};
pub use name::{MemorySize, SbxName, MAX_NAME_LEN};
pub use shapes::{
    parse_ls, parse_mcp_ls, parse_policy_check, parse_policy_ls, parse_secret_ls, CustomSecret,
    LsRow, McpServer, PolicyCheck, PolicyList, PolicyRule, SecretEntry, SecretList,
};
/// The clock deadlines are given on (tokio's, as the runner uses).
pub use tokio::time::Instant;

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
