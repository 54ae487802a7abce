//! The microVM sandbox backend over QEMU: one VM per (key, kind), booted from the local VM image
//! (`docs/vm.md`) and driven through the typed `qemu-vm` driver.
//!
//! Scope: [`QemuBackend`] implements the core's [`SandboxBackend`](sandbox_core::SandboxBackend).
//! Commands and files go through the guest agent (no shell wrapper: the agent takes raw argv
//! and reports stdout, stderr and the exit apart); the core's guest-path rules are applied on the
//! host before any file request. Each VM has a directory under the state directory holding its
//! record, a lock file and the VM's own directory, so another process finds it, reuses it warm
//! and disposes of it.
//!
//! Rung: `microvm` when the accelerator probe's KVM boot reaches the agent; under QEMU's
//! emulator (TCG), which QEMU does not treat as a security boundary, the backend is refused
//! unless `allow_emulation` is set, and then declares `container`.
//!
//! # Threat model
//!
//! The guest is hostile: everything it sends is decoded by the driver's bounded decoder, and
//! every call has a deadline and an output cap. A VM has no network device (egress `closed`).
//! Commands run as root inside the VM: the VM is the boundary, not a user inside it.
//!
//! # Faults
//!
//! A VM whose QEMU is gone (killed, or exited on a guest kernel panic) is
//! [`SandboxGone`](sandbox_core::SandboxError::SandboxGone) and the next acquire replaces it. A VM
//! that runs but cannot serve (its guest stopped by QEMU on a failed disk write, as when the host
//! disk under its overlay is full; its agent silent past a command's bound or a file call's
//! deadline) is retired: its record says why, its QEMU is killed, the call fails with a typed
//! error ([`Timeout`](sandbox_core::SandboxError::Timeout) with `GuestCleanup::Retired`,
//! `EngineTimeout`, `Engine`), and the next acquire replaces it. A call waiting on a silent guest
//! checks the VM every 2 s, so a dead or stopped VM fails it at once.
//!
//! # What it does not do yet
//!
//! - Egress allowlists and the call isolation scope.
#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg(target_os = "linux")]

mod backend;
mod baseline;
mod config;
mod egress;
mod fault;
mod handle;
mod health;
mod layout;
mod pool;

pub use backend::{QemuBackend, TRANSFER_CEILING};
pub use config::{
    default_state_dir, QemuConfig, QemuEgress, DEFAULT_CPUS, DEFAULT_MAX_BOOTING,
    DEFAULT_MEMORY_MIB, DEFAULT_NAME_PREFIX, MAX_POOL,
};
pub use handle::QemuSandbox;
pub use health::health_checks;

/// The backend's name.
pub const BACKEND_NAME: &str = "qemu";

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
