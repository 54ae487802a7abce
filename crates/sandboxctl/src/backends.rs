//! The backends, as every host binary selects and builds them (`sandbox-backends`). Commands see
//! only `Arc<dyn SandboxBackend>`, so a new backend joins there without changing any command.

#[cfg(target_os = "linux")]
pub(crate) use sandbox_backends::qemu_config;
pub(crate) use sandbox_backends::{
    build_images, connect, connect_sbx, docker_config, ensure_default_image, gated_router,
    host_guard, sbx_config,
};
