//! The one place that names concrete backends. Commands see only `Arc<dyn SandboxBackend>`, so a new
//! backend joins here without changing any command.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use backend_docker::{DockerBackend, DockerConfig, ImageOutcome, ImageRecipe, LocalImage};
use backend_sbx::{SbxBackend, SbxConfig};
use exec_wrapper::{BoundedCommand, ExitKind};
use sandbox_core::{SandboxBackend, SandboxError};

use crate::cli::{BackendChoice, GlobalArgs};

/// Connects the chosen backend. `guest_names` are the `--env` names whose values are meant for the guest.
pub async fn connect(
    global: &GlobalArgs,
    guest_names: &[String],
) -> Result<Arc<dyn SandboxBackend>, SandboxError> {
    match global.backend {
        BackendChoice::Docker => {
            let mut config = DockerConfig::default();
            config.management_env = Some(management_env(std::env::vars_os(), guest_names));
            config.egress_proxy_image = Some(global.egress_proxy_image.clone());
            config.outbound_network = global.outbound_network.clone();
            Ok(Arc::new(DockerBackend::connect(config).await?))
        }
        BackendChoice::Sbx => Ok(Arc::new(connect_sbx(global, guest_names).await?)),
    }
}

pub(crate) async fn connect_sbx(
    global: &GlobalArgs,
    guest_names: &[String],
) -> Result<SbxBackend, SandboxError> {
    let mut config = SbxConfig::default();
    config.sbx_path = global.sbx_path.clone();
    config.simulator_ok = global.allow_simulator;
    config.management_env = Some(management_env(std::env::vars_os(), guest_names));
    SbxBackend::connect(config).await
}

/// The engine client's environment: sandboxctl's own, minus the variables named by `--env`. Their values
/// go to the guest through the backend's env file; left here they would also sit in every docker client's
/// environment. Names the client itself needs to reach its daemon stay, or it could not connect: a
/// guest may be given `PATH` or `HOME` too.
pub(crate) fn management_env(
    own: impl IntoIterator<Item = (OsString, OsString)>,
    guest_names: &[String],
) -> Vec<(OsString, OsString)> {
    let client_needs = |name: &str| {
        matches!(name, "PATH" | "HOME" | "LOCALAPPDATA")
            || name.starts_with("XDG_")
            || name.starts_with("DOCKER_")
    };
    own.into_iter()
        .filter(|(name, _)| {
            let name = name.to_string_lossy();
            client_needs(&name) || !guest_names.iter().any(|g| *g == name)
        })
        .collect()
}

fn sbx_has_no_images() -> SandboxError {
    SandboxError::invalid(
        "the local images are the docker backend's; sbx sandboxes start from sbx templates",
    )
}

fn recipe() -> ImageRecipe {
    ImageRecipe::new().progress(|line| eprintln!("sandboxctl images: {line}"))
}

/// The default image's reference, built locally first when it is missing (no registry needed);
/// `None` for sbx, whose default is its own `shell` template. `guest_names` as for [`connect`]:
/// the presence check runs with the same client environment.
pub async fn ensure_default_image(
    choice: BackendChoice,
    guest_names: &[String],
) -> Result<Option<String>, SandboxError> {
    match choice {
        BackendChoice::Docker => {
            let image = LocalImage::DEFAULT;
            // The command's stderr is relayed byte for byte: say nothing unless a build is needed.
            if image_present(image.tag(), guest_names).await {
                return Ok(Some(image.tag().to_owned()));
            }
            if guest_names.is_empty() {
                recipe()
                    .build(&[image])
                    .await
                    .map_err(|e| SandboxError::ImageMissing {
                        image: image.tag().into(),
                        hint: format!("building it locally failed: {e}"),
                    })?;
            } else {
                build_in_a_child(image, guest_names).await?;
            }
            Ok(Some(image.tag().to_owned()))
        }
        BackendChoice::Sbx => Ok(None),
    }
}

/// Builds `image` in a child `sandboxctl images build` whose environment lacks the `--env` values:
/// the recipe's own tools inherit their process's environment, and a guest value must never sit in
/// a host process's environment other than the guest's own.
async fn build_in_a_child(image: LocalImage, guest_names: &[String]) -> Result<(), SandboxError> {
    let failed = |why: String| SandboxError::ImageMissing {
        image: image.tag().into(),
        hint: format!("building it locally failed: {why}"),
    };
    let me = std::env::current_exe().map_err(|e| failed(e.to_string()))?;
    let build = BoundedCommand::new(me, Duration::from_secs(30 * 60))
        .args(["images", "build", image.tag()])
        .envs(management_env(std::env::vars_os(), guest_names))
        .output_budget(1 << 20)
        .on_line(|_, line| {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line);
        })
        .run()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if build.status == ExitKind::Exited(0) {
        Ok(())
    } else {
        Err(failed(format!(
            "`sandboxctl images build` ended with {:?}",
            build.status
        )))
    }
}

/// Whether `tag` is in the engine's image store, asked through the image recipe (the backend's one
/// way to ask) with the management env of [`connect`], so no `--env` value reaches the engine client.
/// An engine that cannot answer counts as "absent": the build that follows says why.
async fn image_present(tag: &str, guest_names: &[String]) -> bool {
    matches!(
        ImageRecipe::new()
            .management_env(management_env(std::env::vars_os(), guest_names))
            .image_id(tag)
            .await,
        Ok(Some(_))
    )
}

/// Builds the named local images (default: the default image); returns (tag, outcome) per image.
pub async fn build_images(
    choice: BackendChoice,
    tags: &[String],
) -> Result<Vec<(String, &'static str)>, SandboxError> {
    if choice == BackendChoice::Sbx {
        return Err(sbx_has_no_images());
    }
    let images = if tags.is_empty() {
        vec![LocalImage::DEFAULT]
    } else {
        tags.iter()
            .map(|t| LocalImage::from_tag(t).map_err(|e| SandboxError::invalid(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?
    };
    let reports = recipe()
        .build(&images)
        .await
        .map_err(|e| SandboxError::engine(format!("image build failed: {e}")))?;
    Ok(reports
        .into_iter()
        .map(|r| {
            let outcome = match r.outcome {
                ImageOutcome::AlreadyPresent => "already present",
                _ => "built",
            };
            (r.image.tag().to_owned(), outcome)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_values_stay_out_of_the_client_environment() {
        let own = [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/u"),
            ("DOCKER_HOST", "unix:///run/docker.sock"),
            ("PROBE_VALUE", "guest only"),
            ("OTHER", "kept"),
        ]
        .map(|(n, v)| (OsString::from(n), OsString::from(v)));
        let guest = ["PROBE_VALUE", "PATH", "HOME"].map(String::from);
        let names: Vec<String> = management_env(own, &guest)
            .into_iter()
            .map(|(n, _)| n.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["PATH", "HOME", "DOCKER_HOST", "OTHER"]);
    }
}
