//! The microVM guest agent and its wire protocol.
//!
//! Scope: [`proto`] is the framed protocol the host-side driver (`qemu-vm`) and the guest agent
//! both speak: length-prefixed, versioned, bounded frames and the typed messages they carry,
//! encoded and decoded without any I/O, so both sides (and the fuzz targets) share one decoder.
//! The agent itself (the `vm-agent` binary, Linux only) is the guest's `/init`: it loads the
//! virtio modules, mounts the root image, and serves the protocol on a named virtio-serial port
//! (`docs/vm.md`).
//!
//! Not here: anything about QEMU, images or sandboxes; the host-side client lives in `qemu-vm`.
//!
//! Threat model: each side treats the other's bytes as untrusted. A frame is bounded before its
//! payload is buffered ([`proto::MAX_PAYLOAD`]), every length inside a payload is checked
//! against what remains, and a malformed frame is a typed [`proto::ProtoError`], never a panic.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod proto;

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
