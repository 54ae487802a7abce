//! The container sandbox backend, driving the `docker` CLI (docker.md), and the one recipe
//! for the local images every Docker-based suite and the default configuration run on.
//!
//! What is here today: [`ImageRecipe`], which builds the images of docker.md §7
//! ([`LocalImage`]) from packages this machine can install (debootstrap for the Debian images,
//! the host's static BusyBox for the BusyBox image) and `docker import`s them. Nothing is ever
//! pulled: no registry is assumed. `cargo xtask images` and `sandboxctl images build` both call
//! it. What this crate does not do: pull images, push them, or build from a Dockerfile.
//!
//! ```
//! use backend_docker::{ImageRecipe, LocalImage};
//!
//! let wanted: Vec<LocalImage> = ["sandbox-base:local", "sandbox-busybox:local"]
//!     .into_iter()
//!     .map(LocalImage::from_tag)
//!     .collect::<Result<_, _>>()?;
//! assert_eq!(wanted, [LocalImage::Base, LocalImage::Busybox]);
//! assert_eq!(LocalImage::DEFAULT.tag(), "sandbox-base:local");
//!
//! let recipe = ImageRecipe::new()
//!     .cache_dir("target/images-cache")
//!     .progress(|line| eprintln!("{line}"));
//!
//! // Building needs root, debootstrap, busybox-static and a Docker engine:
//! async fn build(recipe: &ImageRecipe, wanted: &[LocalImage]) -> Result<(), backend_docker::DockerError> {
//!     for report in recipe.build(wanted).await? {
//!         println!("{}: {:?} in {:?}", report.image, report.outcome, report.elapsed);
//!     }
//!     Ok(())
//! }
//! # let _ = (build, recipe);
//! # Ok::<(), backend_docker::DockerError>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_code)]

mod error;
mod images;

pub use error::DockerError;
pub use images::{ImageOutcome, ImageRecipe, ImageReport, LocalImage, ProgressSink, DEBIAN_SUITE};
