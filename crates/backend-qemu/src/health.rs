//! The backend's health report for an operator (`sandboxctl doctor`), before any VM boots: the
//! QEMU program and `qemu-img` (which makes every VM's disk overlay) answer, and the VM image
//! loads. The accelerator, and the rung it gives, is what
//! [`QemuBackend::connect`](crate::QemuBackend::connect) probes by booting, so a host reports it
//! from the connected backend ([`QemuBackend::accelerator`](crate::QemuBackend::accelerator)).

use std::time::Duration;

use bounded_process::{BoundedCommand, ExitKind};
use qemu_vm::{VmImage, QEMU_IMG_PROGRAM, QEMU_PROGRAM};
use sandbox_core::HealthCheck;

use crate::config::QemuConfig;

/// How long `qemu-system-x86_64 --version` (or `qemu-img --version`) may take, and how much it
/// may print: it prints two lines at once on a working host.
const VERSION_DEADLINE: Duration = Duration::from_secs(10);
const VERSION_OUTPUT_CAP: usize = 16 * 1024;

/// What this host needs before the backend can connect, checked in order, each a
/// [`HealthCheck`]: `qemu.program` (the QEMU program on `PATH` runs and reports its version),
/// `qemu.img` (`qemu-img` on `PATH` runs: it makes each VM's disk overlay) and `qemu.image`
/// (`config.image_dir` holds a VM image that loads). The image is not checked when a program
/// does not run. Reads only; changes nothing.
///
/// # Cancel safety
/// Dropping the future kills and reaps the version query in flight.
pub async fn health_checks(config: &QemuConfig) -> Vec<HealthCheck> {
    let mut checks = vec![
        program_check(
            QEMU_PROGRAM,
            "qemu.program",
            "apt-get install qemu-system-x86",
        )
        .await,
        program_check(QEMU_IMG_PROGRAM, "qemu.img", "apt-get install qemu-utils").await,
    ];
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

/// Whether `program` on `PATH` runs and reports its version: the check `id`, passing with the
/// version's first line, or failing with `fix`.
async fn program_check(program: &str, id: &str, fix: &str) -> HealthCheck {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let ran = BoundedCommand::new(program, VERSION_DEADLINE)
        .arg("--version")
        .env("PATH", path)
        .output_budget(VERSION_OUTPUT_CAP)
        .run()
        .await;
    match ran {
        Ok(out) if out.status == ExitKind::Exited(0) => {
            let text = String::from_utf8_lossy(&out.stdout);
            let version = text.lines().next().unwrap_or_default().trim().to_owned();
            HealthCheck::pass(id, version)
        }
        Ok(out) => HealthCheck::fail(
            id,
            format!("{program} --version ended {:?}", out.status),
            fix,
        ),
        Err(e) => HealthCheck::fail(id, format!("{program} does not run: {e}"), fix),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program that is not on `PATH` fails its check with the fix given, and names itself.
    #[tokio::test]
    async fn a_missing_program_fails_with_its_fix() {
        let check = program_check(
            "no-such-qemu-img-here",
            "qemu.img",
            "apt-get install qemu-utils",
        )
        .await;
        assert!(check.failed());
        assert_eq!(check.id, "qemu.img");
        assert_eq!(check.fix, "apt-get install qemu-utils");
        assert!(
            check.detail.contains("no-such-qemu-img-here"),
            "{}",
            check.detail
        );
    }

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
        let (program, img) = (&checks[0], &checks[1]);
        assert_eq!(program.id, "qemu.program");
        assert_eq!(img.id, "qemu.img");
        if program.failed() || img.failed() {
            // A program missing on this host: the image is not checked, as documented, and
            // the fix names the package.
            assert_eq!(checks.len(), 2);
            if program.failed() {
                assert_eq!(program.fix, "apt-get install qemu-system-x86");
            }
            if img.failed() {
                assert_eq!(img.fix, "apt-get install qemu-utils");
            }
            return;
        }
        assert!(program.detail.contains("QEMU"), "{}", program.detail);
        assert!(img.detail.contains("qemu-img"), "{}", img.detail);
        let image = &checks[2];
        assert_eq!(image.id, "qemu.image");
        assert!(image.failed());
        assert_eq!(image.fix, "sandboxctl images build vm");
    }
}
