//! How the benches of this workspace measure and report, in one copy for every crate's benches.
//!
//! - [`paired`] times our side's and a raw reference's work of one round back to back,
//!   alternating which goes first from round to round, so load from other work on the machine
//!   (a CI run on the same cores) falls on both sides alike; [`round_robin`] does the same for
//!   more than two pieces, [`in_turn`] for work that times itself, and [`measured`] runs the
//!   warm-up and the measured rounds.
//! - [`Metric`] holds the samples of one row and prints and records it against its [`Target`].
//! - [`record_row`] appends a row to `target/bench/rows.jsonl`, which `cargo xtask bench`
//!   clears before a run and gathers into `target/bench/report.json` and `BENCHMARKS.md`.
//!
//! - [`raw_docker`]: the raw `docker` CLI as a reference side, and a container hardened as the
//!   Docker backend's workloads are, for the benches of every backend measured against it.
//!
//! A bench exits through [`exit_with`], non-zero when a pass/fail target was missed.
//!
//! It depends on nothing of ours, so the benches of every layer (a leaf's as well as a
//! backend's) can measure with it; `cargo xtask layering` lets any crate take it as a
//! dev-dependency and none take it otherwise.
#![deny(missing_docs)]
#![deny(unsafe_code)]

mod metric;
pub mod raw_docker;
mod rounds;
mod row;

pub use metric::{Metric, Target};
pub use rounds::{in_turn, measured, paired, round_robin, timed};
pub use row::{median, percentile, record_row, rows_file};

/// Ends the process with the run's verdict: non-zero when any pass/fail target was missed.
pub fn exit_with(passed: bool) -> ! {
    std::process::exit(if passed { 0 } else { 1 })
}

/// The README's example, compiled as a doctest so that it stays true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
