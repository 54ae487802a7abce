//! SNAPSHOT (docs/conformance.md#the-suites): `reset` returns a sandbox to its state at acquire,
//! `fork` copies one into a new sandbox under another key, exactly, and the two diverge; a fork
//! that ends early leaves nothing an acquire or a purge misses.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    Capability, Command, DisposeSelector, ExecRequest, Sandbox, SandboxBackend, SandboxKey,
    SandboxSpec,
};

use crate::error::ConformanceError;
use crate::report::ConformanceReport;
use crate::suite_runner::{ensure, ProbeError, SuiteRun, Verdict};

/// The suite label.
pub const SNAPSHOT: &str = "SNAPSHOT";

/// How many probes [`assert_snapshot`] runs.
pub const SNAPSHOT_PROBES: usize = SNAPSHOT_PROBE_TABLE.len();

/// The probes of this suite, in the order they run (the one place they are counted).
const SNAPSHOT_PROBE_TABLE: &[&str] = &[
    "reset-removes-files-made-after-acquire-and-keeps-the-base",
    "reset-ends-processes-started-after-acquire",
    "fork-copies-files-exactly",
    "fork-and-source-diverge",
    "fork-copies-processes-as-declared",
    "two-forks-are-distinct-machines",
    "a-crash-mid-fork-leaves-nothing-missed",
];

/// The bound of every guest command of this suite.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// The bound of the command that holds the marker processes: past every probe.
const HELD: Duration = Duration::from_secs(900);

/// The fixture directory outside the storage base, in a directory every guest user may write.
const OUTSIDE: &str = "/var/tmp/snapshot-fixture";

/// The size of the large fixture file: over one engine stream chunk many times.
const LARGE_BYTES: u64 = 24 * 1024 * 1024;

/// The size of the fixture that keeps a fork busy long enough to be interrupted.
const CRASH_BYTES: u64 = 256 * 1024 * 1024;

/// What the suite needs from the backend's test module beyond the traits.
#[async_trait]
pub trait SnapshotHooks: Send + Sync {
    /// Whether the backend declares that `fork` copies running processes (a microVM's memory)
    /// or only files (a container's file system).
    fn fork_copies_processes(&self) -> bool;

    /// Forks `source` into `target` with `spec` in another process of this host and kills that
    /// process (`SIGKILL`) while the fork is under way: after it made something for `target`,
    /// before it finished. An error when the kill could not be placed there (the fork finished
    /// first, or never started), so the probe cannot pass by crashing nothing.
    async fn crash_mid_fork(
        &self,
        source: &SandboxKey,
        spec: &SandboxSpec,
        target: &SandboxKey,
    ) -> Result<(), ConformanceError>;
}

/// Attacks `reset` and `fork`. Gate `snapshot`. Each probe uses its own keys from `keys`
/// (conversation keys, one per purpose, as [`run_backend_suites`](crate::run_backend_suites)
/// takes them); every sandbox it made is disposed of before it returns.
///
/// # Errors
/// [`ConformanceError::GateNotDeclared`] before anything is made when `snapshot` is not declared;
/// [`ConformanceError::ConformanceFailure`] naming each failed probe; a harness error when the
/// disposal of what the suite made fails.
pub async fn assert_snapshot(
    backend: &dyn SandboxBackend,
    keys: &mut dyn FnMut(&str) -> SandboxKey,
    spec: &SandboxSpec,
    hooks: &dyn SnapshotHooks,
) -> Result<ConformanceReport, ConformanceError> {
    let capabilities: BTreeSet<Capability> = backend.declarations().capabilities.clone();
    let mut run = SuiteRun::start(
        SNAPSHOT,
        SNAPSHOT_PROBE_TABLE,
        Some(Capability::Snapshot),
        &capabilities,
        Verdict::Aggregate,
    )?;
    let mut used: Vec<SandboxKey> = Vec::new();
    let mut key = |purpose: &str| {
        let key = keys(purpose);
        used.push(key.clone());
        key
    };
    let suite = Suite { backend, spec };

    let reset_key = key("snapshot-reset");
    run.probe(
        "reset-removes-files-made-after-acquire-and-keeps-the-base",
        &[],
        suite.reset_removes_files(&reset_key),
    )
    .await;

    let processes_key = key("snapshot-reset-processes");
    run.probe(
        "reset-ends-processes-started-after-acquire",
        &[],
        suite.reset_ends_processes(&processes_key),
    )
    .await;

    let (exact_source, exact_fork) = (key("snapshot-exact-source"), key("snapshot-exact-fork"));
    run.probe(
        "fork-copies-files-exactly",
        &[],
        suite.fork_copies_exactly(&exact_source, &exact_fork),
    )
    .await;

    let (split_source, split_fork) = (key("snapshot-split-source"), key("snapshot-split-fork"));
    run.probe(
        "fork-and-source-diverge",
        &[],
        suite.fork_and_source_diverge(&split_source, &split_fork),
    )
    .await;

    let (live_source, live_fork) = (key("snapshot-live-source"), key("snapshot-live-fork"));
    run.probe(
        "fork-copies-processes-as-declared",
        &[],
        suite.fork_copies_processes(&live_source, &live_fork, hooks.fork_copies_processes()),
    )
    .await;

    let twins = [
        key("snapshot-twins-source"),
        key("snapshot-twin-a"),
        key("snapshot-twin-b"),
    ];
    run.probe(
        "two-forks-are-distinct-machines",
        &[],
        suite.two_forks_are_distinct(&twins),
    )
    .await;

    let (crash_source, crash_target) = (key("snapshot-crash-source"), key("snapshot-crash-fork"));
    run.probe(
        "a-crash-mid-fork-leaves-nothing-missed",
        &[],
        suite.crash_mid_fork(&crash_source, &crash_target, hooks),
    )
    .await;

    let mut failures = Vec::new();
    for key in &used {
        if let Some(failure) = backend.dispose(key, DisposeSelector::all()).await {
            failures.push(format!("{}: {failure}", key.thread_id));
        }
    }
    if !failures.is_empty() {
        return Err(ConformanceError::harness(
            SNAPSHOT,
            format!(
                "the suite's sandboxes were not all disposed of: {}",
                failures.join("; ")
            ),
        ));
    }
    run.finish()
}

/// The backend and the spec every probe acquires with.
struct Suite<'a> {
    backend: &'a dyn SandboxBackend,
    spec: &'a SandboxSpec,
}

impl Suite<'_> {
    async fn acquire(&self, key: &SandboxKey) -> Result<Arc<dyn Sandbox>, ProbeError> {
        let sandbox = self.backend.acquire(key, self.spec).await?;
        ensure!(
            sandbox.freshly_created(),
            "the acquire of {:?} found an existing sandbox; the suite needs a fresh one",
            key.thread_id
        );
        Ok(sandbox)
    }

    async fn fork(
        &self,
        source: &SandboxKey,
        target: &SandboxKey,
    ) -> Result<Arc<dyn Sandbox>, ProbeError> {
        Ok(self.backend.fork(source, self.spec, target).await?)
    }

    async fn reset_removes_files(&self, key: &SandboxKey) -> Result<(), ProbeError> {
        let sandbox = self.acquire(key).await?;
        let base = sandbox.storage_base().to_owned();
        let image_file = sh(&sandbox, "sha256sum /etc/passwd").await?;
        sh_in(
            &sandbox,
            "set -e; mkdir -p \"$1/reset-dir/deeper\" \"$2\"; printf made >\"$1/reset-made.txt\"; \
             printf deep >\"$1/reset-dir/deeper/leaf\"; printf out >\"$2/reset-outside.txt\"",
            &[&base, OUTSIDE],
        )
        .await?;
        let made = [
            format!("{base}/reset-made.txt"),
            format!("{base}/reset-dir"),
            format!("{OUTSIDE}/reset-outside.txt"),
            OUTSIDE.to_owned(),
        ];
        for path in &made {
            ensure!(
                exists(&sandbox, path).await?,
                "{path} was not made before the reset"
            );
        }
        let reset = sandbox.reset().await?;
        ensure!(
            reset.storage_base() == base,
            "the reset sandbox's storage base is {:?}, not {base:?}",
            reset.storage_base()
        );
        for path in &made {
            ensure!(
                !exists(&reset, path).await?,
                "{path}, made after the acquire, survived the reset"
            );
        }
        let kept = sh_in(
            &reset,
            "test -d \"$1\" && test -w \"$1\" && test -d /var/tmp && echo kept",
            &[&base],
        )
        .await?;
        ensure!(
            kept == b"kept\n",
            "the storage base {base} (or the image's /var/tmp) did not survive the reset"
        );
        let image_after = sh(&reset, "sha256sum /etc/passwd").await?;
        ensure!(
            image_after == image_file,
            "the image's /etc/passwd changed across the reset"
        );
        // The reset sandbox is served under the same key.
        let again = self.backend.acquire(key, self.spec).await?;
        ensure!(
            again.instance_id() == reset.instance_id(),
            "an acquire after the reset served {:?}, not the reset sandbox {:?}",
            again.instance_id(),
            reset.instance_id()
        );
        Ok(())
    }

    async fn reset_ends_processes(&self, key: &SandboxKey) -> Result<(), ProbeError> {
        let sandbox = self.acquire(key).await?;
        let held = start_marker(&sandbox, "reset").await?;
        let reset = sandbox.reset().await;
        let left = match reset {
            Ok(reset) => markers(&reset, "reset").await,
            Err(error) => Err(error.into()),
        };
        held.abort();
        let left = left?;
        ensure!(
            left == 0,
            "{left} process(es) started after the acquire survived the reset"
        );
        Ok(())
    }

    async fn fork_copies_exactly(
        &self,
        source_key: &SandboxKey,
        fork_key: &SandboxKey,
    ) -> Result<(), ProbeError> {
        let source = self.acquire(source_key).await?;
        let base = source.storage_base().to_owned();
        let all_bytes: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
        source
            .write_file("snapshot-fork/all-bytes.bin", &all_bytes, &base)
            .await?;
        plant_fixture(&source, &base, LARGE_BYTES).await?;
        let before = manifest(&source, &base).await?;
        ensure!(
            before.contains(" 750 ") && before.contains(" 604 ") && before.contains(" 700 "),
            "the source's fixture lacks its modes:\n{before}"
        );
        let fork = self.fork(source_key, fork_key).await?;
        ensure!(
            fork.storage_base() == base,
            "the fork's storage base is {:?}, not {base:?}",
            fork.storage_base()
        );
        let after = manifest(&fork, &base).await?;
        ensure!(
            after == before,
            "the fork's files differ from the source's:\nsource:\n{before}\nfork:\n{after}"
        );
        let read = fork
            .read_file("snapshot-fork/all-bytes.bin", &base, 1 << 20)
            .await?;
        ensure!(
            read == all_bytes,
            "the fork's binary file differs from what was written"
        );
        Ok(())
    }

    async fn fork_and_source_diverge(
        &self,
        source_key: &SandboxKey,
        fork_key: &SandboxKey,
    ) -> Result<(), ProbeError> {
        let source = self.acquire(source_key).await?;
        let base = source.storage_base().to_owned();
        source.write_file("shared.txt", b"before\n", &base).await?;
        let fork = self.fork(source_key, fork_key).await?;
        fork.write_file("shared.txt", b"changed in the fork\n", &base)
            .await?;
        fork.write_file("only-fork.txt", b"fork\n", &base).await?;
        source
            .write_file("only-source.txt", b"source\n", &base)
            .await?;
        ensure!(
            source.read_file("shared.txt", &base, 1024).await? == b"before\n",
            "a write in the fork reached the source"
        );
        ensure!(
            fork.read_file("shared.txt", &base, 1024).await? == b"changed in the fork\n",
            "the fork's own write did not stay"
        );
        ensure!(
            !exists(&source, &format!("{base}/only-fork.txt")).await?,
            "a file made in the fork appeared in the source"
        );
        ensure!(
            !exists(&fork, &format!("{base}/only-source.txt")).await?,
            "a file made in the source after the fork appeared in the fork"
        );
        ensure!(
            fork.instance_id() != source.instance_id(),
            "the fork and its source are one instance ({:?})",
            fork.instance_id()
        );
        // The fork is what the target key serves from now on.
        let again = self.backend.acquire(fork_key, self.spec).await?;
        ensure!(
            again.instance_id() == fork.instance_id(),
            "an acquire of the fork's key served {:?}, not the fork {:?}",
            again.instance_id(),
            fork.instance_id()
        );
        Ok(())
    }

    async fn fork_copies_processes(
        &self,
        source_key: &SandboxKey,
        fork_key: &SandboxKey,
        copied: bool,
    ) -> Result<(), ProbeError> {
        let source = self.acquire(source_key).await?;
        let held = start_marker(&source, "fork").await?;
        let counted = async {
            let fork = self.fork(source_key, fork_key).await?;
            Ok::<_, ProbeError>((
                markers(&fork, "fork").await?,
                markers(&source, "fork").await?,
            ))
        }
        .await;
        held.abort();
        let (in_fork, in_source) = counted?;
        let expected = if copied { MARKERS } else { 0 };
        ensure!(
            in_fork == expected,
            "the fork runs {in_fork} marker process(es); the backend declares that a fork \
             copies processes: {copied}"
        );
        ensure!(
            in_source == MARKERS,
            "the fork ended the source's processes ({in_source} of {MARKERS} left)"
        );
        Ok(())
    }

    async fn two_forks_are_distinct(&self, keys: &[SandboxKey; 3]) -> Result<(), ProbeError> {
        let [source_key, a_key, b_key] = keys;
        let source = self.acquire(source_key).await?;
        let base = source.storage_base().to_owned();
        source.write_file("inherited.txt", b"both\n", &base).await?;
        let a = self.fork(source_key, a_key).await?;
        let b = self.fork(source_key, b_key).await?;
        let ids = [source.instance_id(), a.instance_id(), b.instance_id()];
        let distinct: BTreeSet<&str> = ids.iter().copied().collect();
        ensure!(
            distinct.len() == 3,
            "the source and two forks share an instance identity: {ids:?}"
        );
        let random = "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'";
        let (ra, rb) = (sh(&a, random).await?, sh(&b, random).await?);
        ensure!(
            ra.len() == 64 && ra != rb,
            "two forks read the same random bytes: {:?} and {:?}",
            String::from_utf8_lossy(&ra),
            String::from_utf8_lossy(&rb)
        );
        for (name, fork) in [("a", &a), ("b", &b)] {
            ensure!(
                fork.read_file("inherited.txt", &base, 1024).await? == b"both\n",
                "fork {name} lacks the source's file"
            );
        }
        a.write_file("only-a.txt", b"a\n", &base).await?;
        ensure!(
            !exists(&b, &format!("{base}/only-a.txt")).await?,
            "a write in one fork reached the other"
        );
        Ok(())
    }

    async fn crash_mid_fork(
        &self,
        source_key: &SandboxKey,
        target: &SandboxKey,
        hooks: &dyn SnapshotHooks,
    ) -> Result<(), ProbeError> {
        let source = self.acquire(source_key).await?;
        let base = source.storage_base().to_owned();
        plant_fixture(&source, &base, CRASH_BYTES).await?;
        hooks.crash_mid_fork(source_key, self.spec, target).await?;
        // An acquire of the target never serves what the crashed fork made.
        let fresh = self.backend.acquire(target, self.spec).await?;
        ensure!(
            fresh.freshly_created(),
            "after a crash mid-fork, the target's acquire served an existing sandbox"
        );
        ensure!(
            !exists(&fresh, &format!("{base}/snapshot-fork")).await?
                && !exists(&fresh, OUTSIDE).await?,
            "after a crash mid-fork, the target's acquire served the fork's files"
        );
        // The purge of the target's conversation leaves nothing listed.
        let purge = self
            .backend
            .dispose_scope(&target.scope, &target.thread_id)
            .await;
        ensure!(
            purge.undisposed.is_none(),
            "the purge after a crash mid-fork failed: {purge:?}"
        );
        let left = self
            .backend
            .list(&target.scope, Some(&target.thread_id))
            .await?;
        ensure!(
            left.is_empty(),
            "the purge after a crash mid-fork left {left:?}"
        );
        Ok(())
    }
}

/// Runs `sh -c script sh args...` as the guest, requiring exit 0; its stdout.
async fn sh_in(
    sandbox: &Arc<dyn Sandbox>,
    script: &str,
    args: &[&str],
) -> Result<Vec<u8>, ProbeError> {
    let mut argv = vec!["sh", "-c", script, "sh"];
    argv.extend_from_slice(args);
    let request = ExecRequest::new(Command::argv(argv))
        .working_directory("/")
        .timeout(COMMAND_TIMEOUT);
    let output = sandbox.exec(request).await?;
    ensure!(
        output.exit_code == 0,
        "the guest command {script:?} exited {} (stderr {:?})",
        output.exit_code,
        output.stderr_text()
    );
    Ok(output.stdout)
}

async fn sh(sandbox: &Arc<dyn Sandbox>, script: &str) -> Result<Vec<u8>, ProbeError> {
    sh_in(sandbox, script, &[]).await
}

/// Whether a guest path exists (a dangling link counts), as the guest sees it.
async fn exists(sandbox: &Arc<dyn Sandbox>, path: &str) -> Result<bool, ProbeError> {
    let answer = sh_in(
        sandbox,
        "if test -e \"$1\" || test -L \"$1\"; then echo yes; else echo no; fi",
        &[path],
    )
    .await?;
    match answer.as_slice() {
        b"yes\n" => Ok(true),
        b"no\n" => Ok(false),
        other => Err(ProbeError::Harness(format!(
            "the existence test of {path} printed {:?}",
            String::from_utf8_lossy(other)
        ))),
    }
}

/// Plants the fixture: a tree in the storage base with modes, a link, an empty file, a large
/// file of random bytes, and a directory outside the storage base.
async fn plant_fixture(
    sandbox: &Arc<dyn Sandbox>,
    base: &str,
    large: u64,
) -> Result<(), ProbeError> {
    sh_in(
        sandbox,
        "set -e; w=\"$1/snapshot-fork\"; o=\"$2\"; mkdir -p \"$w/nested/private\" \"$o\"; \
         printf 'plain text\\n' >\"$w/plain.txt\"; : >\"$w/empty\"; \
         printf '#!/bin/sh\\necho tool\\n' >\"$w/tool.sh\"; chmod 0750 \"$w/tool.sh\"; \
         printf odd >\"$w/nested/odd.txt\"; chmod 0604 \"$w/nested/odd.txt\"; \
         printf secret >\"$w/nested/private/key\"; chmod 0700 \"$w/nested/private\"; \
         ln -s ../plain.txt \"$w/nested/link\"; \
         head -c \"$3\" /dev/urandom >\"$w/large.bin\"; \
         printf outside >\"$o/outside.txt\"; chmod 0640 \"$o/outside.txt\"",
        &[base, OUTSIDE, &large.to_string()],
    )
    .await?;
    Ok(())
}

/// Every entry of the fixture (path, type, mode, owner, link target), every regular file's size
/// and digest, sorted: equal manifests mean equal trees. Directory sizes are left out: they
/// depend on the file system, not on what the directory holds.
async fn manifest(sandbox: &Arc<dyn Sandbox>, base: &str) -> Result<String, ProbeError> {
    let listed = sh_in(
        sandbox,
        "set -e; for d in \"$1/snapshot-fork\" \"$2\"; do cd \"$d\"; echo \"== $d\"; \
         find . -printf '%p %y %m %U %G %l\\n' | LC_ALL=C sort; \
         find . -type f -printf '%p size %s\\n' | LC_ALL=C sort; \
         find . -type f -exec sha256sum {} + | LC_ALL=C sort -k2; done",
        &[base, OUTSIDE],
    )
    .await?;
    let text = String::from_utf8(listed)
        .map_err(|_| ProbeError::Harness("the fixture's manifest is not UTF-8".into()))?;
    ensure!(
        text.contains("./large.bin f ") && text.contains("./outside.txt f 640 "),
        "the manifest lacks the planted files:\n{text}"
    );
    Ok(text)
}

/// How many marker processes [`start_marker`] starts.
const MARKERS: usize = 2;

/// Starts the marker processes of `tag`: a command held in flight (`...-held`), which first
/// starts one in a session of its own (`setsid`, `...-detached`) that would outlive it where a
/// backend lets a process outlive its command. The command is held by the returned task, so
/// both run on every backend (one whose agent ends an exec's every process with it included)
/// until the sandbox is reset, or the task is dropped. Waits until both show.
async fn start_marker(
    sandbox: &Arc<dyn Sandbox>,
    tag: &str,
) -> Result<tokio::task::JoinHandle<()>, ProbeError> {
    let script = format!(
        "setsid sh -c 'sleep 3600; : snapshot-marker-{tag}-detached' </dev/null >/dev/null 2>&1 & \
         exec sh -c 'sleep 3600; : snapshot-marker-{tag}-held'"
    );
    let request = ExecRequest::new(Command::argv(["sh", "-c", &script]))
        .working_directory("/")
        .timeout(HELD);
    let held = Arc::clone(sandbox);
    let task = tokio::spawn(async move {
        let _ = held.exec(request).await;
    });
    // The processes are made after the command starts; wait until both show (the held
    // command's shell carries both tags until it becomes the held one).
    for _ in 0..100 {
        if markers(sandbox, tag).await? == MARKERS {
            return Ok(task);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    task.abort();
    Err(ProbeError::Harness(format!(
        "the {MARKERS} marker processes of {tag:?} did not show, so the probe cannot judge"
    )))
}

/// How many marker shells of `tag` run: processes whose whole command line is a marker's (a
/// wrapper or the counting command, which carry the text inside a longer line, never match).
async fn markers(sandbox: &Arc<dyn Sandbox>, tag: &str) -> Result<usize, ProbeError> {
    let counted = sh_in(
        sandbox,
        "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' <\"$f\" 2>/dev/null; echo; done \
         | grep -cxE \"sh -c sleep 3600; : snapshot-marker-$1-(held|detached) \" || true",
        &[tag],
    )
    .await?;
    String::from_utf8_lossy(&counted)
        .trim()
        .parse()
        .map_err(|_| {
            ProbeError::Harness(format!(
                "the process count printed {:?}",
                String::from_utf8_lossy(&counted)
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::testing::FakeBackend;
    use sandbox_core::{ErrorKind, Isolation};

    struct NoCrash;

    #[async_trait]
    impl SnapshotHooks for NoCrash {
        fn fork_copies_processes(&self) -> bool {
            false
        }
        async fn crash_mid_fork(
            &self,
            _: &SandboxKey,
            _: &SandboxSpec,
            _: &SandboxKey,
        ) -> Result<(), ConformanceError> {
            Err(ConformanceError::harness(SNAPSHOT, "no crash here"))
        }
    }

    #[tokio::test]
    async fn the_gate_refuses_a_backend_without_snapshot_before_anything_is_made() {
        let fake = FakeBackend::new("fake", Isolation::None);
        let spec = SandboxSpec::builder("k").build().unwrap();
        let mut keys = |purpose: &str| SandboxKey::conversation("s", purpose, "a");
        let error = assert_snapshot(&fake, &mut keys, &spec, &NoCrash)
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                ConformanceError::GateNotDeclared {
                    capability: Capability::Snapshot,
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(fake.acquire_calls(), 0);
        let refused = fake
            .fork(
                &SandboxKey::conversation("s", "a", "a"),
                &spec,
                &SandboxKey::conversation("s", "b", "a"),
            )
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::CapabilityNotSupported);
    }

    #[test]
    fn the_table_counts_the_probes() {
        assert_eq!(SNAPSHOT_PROBES, 7);
        let distinct: BTreeSet<&&str> = SNAPSHOT_PROBE_TABLE.iter().collect();
        assert_eq!(distinct.len(), SNAPSHOT_PROBES);
    }
}
