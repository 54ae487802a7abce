//! The contract between AI agent hosts and sandbox backends.
//!
//! `sandbox-core` owns the vocabulary every backend and host shares (isolation rungs, egress modes,
//! capabilities, keys, specs, exec requests, outputs and streams, disposal reports), the [`Sandbox`] and
//! [`SandboxBackend`] traits, the [`Router`] that refuses any backend below the host's isolation floor,
//! and the pure helpers both backends share: guest-path confinement, storage-base planning, name and label
//! digests, and the host-hygiene lists (secret-looking environment names, credential paths).
//!
//! It does **no I/O**: it never starts a process, opens a file or talks to an engine. Backends do that.
//!
//! # Example
//!
//! ```
//! use sandbox_core::{Capability, Egress, Isolation, SandboxSpec};
//!
//! let spec = SandboxSpec::builder("python")
//!     .image("debian:bookworm")
//!     .require(Capability::FilesOut)
//!     .build()
//!     .expect("a valid spec");
//! assert_eq!(spec.egress(), Egress::Closed);
//! assert!(spec.required_capabilities().contains(&Capability::Exec));
//! assert!(Isolation::Microvm.meets_floor(Some(Isolation::Container)));
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod capability;
mod credential_paths;
mod declarations;
mod disposal;
mod egress;
mod entry;
mod error;
mod exec;
mod exec_stream;
mod guest_path;
mod hygiene;
mod isolation;
mod key;
mod limits;
mod naming;
mod router;
mod spec;
mod storage_base;
#[cfg(feature = "testing")]
pub mod testing;
mod wire;

pub use backend::{Sandbox, SandboxBackend, SandboxState, SandboxSummary};
pub use capability::{default_capabilities, needs_storage_base, Capability};
pub use credential_paths::{
    check_source, check_workspace_root, credential_paths, passwd_homes, refuses_source,
    system_credential_paths, CredentialGuard, CredentialPath, SystemCredentialPath,
};
pub use declarations::BackendDeclarations;
pub use disposal::{fold, DisposalCode, DisposalFailure, DisposeSelector, ScopePurge};
pub use egress::{
    validate_host, validate_method, validate_path, Egress, EgressEntry, EgressRule, MAX_HOST_LEN,
};
pub use entry::{EntryKind, SandboxEntry};
pub use error::{BoxError, ErrorKind, GuestCleanup, ParseError, Result, SandboxError};
pub use exec::{
    Command, ExecEnv, ExecOutput, ExecRequest, DEFAULT_MAX_OUTPUT_BYTES, WORKDIR_UNUSABLE_EXIT,
};
pub use exec_stream::{
    ExecChunk, ExecEvent, ExecExit, ExecStdin, ExecStream, ExecStreamSender, SendRefused,
    MAX_CHUNK_BYTES, STREAM_BUFFER_CHUNKS,
};
pub use guest_path::{
    ancestors as guest_path_ancestors, check_delete, check_delete_async, check_list,
    check_list_async, check_read, check_read_async, check_write, check_write_async, confine,
    join as guest_path_join, norm as guest_path_norm, refuse_linked_ancestors,
    refuse_linked_ancestors_async, relative_to as guest_path_relative_to, resolve_wd,
    MAX_CONCURRENT_STATS, MAX_GUEST_PATH_BYTES, MAX_GUEST_PATH_COMPONENTS,
};
pub use hygiene::is_secret_name;
pub use isolation::{Isolation, IsolationScope, OsFamily};
pub use key::SandboxKey;
pub use limits::{SandboxLimits, TransferLimits, DEFAULT_TRANSFER_LIMITS};
pub use naming::{
    decode_docker_key_label, docker_container_name, docker_key_label, docker_name_preimage,
    is_digest_label, label_value, python_json_list, sbx_conversation_prefix, sbx_digest,
    sbx_key_prefix, sbx_sandbox_name, NamePrefix, DOCKER_NAME_PREFIX, LABEL_AGENT, LABEL_CALL,
    LABEL_EGRESS_V1, LABEL_KEY_V1, LABEL_KIND, LABEL_ROLE, LABEL_SCOPE, LABEL_THREAD,
    LABEL_USER_PREFIX, LABEL_WORK_DIR_V1,
};
pub use router::{
    FailedCleanup, Router, RouterConfig, Selection, UncleanTarget, DEFAULT_CLEANUP_TIMEOUT,
};
pub use spec::{SandboxSpec, SandboxSpecBuilder, DEFAULT_WORK_DIR};
pub use storage_base::{plan_storage_base, storage_base_directories, validate_base};
