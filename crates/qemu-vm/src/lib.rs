//! A typed, bounded async driver for microVMs under QEMU (`docs/vm.md`).
//!
//! Scope: the VM image ([`ImageRecipe`], [`VmImage`]), one VM's QEMU process and its QMP
//! monitor ([`Vm`], [`VmConfig`]), the guest agent's requests as typed async calls
//! ([`AgentClient`]), and the choice of accelerator by a test boot ([`probe_accel`]). Every
//! call has a deadline and every answer from the guest or QEMU is bounded.
//!
//! Not here: sandboxes, keys, limits policy: a backend builds those on top (a VM per sandbox,
//! found again from another process by its directory with [`Vm::attach`]).
//!
//! Threat model: the guest is hostile. Its bytes reach the host only through the agent
//! channel and are decoded by `vm_agent::proto`'s bounded decoder; a malformed frame closes
//! the channel with a typed error. QEMU is trusted as a process but its monitor's lines are
//! capped all the same.
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![cfg(target_os = "linux")]

mod accel;
mod client;
mod cpio;
mod disk;
mod error;
mod image;
mod machine;
mod ports;
mod qmp;
mod run_as;
mod snapshot;

pub use accel::{probe_accel, AccelReport};
pub use client::{
    AgentClient, Exec, ExecEvent, ExecOutput, RunLimits, StdinWriter, WeakAgentClient,
    HANDSHAKE_SCAN_CAP, LIST_ENTRY_OVERHEAD, MAX_LIST_BYTES, MAX_LIST_ENTRIES, RENEW_ENTROPY,
};
pub use disk::{QEMU_IMG_PROGRAM, ROOT_OVERLAY};
pub use error::VmError;
pub use image::{
    default_image_dir, given_image_dir, is_static_elf, module_load_order, user_cache_dir,
    GuestProgram, ImageRecipe, Progress, VmImage, AGENT_RUSTFLAGS, AGENT_TARGET, IMAGE_VAR,
    MANIFEST, MODULES,
};
pub use machine::{
    host_tsc_khz, qemus_under, Accel, RunningQemu, Vm, VmConfig, VmStatus, QEMU_PROGRAM,
};
pub use ports::DEFAULT_AGENT_PORTS;
pub use run_as::{RunAs, Spelling, FIRST_VM_ID, VM_IDS};
pub use snapshot::{Snapshot, SNAPSHOT_DISK, SNAPSHOT_MANIFEST, SNAPSHOT_MEMORY};
pub use vm_agent::proto::MAX_PORTS as MAX_AGENT_PORTS;
pub use vm_agent::proto::{Entry, ErrorCode, ExecRequest, ExitStatus, FileKind, Stat};

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
