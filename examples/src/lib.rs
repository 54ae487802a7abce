//! Runnable examples of the sandbox library; see `quickstart.rs` and `router.rs` beside this crate.
//!
//! Run them with `cargo run -p examples --example quickstart` (a Docker engine and the local images
//! are needed: `cargo xtask images`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]
