//! Shared conformance suites that attack any sandbox backend the same way, against a real engine.
//!
//! The crate knows only the core traits ([`Sandbox`](sandbox_core::Sandbox),
//! [`SandboxBackend`](sandbox_core::SandboxBackend)); a backend's live test module calls it with its own
//! backend. Every probe of the reference suites is kept with its fixture names and bytes, plus the
//! project's own HARDENING probes. A run reports **every** probe: passed, failed with a reason, or
//! skipped because the backend does not declare a capability (a skip in CI is a bug:
//! [`ConformanceReport::assert_all_passed`] refuses it).
//!
//! The root holds what a backend's live test names first ([`run_backend_suites`], [`RunOptions`],
//! [`ConformanceReport`], [`ConformanceError`], the subject types); the rest is grouped in public
//! modules by what it does: [`run`], [`harness`], the suites by what they attack ([`files`],
//! [`commands`], [`sandboxes`], [`network`], [`isolation`]), [`child_process`], and the tables
//! ([`suites`], [`fixtures`]).
//!
//! What it does:
//! - the harness: a [`ConformanceSubject`] with planting seams, [`PosixGuestSubject`] filling them
//!   through the sandbox's own surface, [`harness::ConformancePaths`], suite gates refused before
//!   anything is planted, per-probe capability skips, failures aggregated into one
//!   [`ConformanceError::ConformanceFailure`], and [`harness::refused_with`] with the reference's
//!   exception classes translated to [`harness::Refusal`]s;
//! - the suites: storage base, fresh acquire, instance disposal, FILES_OUT, FILES_IN, EXEC,
//!   FILES_DELETE (and its verdict-free measurement), RECLAIM, SNAPSHOT (reset and fork),
//!   HOST_TOOLS (a run whose command calls the host's tools), POOL (a warm pool, through the
//!   backend's [`sandboxes::PoolHooks`]), REACH, EGRESS (and EGRESS_METHODS, EGRESS_PATHS),
//!   CALL_SCOPE, HARDENING and CONFINEMENT (judged by an engine-side [`isolation::Fingerprint`] the
//!   backend's test module supplies; [`isolation::docker_container_fingerprint`] builds one for a
//!   sandbox that is a Docker container, from `docker` calls the caller runs);
//! - [`run_backend_suites`]: every file and exec suite against one backend, in the required order,
//!   and [`RunOptions::expected_probes`], the exact count it reports;
//! - the acquire-in-child-process protocol of `concurrent-acquires-yield-one`
//!   ([`child_process::print_concurrent_acquires`], [`child_process::child_acquire_line`],
//!   [`child_process::parse_child_acquires`]).
//!
//! What it does not do: it names no backend of this workspace, starts no engine, runs no process and
//! builds no image; it does not port the program-channel suite (out of scope); EGRESS needs URLs the
//! caller serves, so [`run_backend_suites`] does not run it.
//!
//! # Cancel safety and drop
//!
//! Every suite is a future that calls the sandbox one step at a time. Dropping it stops the run between
//! (or inside) calls: nothing is rolled back, so fixtures already planted stay in the sandbox until the
//! caller disposes of it, and a dropped `exec` is cleaned up by the backend's own guarantees, not here.
//! The HTTP server of `network-closed-by-content` stops when its probe ends or is dropped.
//!
//! # Example
//!
//! A backend's live test (compiled, not run here: it needs an engine):
//!
//! ```no_run
//! use conformance::{run_backend_suites, ConformanceError, RunOptions};
//! use sandbox_core::{SandboxBackend, SandboxKey, SandboxSpec};
//!
//! async fn live_suite(backend: &dyn SandboxBackend) -> Result<(), ConformanceError> {
//!     let scope = format!("conformance-{}", std::process::id());
//!     let mut keys = |purpose: &str| SandboxKey::conversation(scope.clone(), purpose, "agent");
//!     let spec = SandboxSpec::builder("conformance").image("maf-sandbox-test:bookworm");
//!     let options = RunOptions {
//!         exec_cleanup_allowance: std::time::Duration::from_secs(15),
//!         ..RunOptions::default()
//!     };
//!     let report = run_backend_suites(backend, &mut keys, spec, options).await?;
//!     println!("{report}");
//!     report.assert_all_passed()
//! }
//! ```
//!
//! The pieces run alone too; the refusal matcher, for instance:
//!
//! ```
//! use conformance::harness::{refused_with, ConformancePaths, Refusal};
//! use sandbox_core::{ErrorKind, SandboxError};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let escape = async { Err::<(), _>(SandboxError::confinement("../x", "outside")) };
//! let error = refused_with(Refusal::Confinement, escape).await.expect("refused as expected");
//! assert_eq!(error.kind(), ErrorKind::Confinement);
//! // Python's OSError is the whole I/O family, never a timeout.
//! assert!(Refusal::AnyIo.accepts(ErrorKind::NotRegularFile));
//! assert!(!Refusal::AnyIo.accepts(ErrorKind::Timeout));
//! # });
//! assert_eq!(ConformancePaths::under("/w").beyond("t"), "../w-outside/t");
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend_run;
mod call_scope;
mod child_acquire;
mod confinement;
mod egress;
mod error;
mod exec;
mod files_delete;
mod files_in;
mod files_out;
mod fingerprint;
pub mod fixtures;
mod hardening;
mod host_tools;
mod lifecycle;
mod paths;
mod pool;
mod probe_kit;
mod reach;
mod reclaim;
mod report;
mod snapshot;
mod storage_base;
mod subject;
mod suite_runner;

pub use backend_run::{run_backend_suites, RunOptions};
pub use error::ConformanceError;
pub use report::ConformanceReport;
pub use subject::{ConformanceSubject, PosixGuestSubject};

/// The whole run: every file and exec suite against one backend in the required order
/// ([`run_backend_suites`]), its options, and the report of every probe.
pub mod run {
    pub use crate::backend_run::{run_backend_suites, RunOptions};
    pub use crate::report::{ConformanceReport, ProbeOutcome, ProbeReport};
}

/// What a suite attacks through and judges with: the subject and its planting seams, the
/// fixture paths, and the refusal matcher with the reference's exception classes.
pub mod harness {
    pub use crate::paths::ConformancePaths;
    pub use crate::subject::{ConformanceSubject, PosixGuestSubject};
    pub use crate::suite_runner::{refused_with, Refusal, RefusalMismatch};
}

/// The file-plane suites: FILES_OUT, FILES_IN, FILES_DELETE (and its verdict-free
/// measurement), REACH and the storage base.
pub mod files {
    pub use crate::files_delete::{assert_files_delete, measure_files_delete};
    pub use crate::files_in::assert_files_in;
    pub use crate::files_out::assert_files_out;
    pub use crate::reach::assert_reach;
    pub use crate::storage_base::assert_storage_base;
}

/// The command suites: EXEC, and HOST_TOOLS (a run whose command calls the host's tools).
pub mod commands {
    pub use crate::exec::assert_exec;
    pub use crate::host_tools::{assert_host_tools, assert_host_tools_complete};
}

/// The suites of a sandbox's life: fresh acquire, instance disposal, CALL_SCOPE, RECLAIM,
/// SNAPSHOT (reset and fork) and POOL, with the hooks the last two take from the backend.
pub mod sandboxes {
    pub use crate::call_scope::assert_call_scope;
    pub use crate::lifecycle::{
        assert_fresh_acquire, assert_instance_disposal, instance_is_listed,
    };
    pub use crate::pool::{assert_pool, PoolHooks, POOL_CONCURRENT_ACQUIRES, POOL_PROCESSES};
    pub use crate::reclaim::assert_reclaim;
    pub use crate::snapshot::{assert_snapshot, SnapshotHooks};
}

/// The network suites: EGRESS (and EGRESS_METHODS, EGRESS_PATHS), against URLs the caller
/// serves.
pub mod network {
    pub use crate::egress::{assert_egress, assert_egress_methods, assert_egress_paths};
}

/// The attacks on the sandbox boundary: HARDENING (with its probes callable alone) and
/// CONFINEMENT, judged by an engine-side [`Fingerprint`](isolation::Fingerprint) the backend's
/// hooks supply.
pub mod isolation {
    pub use crate::confinement::{
        assert_call_leaves_nothing, assert_confinement, confinement_call, expect_residue_caught,
        CallFuture,
    };
    pub use crate::fingerprint::{docker_container_fingerprint, DockerAnswer, Fingerprint};
    pub use crate::hardening::{
        acquire_retrying_busy, assert_a_lost_record_retires, assert_concurrent_acquires_yield_one,
        assert_engine_failure_is_not_an_exit_code, assert_hardening,
        assert_network_closed_by_content, AcquireOutcome, HardeningHooks,
    };
}

/// The acquire-in-child-process protocol of `concurrent-acquires-yield-one`: the child prints
/// its acquires, the parent reads them.
pub mod child_process {
    pub use crate::child_acquire::{
        child_acquire_line, parse_child_acquires, print_concurrent_acquires,
    };
}

/// Each suite's label (the `suite` of its probe reports) and how many probes it reports (its probe
/// table's length), for a caller that checks a report against the tables; and the tables of cases
/// a caller replays ([`HOSTILE_TIMEOUT_CASES`](suites::HOSTILE_TIMEOUT_CASES),
/// [`CONFINEMENT_CALL_SCRIPT`](suites::CONFINEMENT_CALL_SCRIPT)).
pub mod suites {
    pub use crate::backend_run::CLEANUP_SUITE;
    pub use crate::call_scope::{CALL_SCOPE, CALL_SCOPE_PROBES};
    pub use crate::confinement::{CONFINEMENT, CONFINEMENT_CALL_SCRIPT, CONFINEMENT_PROBES};
    pub use crate::egress::{EGRESS, EGRESS_METHODS, EGRESS_PATHS};
    pub use crate::exec::{EXEC, EXEC_PROBES};
    pub use crate::files_delete::{FILES_DELETE, FILES_DELETE_PROBES};
    pub use crate::files_in::{FILES_IN, FILES_IN_PROBES};
    pub use crate::files_out::{FILES_OUT, FILES_OUT_PROBES};
    pub use crate::hardening::{
        GROUP_TIMEOUT_CASES, HARDENING, HARDENING_OWN_SANDBOX_PROBES, HARDENING_SHARED_PROBES,
        HOSTILE_TIMEOUT_CASES, RECORD_REMOVING_CASES,
    };
    pub use crate::host_tools::{HOST_TOOLS, HOST_TOOLS_PROBES};
    pub use crate::lifecycle::{FRESH_ACQUIRE, INSTANCE_DISPOSAL};
    pub use crate::pool::{POOL, POOL_PROBES};
    pub use crate::reach::{REACH, REACH_PROBES};
    pub use crate::reclaim::{RECLAIM, RECLAIM_PROBES};
    pub use crate::snapshot::{SNAPSHOT, SNAPSHOT_PROBES};
    pub use crate::storage_base::{STORAGE_BASE, STORAGE_BASE_STEPS};
}

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
