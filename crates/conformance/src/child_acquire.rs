//! The acquire-in-child-process protocol of `concurrent-acquires-yield-one`: the child process a
//! backend's [`HardeningHooks::acquire_in_child_process`](crate::isolation::HardeningHooks::acquire_in_child_process)
//! starts prints one line per acquire with [`child_acquire_line`]; the hook reads them back with
//! [`parse_child_acquires`]. One definition, so both sides always speak the same lines:
//! `ok <instance id> <true|false>` or `err <ErrorKind>`.

use std::sync::Arc;

use sandbox_core::{ErrorKind, Sandbox, SandboxBackend, SandboxError, SandboxKey, SandboxSpec};

use crate::error::ConformanceError;
use crate::hardening::{AcquireOutcome, HARDENING};

/// Every error kind a child can report, by the name it prints (its `Debug` form).
const KINDS: [ErrorKind; 34] = [
    ErrorKind::Confinement,
    ErrorKind::InvalidArgument,
    ErrorKind::SpecMismatch,
    ErrorKind::NotADirectory,
    ErrorKind::IsADirectory,
    ErrorKind::NotFound,
    ErrorKind::NotRegularFile,
    ErrorKind::GuestRefused,
    ErrorKind::Io,
    ErrorKind::TransferCapExceeded,
    ErrorKind::OutputLimitExceeded,
    ErrorKind::Timeout,
    ErrorKind::EngineTimeout,
    ErrorKind::BackendUnavailable,
    ErrorKind::Engine,
    ErrorKind::LoginRequired,
    ErrorKind::DaemonFault,
    ErrorKind::HostNotConfined,
    ErrorKind::Retired,
    ErrorKind::WorkspaceMismatch,
    ErrorKind::Busy,
    ErrorKind::SandboxGone,
    ErrorKind::ImageMissing,
    ErrorKind::NoBackend,
    ErrorKind::NotPermitted,
    ErrorKind::CapabilityNotSupported,
    ErrorKind::OsFamilyNotSupported,
    ErrorKind::CapabilityDenied,
    ErrorKind::EgressNotEnforced,
    ErrorKind::ScopeNotEnforced,
    ErrorKind::TransferLimitsNotPermitted,
    ErrorKind::Unclean,
    ErrorKind::Unsupported,
    ErrorKind::ContractViolation,
];

/// The line a child process prints for one acquire's result.
pub fn child_acquire_line(result: &Result<Arc<dyn Sandbox>, SandboxError>) -> String {
    match result {
        Ok(sandbox) => format!("ok {} {}", sandbox.instance_id(), sandbox.freshly_created()),
        Err(error) => format!("err {:?}", error.kind()),
    }
}

/// The child's side, whole: `n` acquires of `key` with `spec` at once on `backend`, each retrying
/// `Busy` as the probe's own do ([`crate::isolation::acquire_retrying_busy`]), then one
/// [`child_acquire_line`] per acquire on standard output, in order. A failed acquire's error is
/// also written to standard error, whole, for the hook to show (the line carries its kind only).
///
/// # Panics
///
/// When an acquire task panics: the child then exits abnormally, which the hook reports.
pub async fn print_concurrent_acquires<B>(
    backend: &B,
    key: &SandboxKey,
    spec: &SandboxSpec,
    n: usize,
) where
    B: SandboxBackend + Clone + 'static,
{
    let acquires: Vec<_> = (0..n)
        .map(|_| {
            let (backend, key, spec) = (backend.clone(), key.clone(), spec.clone());
            tokio::spawn(async move {
                crate::hardening::acquire_retrying_busy(&backend, &key, &spec).await
            })
        })
        .collect();
    for acquire in acquires {
        let result = acquire.await.expect("acquire task");
        if let Err(error) = &result {
            eprintln!("an acquire failed: {error}");
        }
        println!("{}", child_acquire_line(&result));
    }
}

/// Reads a child process's standard output back: one outcome or error kind per line, in order.
///
/// # Errors
///
/// A line that is not exactly one of the two shapes (an instance id with a space, an unknown kind, a
/// freshness other than `true` or `false`) is a harness error, never guessed at.
pub fn parse_child_acquires(
    stdout: &[u8],
) -> Result<Vec<Result<AcquireOutcome, ErrorKind>>, ConformanceError> {
    let text = std::str::from_utf8(stdout)
        .map_err(|_| ConformanceError::harness(HARDENING, "the child process printed non-UTF-8"))?;
    text.lines()
        .map(|line| {
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["ok", id, fresh @ ("true" | "false")] if !id.is_empty() => {
                    Ok(Ok(AcquireOutcome {
                        instance_id: (*id).to_owned(),
                        freshly_created: *fresh == "true",
                    }))
                }
                ["err", name] => KINDS
                    .into_iter()
                    .find(|kind| format!("{kind:?}") == *name)
                    .map(Err)
                    .ok_or_else(|| unreadable(line)),
                _ => Err(unreadable(line)),
            }
        })
        .collect()
}

#[cold]
fn unreadable(line: &str) -> ConformanceError {
    ConformanceError::harness(HARDENING, format!("the child process printed {line:?}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use sandbox_core::testing::FakeBackend;
    use sandbox_core::{Isolation, SandboxBackend, SandboxKey, SandboxSpec};

    use super::*;

    #[test]
    fn every_kind_has_one_name() {
        let names: BTreeSet<String> = KINDS.iter().map(|k| format!("{k:?}")).collect();
        assert_eq!(names.len(), KINDS.len());
    }

    #[tokio::test]
    async fn what_a_child_prints_reads_back_the_same() {
        let fake = FakeBackend::new("fake", Isolation::Container);
        let key = SandboxKey::conversation("s", "t", "a");
        let spec = SandboxSpec::builder("k").build().unwrap();
        let first = fake.acquire(&key, &spec).await;
        let second = fake.acquire(&key, &spec).await;
        let id = first.as_ref().unwrap().instance_id().to_owned();
        let mut lines = vec![child_acquire_line(&first), child_acquire_line(&second)];
        lines.push(child_acquire_line(&Err(SandboxError::Busy(
            "creating".into(),
        ))));
        lines.push(child_acquire_line(&Err(SandboxError::InvalidArgument(
            "x".into(),
        ))));
        let parsed = parse_child_acquires(lines.join("\n").as_bytes()).unwrap();
        assert_eq!(
            parsed[0],
            Ok(AcquireOutcome {
                instance_id: id.clone(),
                freshly_created: true
            })
        );
        assert_eq!(
            parsed[1],
            Ok(AcquireOutcome {
                instance_id: id,
                freshly_created: false
            })
        );
        assert_eq!(parsed[2], Err(ErrorKind::Busy));
        assert_eq!(parsed[3], Err(ErrorKind::InvalidArgument));
        assert_eq!(parsed.len(), 4);
    }

    #[test]
    fn every_name_of_every_kind_parses() {
        for kind in KINDS {
            let line = format!("err {kind:?}");
            assert_eq!(parse_child_acquires(line.as_bytes()).unwrap(), [Err(kind)]);
        }
    }

    #[test]
    fn anything_else_is_a_harness_error() {
        for bad in [
            &b"ok id maybe"[..],
            b"ok  true",
            b"ok id true extra",
            b"err NoSuchKind",
            b"err",
            b"ok id with-space true",
            b"OK id true",
            b"\xff",
            b"ok\tid true",
        ] {
            assert!(
                parse_child_acquires(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(parse_child_acquires(b"").unwrap(), []);
    }
}
