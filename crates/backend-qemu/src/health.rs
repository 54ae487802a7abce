//! The backend's health report for an operator (`sandboxctl doctor`), before any VM boots: the
//! QEMU program answers, and the VM image loads. The accelerator, and the rung it gives, is what
//! [`QemuBackend::connect`](crate::QemuBackend::connect) probes by booting, so a host reports it
//! from the connected backend ([`QemuBackend::accelerator`](crate::QemuBackend::accelerator)).

use std::time::Duration;

use exec_wrapper::{BoundedCommand, ExitKind};
use qemu_vm::{VmImage, QEMU_PROGRAM};
use sandbox_core::HealthCheck;

use crate::config::QemuConfig;

/// How long `qemu-system-x86_64 --version` may take, and how much it may print: it prints two
/// lines at once on a working host.
const VERSION_DEADLINE: Duration = Duration::from_secs(10);
const VERSION_OUTPUT_CAP: usize = 16 * 1024;

/// What this host needs before the backend can connect, checked in order, each a
/// [`HealthCheck`]: `qemu.program` (the QEMU program on `PATH` runs and reports its version) and
/// `qemu.image` (`config.image_dir` holds a VM image that loads). The image is not checked when
/// the program does not run. Reads only; changes nothing.
///
/// # Cancel safety
/// Dropping the future kills and reaps the version query in flight.
pub async fn health_checks(config: &QemuConfig) -> Vec<HealthCheck> {
    let mut checks = vec![program_check().await];
    if checks.iter().any(HealthCheck::failed) {
        return checks;
    }
    checks.push(match VmImage::load(&config.image_dir) {
        Ok(image) => HealthCheck::pass(
            "qemu.image",
            format!(
                "{} (digest {}, kernel {})",
                config.image_dir.display(),
                image.digest,
                image.kernel_release
            ),
        ),
        Err(e) => HealthCheck::fail("qemu.image", e.to_string(), "sandboxctl images build vm"),
    });
    checks
}

async fn program_check() -> HealthCheck {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let ran = BoundedCommand::new(QEMU_PROGRAM, VERSION_DEADLINE)
        .arg("--version")
        .env("PATH", path)
        .output_budget(VERSION_OUTPUT_CAP)
        .run()
        .await;
    match ran {
        Ok(out) if out.status == ExitKind::Exited(0) => {
            let text = String::from_utf8_lossy(&out.stdout);
            let version = text.lines().next().unwrap_or_default().trim().to_owned();
            HealthCheck::pass("qemu.program", version)
        }
        Ok(out) => HealthCheck::fail(
            "qemu.program",
            format!("{QEMU_PROGRAM} --version ended {:?}", out.status),
            "apt-get install qemu-system-x86",
        ),
        Err(e) => HealthCheck::fail(
            "qemu.program",
            format!("{QEMU_PROGRAM} does not run: {e}"),
            "apt-get install qemu-system-x86",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The image check reads the configured directory: an empty one fails and names the command
    /// that builds the image. (The program check needs QEMU installed; the live suites run it.)
    #[tokio::test]
    async fn a_missing_image_fails_with_the_command_that_builds_it() {
        let empty = tempfile::tempdir().unwrap();
        let config = QemuConfig {
            image_dir: empty.path().to_path_buf(),
            ..QemuConfig::default()
        };
        let checks = health_checks(&config).await;
        let program = &checks[0];
        assert_eq!(program.id, "qemu.program");
        if program.failed() {
            // No QEMU on this host: the image is not checked, as documented.
            assert_eq!(checks.len(), 1);
            assert_eq!(program.fix, "apt-get install qemu-system-x86");
            return;
        }
        assert!(program.detail.contains("QEMU"), "{}", program.detail);
        let image = &checks[1];
        assert_eq!(image.id, "qemu.image");
        assert!(image.failed());
        assert_eq!(image.fix, "sandboxctl images build vm");
    }
}
