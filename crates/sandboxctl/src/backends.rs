//! The backends, as every host binary selects and builds them (`sandbox-backends`). Commands see
//! only `Arc<dyn SandboxBackend>`, so a new backend joins there without changing any command.

pub(crate) use sandbox_backends::{
    build_images, connect, connect_observed, ensure_default_image, gated_router, health, host_guard,
};
