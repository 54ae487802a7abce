//! A VM's disk: the qcow2 overlay the driver makes over the image's raw root, with `qemu-img`.
//!
//! The overlay is a file of the VM's directory that the driver names and owns, not QEMU's
//! unlinked temporary file (`snapshot=on`): a saved VM's disk state is that file, so a restore
//! can find it, and it goes with the directory.
//!
//! Not here: the VM's command line (see [`crate::VmConfig`]).

use std::path::Path;
use std::time::Duration;

use bounded_process::{BoundedCommand, ExitKind};

use crate::error::VmError;

/// The `qemu-img` a [`crate::VmConfig`] runs unless told otherwise, looked up on `PATH`.
pub const QEMU_IMG_PROGRAM: &str = "qemu-img";

/// The name of a VM's root overlay in its directory.
pub const ROOT_OVERLAY: &str = "root.qcow2";

/// How long one `qemu-img create` may take: it writes a header of a few hundred KiB.
const QEMU_IMG_DEADLINE: Duration = Duration::from_secs(30);

/// How much it may print: one line when it works, a line of error when not.
const QEMU_IMG_OUTPUT_CAP: usize = 64 * 1024;

/// A path as one value of a QEMU option list, where a comma separates options and `,,` is a
/// comma of the value.
pub(crate) fn option_value(path: &Path) -> String {
    path.display().to_string().replace(',', ",,")
}

/// The `qemu-img` arguments that make `overlay`, a qcow2 file over the raw `base`.
pub(crate) fn overlay_args(base: &Path, overlay: &Path) -> Vec<std::ffi::OsString> {
    vec![
        "create".into(),
        "-q".into(),
        "-f".into(),
        "qcow2".into(),
        "-b".into(),
        base.as_os_str().to_owned(),
        "-F".into(),
        "raw".into(),
        overlay.as_os_str().to_owned(),
    ]
}

/// Makes `overlay`, a qcow2 file whose backing file is the raw image `base` (absolute, so the
/// overlay names it wherever it is copied), with `qemu_img`, under a deadline.
///
/// # Errors
/// Invalid when `base` is relative; Spawn when `qemu_img` does not run; ToolFailed when it fails
/// (its stderr says why: a missing base, a full disk).
pub(crate) async fn create_overlay(
    qemu_img: &Path,
    base: &Path,
    overlay: &Path,
) -> Result<(), VmError> {
    if !base.is_absolute() {
        return Err(VmError::Invalid(format!(
            "the base image {} is not an absolute path",
            base.display()
        )));
    }
    let args = overlay_args(base, overlay);
    let ran = BoundedCommand::new(qemu_img, QEMU_IMG_DEADLINE)
        .args(args.iter().cloned())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output_budget(QEMU_IMG_OUTPUT_CAP)
        .run()
        .await
        .map_err(|e| VmError::Spawn {
            program: qemu_img.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })?;
    if ran.status != ExitKind::Exited(0) {
        return Err(VmError::ToolFailed {
            command: format!(
                "{} {}",
                qemu_img.display(),
                args.iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            status: format!("{:?}", ran.status),
            stderr: String::from_utf8_lossy(&ran.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comma_in_a_path_is_doubled_for_qemu() {
        assert_eq!(option_value(Path::new("/a,b/c")), "/a,,b/c");
        assert_eq!(option_value(Path::new("/plain")), "/plain");
    }

    #[test]
    fn the_overlay_is_qcow2_over_the_raw_base() {
        let args = overlay_args(Path::new("/img/root.ext4"), Path::new("/vm/root.qcow2"));
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                "create",
                "-q",
                "-f",
                "qcow2",
                "-b",
                "/img/root.ext4",
                "-F",
                "raw",
                "/vm/root.qcow2"
            ]
        );
    }

    /// A relative base is refused before anything runs; a program that is not there is Spawn;
    /// one that fails is ToolFailed with its stderr.
    #[tokio::test]
    async fn every_failure_is_typed() {
        let dir = tempfile::tempdir().unwrap();
        let overlay = dir.path().join("o.qcow2");
        let relative = create_overlay(Path::new("qemu-img"), Path::new("root.ext4"), &overlay)
            .await
            .unwrap_err();
        assert!(matches!(relative, VmError::Invalid(_)), "{relative}");
        let missing = create_overlay(
            &dir.path().join("no-such-qemu-img"),
            Path::new("/img/root.ext4"),
            &overlay,
        )
        .await
        .unwrap_err();
        assert!(matches!(missing, VmError::Spawn { .. }), "{missing}");
        let script = dir.path().join("failing-qemu-img");
        std::fs::write(&script, "#!/bin/sh\necho 'no room' >&2\nexit 3\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let failed = create_overlay(&script, Path::new("/img/root.ext4"), &overlay)
            .await
            .unwrap_err();
        match failed {
            VmError::ToolFailed { stderr, .. } => assert_eq!(stderr, "no room"),
            other => panic!("{other}"),
        }
    }
}
