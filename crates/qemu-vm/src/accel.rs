//! The accelerator, chosen by a test boot rather than by the presence of `/dev/kvm`: a host
//! can offer `/dev/kvm` on which a stock kernel does not boot (nested, paravirtual
//! implementations), so KVM is chosen only when a KVM boot reaches the agent.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::VmError;
use crate::machine::{Accel, Vm, VmConfig};

/// How long the KVM test boot may take (a KVM boot reaches the agent in well under a second).
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// What the probe chose and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccelReport {
    /// The accelerator to use.
    pub accel: Accel,
    /// Why (for reports: "kvm boot reached the agent in 0.4 s", "no /dev/kvm", ...).
    pub reason: String,
}

/// Boots `config` (its accelerator overridden to KVM) when `/dev/kvm` can be opened, and
/// chooses KVM if the agent answers within 15 s, else TCG. The result is cached in
/// `cache` (keyed by the image and the host's kernel), so only the first call boots.
///
/// # Errors
/// Io when the VM's directory cannot be made; a failed KVM boot is not an error (it chooses
/// TCG).
pub async fn probe_accel(config: &VmConfig, cache: &Path) -> Result<AccelReport, VmError> {
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let key = format!("accel-{}-{}", config.image.digest, host.trim());
    let cached = cache.join(&key);
    if let Some(report) = read_cached(&cached) {
        return Ok(report);
    }
    // One probe at a time per cache entry: processes starting together share one test boot
    // (and its VM directory) instead of racing for it.
    std::fs::create_dir_all(cache).map_err(|e| VmError::io("creating", cache, e))?;
    let _lock = lock_exclusive(cache.join(format!("{key}.lock"))).await?;
    if let Some(report) = read_cached(&cached) {
        return Ok(report);
    }
    let report = probe(config).await?;
    let _ = std::fs::write(
        &cached,
        format!("{}\n{}", report.accel.name(), report.reason),
    );
    Ok(report)
}

fn read_cached(cached: &Path) -> Option<AccelReport> {
    let text = std::fs::read_to_string(cached).ok()?;
    let (name, reason) = text.split_once('\n')?;
    let accel = Accel::parse(name)?;
    Some(AccelReport {
        accel,
        reason: format!("{reason} (cached)"),
    })
}

/// Opens `path` (created when missing) and takes its exclusive `flock`, held until the file is
/// dropped.
async fn lock_exclusive(path: PathBuf) -> Result<std::fs::File, VmError> {
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| VmError::io("opening", &path, e))?;
    tokio::task::spawn_blocking(move || {
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map(|()| file)
            .map_err(|errno| VmError::io("locking", &path, errno.into()))
    })
    .await
    .map_err(|error| VmError::Invalid(format!("the lock's thread: {error}")))?
}

async fn probe(config: &VmConfig) -> Result<AccelReport, VmError> {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return Ok(AccelReport {
            accel: Accel::Tcg,
            reason: "/dev/kvm cannot be opened".to_owned(),
        });
    }
    let mut kvm = config.clone();
    kvm.accel = Accel::Kvm;
    kvm.name = format!("{}-kvm-probe", config.name);
    // A probe whose process died mid-boot left its directory (and maybe its QEMU): under the
    // lock nobody else uses it.
    let stale = kvm.dir();
    if stale.exists() {
        match Vm::attach(&stale) {
            Ok(vm) => vm.kill().await?,
            Err(_) => {
                std::fs::remove_dir_all(&stale).map_err(|e| VmError::io("removing", &stale, e))?
            }
        }
    }
    let started = Instant::now();
    let vm = match Vm::start(&kvm).await {
        Ok(vm) => vm,
        Err(VmError::QemuExited { detail }) => {
            return Ok(AccelReport {
                accel: Accel::Tcg,
                reason: format!("a KVM QEMU exited at once: {detail}"),
            })
        }
        Err(error) => return Err(error),
    };
    let reached = vm.agent(KVM_PROBE_TIMEOUT).await;
    let _ = vm.kill().await;
    Ok(match reached {
        Ok(_) => AccelReport {
            accel: Accel::Kvm,
            reason: format!(
                "a KVM boot reached the agent in {:.1} s",
                started.elapsed().as_secs_f64()
            ),
        },
        Err(error) => AccelReport {
            accel: Accel::Tcg,
            reason: format!("a KVM boot did not reach the agent: {error}"),
        },
    })
}
