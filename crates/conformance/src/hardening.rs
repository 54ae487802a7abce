//! HARDENING (docs/conformance.md#hardening): the probes this project adds beyond the reference suites.
//!
//! Eleven run on a shared sandbox after EXEC ([`assert_hardening`]), six of them hostile commands a
//! timeout must end completely ([`HOSTILE_TIMEOUT_CASES`]); three need sandboxes or keys of their
//! own ([`assert_engine_failure_is_not_an_exit_code`], [`assert_concurrent_acquires_yield_one`],
//! [`assert_network_closed_by_content`]). The engine-side facts come from a [`HardeningHooks`] the
//! backend's test module provides.
//!
//! A backend that does not declare `exact_kill` promises a kill of the command's process group
//! only, and a retired sandbox where the kill cannot show it landed: the hostile cases then test
//! that ([`GROUP_TIMEOUT_CASES`] on the shared sandbox, [`RECORD_REMOVING_CASES`] on sandboxes of
//! their own, through [`assert_a_lost_record_retires`]), in the same number of probes.

use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sandbox_core::{
    Capability, Command, Egress, ErrorKind, ExecChunk, ExecEvent, ExecRequest, ExecStdin, Sandbox,
    SandboxBackend, SandboxError, SandboxKey, SandboxSpec, DEFAULT_MAX_OUTPUT_BYTES,
};
use token_server::TokenServer;

use crate::error::ConformanceError;
use crate::fingerprint::Fingerprint;
use crate::paths::ConformancePaths;
use crate::probe_kit::{plant_nothing, run, run_argv};
use crate::report::ConformanceReport;
use crate::subject::ConformanceSubject;
use crate::suite_runner::{ensure, refused_with, ProbeError, Refusal, SuiteRun, Verdict};

/// The suite label.
pub const HARDENING: &str = "HARDENING";

/// How many probes [`assert_hardening`] runs on the shared sandbox of a backend declaring
/// `exact_kill`: those of its table, then one per [`HOSTILE_TIMEOUT_CASES`] entry. Without
/// `exact_kill`, [`RECORD_REMOVING_CASES`] run on sandboxes of their own instead of two of them:
/// the total is the same.
pub const HARDENING_SHARED_PROBES: usize =
    HARDENING_SHARED_PROBE_TABLE.len() + HOSTILE_TIMEOUT_CASES.len();

/// The probes [`assert_hardening`] runs on the shared sandbox before the hostile-timeout cases,
/// in order.
const HARDENING_SHARED_PROBE_TABLE: &[&str] = &[
    "argv-round-trips-bytes",
    "argv-refuses-nul",
    "a-timed-out-group-is-dead",
    "a-flood-is-refused-and-bounded",
    "a-slow-consumer-holds-host-memory-bounded",
];

/// How many HARDENING probes run on sandboxes or keys of their own.
pub const HARDENING_OWN_SANDBOX_PROBES: usize = HARDENING_OWN_SANDBOX_PROBE_TABLE.len();

/// The HARDENING probes that run on sandboxes or keys of their own, one suite run each.
const HARDENING_OWN_SANDBOX_PROBE_TABLE: [&str; 3] = [
    NETWORK_CLOSED_BY_CONTENT,
    ENGINE_FAILURE_IS_NOT_AN_EXIT_CODE,
    CONCURRENT_ACQUIRES_YIELD_ONE,
];
const NETWORK_CLOSED_BY_CONTENT: &str = "network-closed-by-content";
const ENGINE_FAILURE_IS_NOT_AN_EXIT_CODE: &str = "engine-failure-is-not-an-exit-code";
const CONCURRENT_ACQUIRES_YIELD_ONE: &str = "concurrent-acquires-yield-one";

/// The commands a timeout must end completely: (probe name, `sh -c` script). Each runs as
/// `sh -c <script> sleep <marker>`, so every process it starts carries `sleep<marker>` in its
/// command line (`$1` is the marker), which the check from a second exec looks for.
pub const HOSTILE_TIMEOUT_CASES: [(&str, &str); 6] = [
    (
        "a-timeout-kills-a-child-in-its-own-group",
        r#"if command -v perl >/dev/null; then exec perl -e 'if(fork){sleep 600}else{setpgrp(0,0);exec "sleep",$ARGV[1]}' sleep "$1"; fi; (setsid sleep "$1" &); exec sleep "$1""#,
    ),
    (
        "a-timeout-kills-a-command-that-deletes-its-records",
        r#"rm -f /tmp/maf-sbx-*; exec sleep "$1""#,
    ),
    (
        "a-timeout-kills-a-double-fork-daemon",
        r#"(setsid sh -c 'sleep "$1" & exit 0' sleep "$1" &); exec sleep "$1""#,
    ),
    (
        "a-timeout-kills-nohup-jobs",
        r#"nohup sleep "$1" >/dev/null 2>&1 & exec sleep "$1""#,
    ),
    (
        "a-timeout-kills-a-tight-fork-loop",
        r#"while :; do (: &); done"#,
    ),
    (
        "a-timeout-kills-a-command-that-empties-tmp",
        r#"while :; do rm -f /tmp/* /tmp/.[!.]* 2>/dev/null; sleep 0.05; done"#,
    ),
];

/// Without `exact_kill`, on the shared sandbox: the hostile commands whose group a kill of the
/// command's process group must end, (probe name, `sh -c` script). Each runs as `sh -c <script>
/// sleep <marker> <other>`: every process of the command's group carries `sleep<marker>` in its
/// command line, and a process that leaves the group `sleep<other>`. The group must be gone after
/// the timeout; a process that left it is not the kill's to end (the backend declares so), and the
/// probe ends it itself, so the sandbox serves on clean.
pub const GROUP_TIMEOUT_CASES: [(&str, &str); 4] = [
    (
        "a-timeout-kills-the-group-a-child-left",
        r#"if command -v perl >/dev/null; then exec perl -e 'if(fork){exec "sleep",$ARGV[0]}else{setpgrp(0,0);exec "sleep",$ARGV[1]}' "$1" "$2"; fi; (setsid sleep "$2" &); exec sleep "$1""#,
    ),
    (
        "a-timeout-kills-the-group-a-daemon-left",
        r#"(setsid sh -c 'sleep "$1" & exit 0' sleep "$2" &); exec sleep "$1""#,
    ),
    HOSTILE_TIMEOUT_CASES[3],
    HOSTILE_TIMEOUT_CASES[4],
];

/// Without `exact_kill`, each on a sandbox of its own: the hostile commands that remove the
/// record of their process group, (probe name, `sh -c` script, run as `sh -c <script> sleep
/// <marker>`). The group kill then cannot show it landed, so the timeout must report the sandbox
/// retired, and the handle must refuse every later call; a kill that did land must have left
/// nothing of the command, as with `exact_kill`.
pub const RECORD_REMOVING_CASES: [(&str, &str); 2] = [
    (
        "a-timeout-retires-a-sandbox-whose-records-a-command-deleted",
        HOSTILE_TIMEOUT_CASES[1].1,
    ),
    (
        "a-timeout-retires-a-sandbox-whose-tmp-a-command-emptied",
        HOSTILE_TIMEOUT_CASES[5].1,
    ),
];

/// Ends, from a second exec, every process whose command line carries `sleep<$1$2>` (the marker in
/// two pieces, so its own command line never matches); `kill` is a builtin, the reads too.
const LEFT_GROUP_KILL: &str = r#"for d in /proc/[0-9]*; do c=; IFS= read -r c 2>/dev/null <"$d/cmdline"; case $c in *"sleep$1$2"*) kill -KILL "${d#/proc/}" 2>/dev/null ;; esac; done; exit 0"#;

/// Lists, from a second exec, every process whose command line carries `sleep<$1$2>` (the marker
/// in two pieces, so the checker's own command line never matches). Reads `/proc` with shell
/// builtins only; `read` drops the NUL separators.
const SURVIVOR_CHECK: &str = r#"for d in /proc/[0-9]*; do c=; IFS= read -r c 2>/dev/null <"$d/cmdline"; case $c in *"sleep$1$2"*) printf '%s %s\n' "${d#/proc/}" "$c" ;; esac; done; exit 0"#;

/// The concurrent acquires of `concurrent-acquires-yield-one`: this many in this process, as many in a
/// child process.
pub(crate) const ACQUIRES_PER_PROCESS: usize = 4;

/// How the flood probe's host memory growth is bounded: 2 × the output budget + 8 MiB.
pub(crate) const FLOOD_RSS_ALLOWANCE: u64 = 2 * DEFAULT_MAX_OUTPUT_BYTES + 8 * 1024 * 1024;

/// How many bytes the slow-consumer probe streams: 1 GiB.
pub(crate) const STREAMED_BYTES: u64 = 1 << 30;

/// How much of [`STREAMED_BYTES`] the slow-consumer probe takes at a crawl (2 ms per chunk).
const SLOW_PART_BYTES: u64 = 64 << 20;

/// How far host memory may grow while 1 GiB streams to a slow consumer: 64 MiB. The stream holds
/// a few 64 KiB chunks; the engine connection, the runner and the allocator add their own buffers.
/// The whole output held would be 1 GiB.
pub(crate) const SLOW_CONSUMER_RSS_ALLOWANCE: u64 = 64 << 20;

/// One acquire made by a child process: the handle's instance id and whether it created the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireOutcome {
    /// The instance the handle names.
    pub instance_id: String,
    /// Whether this acquire created it.
    pub freshly_created: bool,
}

/// What the HARDENING probes need from the backend's test module beyond the public traits.
#[async_trait]
pub trait HardeningHooks: Send + Sync {
    /// Removes the sandbox's instance directly through the engine (`docker rm -f <id>`,
    /// `sbx rm --force <name>`), behind the handle's back.
    async fn remove_behind_the_handle(&self, sandbox: &dyn Sandbox)
        -> Result<(), ConformanceError>;

    /// How many instances the engine holds for the identity (key, spec kind): the engine-side count,
    /// never the backend's own memory.
    async fn engine_instances_for(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<usize, ConformanceError>;

    /// Starts a child process (a helper binary or the test binary re-executed) that builds its own
    /// backend from the same configuration and runs `n` concurrent acquires of (key, spec), each retrying
    /// a `Busy` result like [`acquire_retrying_busy`]. Returns each acquire's outcome or error kind.
    async fn acquire_in_child_process(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
        n: usize,
    ) -> Result<Vec<Result<AcquireOutcome, ErrorKind>>, ConformanceError>;

    /// An address of this host the engine routes the guest to (docker: the default bridge's gateway;
    /// real sbx: what `host.docker.internal` resolves to in the VM). Always local, never public.
    async fn routable_host_address(&self) -> Result<IpAddr, ConformanceError>;

    /// The kinds an exec on a handle whose instance was removed may fail with (docker: `SandboxGone`;
    /// sbx: `SandboxGone` or `DaemonFault`).
    fn gone_kinds(&self) -> Vec<ErrorKind> {
        vec![ErrorKind::SandboxGone]
    }

    /// An engine-side fingerprint of the sandbox for CONFINEMENT (docs/conformance.md#confinement):
    /// its changed paths, implicit writable storage (tmpfs, `/dev/shm`) included, and its running
    /// programs, from the engine or a trusted observer, never from the guest's own utilities. A view
    /// that missed anything must say so in [`Fingerprint::unseen`]. `None` (the default) when the test
    /// module cannot take one: the probe is then skipped, which a CI run refuses.
    async fn fingerprint(
        &self,
        sandbox: &dyn Sandbox,
    ) -> Result<Option<Fingerprint>, ConformanceError> {
        let _ = sandbox;
        Ok(None)
    }

    /// This process's resident set size in bytes, sampled every 10 ms during the flood. The default
    /// reads `VmRSS` from `/proc/self/status` (Linux); `None` makes the flood probe a harness error.
    fn host_rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
}

/// The host's resident set size before a memory probe: a harness error when it cannot be sampled.
fn rss_before(hooks: &dyn HardeningHooks) -> Result<u64, ProbeError> {
    hooks
        .host_rss_bytes()
        .ok_or_else(|| ProbeError::Harness("the host's resident set size cannot be sampled".into()))
}

/// Polls, from a second exec, until no process whose command line (NUL separators dropped)
/// contains `$2$1` remains: exit 0 once none does, 1 when one survives 50 polls 0.1 s apart, 3
/// when `/proc` cannot be read. The marker comes in two pieces, in that order, so the poll's own
/// command line (`…$1$2`) never matches. Works whatever PID namespace each call runs in, where
/// a recorded pid or group id would not.
pub(crate) const SURVIVOR_POLL: &str = r#"[ -r /proc/self/cmdline ] || exit 3
i=0
while :; do
  n=0
  for d in /proc/[0-9]*; do c=; IFS= read -r c 2>/dev/null <"$d/cmdline"; case $c in *"$2$1"*) n=$((n+1)) ;; esac; done
  [ "$n" -eq 0 ] && exit 0
  i=$((i+1))
  [ "$i" -ge 50 ] && exit 1
  sleep 0.1
done"#;

/// Waits until no process of a killed command, recognised by `marker` in its command line
/// (`marker = head + tail`), remains.
pub(crate) async fn expect_none_left(
    subject: &dyn ConformanceSubject,
    head: &str,
    tail: &str,
    work: &str,
) -> Result<(), ProbeError> {
    let out = run_argv(
        subject,
        &["sh", "-c", SURVIVOR_POLL, "poll", tail, head],
        work,
    )
    .await?;
    match out.exit_code {
        0 => Ok(()),
        1 => Err(ProbeError::Assertion(format!(
            "a process of the killed command ({head}{tail}) is still alive"
        ))),
        other => Err(ProbeError::Harness(format!(
            "the survivor poll for {head}{tail} exited {other} (stderr {:?})",
            out.stderr_text()
        ))),
    }
}

pub(crate) async fn expect_handle_works(
    subject: &dyn ConformanceSubject,
    work: &str,
    instance_id: &str,
) -> Result<(), ProbeError> {
    let out = run_argv(subject, &["true"], work).await?;
    ensure!(
        out.exit_code == 0,
        "`true` exited {} afterwards",
        out.exit_code
    );
    ensure!(
        subject.sandbox().instance_id() == instance_id,
        "the instance changed from {instance_id:?} to {:?}",
        subject.sandbox().instance_id()
    );
    Ok(())
}

/// Runs the shared-sandbox probes, in the order the spec gives: argv-round-trips-bytes,
/// argv-refuses-nul, a-timed-out-group-is-dead, a-flood-is-refused-and-bounded, then one per
/// [`HOSTILE_TIMEOUT_CASES`] entry, or, when the backend does not declare `exact_kill`, one per
/// [`GROUP_TIMEOUT_CASES`] entry. Gate `exec`. Run after
/// EXEC; needs `sh`, a `sleep` accepting fractions and `head -c` in the image.
pub async fn assert_hardening(
    subject: &dyn ConformanceSubject,
    hooks: &dyn HardeningHooks,
) -> Result<ConformanceReport, ConformanceError> {
    let exact = subject.capabilities().contains(&Capability::ExactKill);
    let hostile: &[(&str, &str)] = if exact {
        &HOSTILE_TIMEOUT_CASES
    } else {
        &GROUP_TIMEOUT_CASES
    };
    let table: Vec<&'static str> = HARDENING_SHARED_PROBE_TABLE
        .iter()
        .copied()
        .chain(hostile.iter().map(|(name, _)| *name))
        .collect();
    let mut suite = SuiteRun::start(
        HARDENING,
        &table,
        Some(Capability::Exec),
        subject.capabilities(),
        Verdict::Aggregate,
    )?;
    let paths = ConformancePaths::under(subject.working_directory());
    plant_nothing(subject, &paths).await?;
    let work = paths.work.as_str();

    suite
        .probe("argv-round-trips-bytes", &[], async {
            let elements: [&[u8]; 9] = [
                b"",
                b"trailing\n",
                b"\n\n",
                b"\xff\xfe raw",
                b" lead",
                b"-n",
                b"*",
                b"$(echo no)",
                b"x",
            ];
            let mut argv: Vec<&[u8]> = vec![b"sh", b"-c", b"printf '%s\\0' \"$@\"", b"probe"];
            argv.extend_from_slice(&elements);
            let out = run(subject, Command::argv(argv), work).await?;
            ensure!(out.exit_code == 0, "the probe exited {}", out.exit_code);
            let expected: Vec<u8> = elements
                .iter()
                .flat_map(|e| e.iter().copied().chain([0]))
                .collect();
            ensure!(
                out.stdout == expected,
                "the arguments came back as {:?}",
                out.stdout
            );
            Ok(())
        })
        .await;

    suite
        .probe("argv-refuses-nul", &[], async {
            let request = ExecRequest::new(Command::argv(["printf", "a\0b"]))
                .working_directory(work)
                .timeout(subject.exec_timeout());
            refused_with(
                Refusal::Exactly(ErrorKind::InvalidArgument),
                subject.sandbox().exec(request),
            )
            .await?;
            Ok(())
        })
        .await;

    suite
        .probe("a-timed-out-group-is-dead", &[], async {
            let instance_id = subject.sandbox().instance_id().to_owned();
            let request = ExecRequest::new(Command::argv([
                "sh",
                "-c",
                "sleep 3131 & sleep 3132 & sleep 3133; wait",
            ]))
            .working_directory(work)
            .timeout(Duration::from_secs(1));
            refused_with(Refusal::Timeout, subject.sandbox().exec(request)).await?;
            expect_none_left(subject, "sleep31", "3", work).await?;
            expect_handle_works(subject, work, &instance_id).await
        })
        .await;

    suite
        .probe("a-flood-is-refused-and-bounded", &[], async {
            let instance_id = subject.sandbox().instance_id().to_owned();
            let before = rss_before(hooks)?;
            let request = ExecRequest::new(Command::argv([
                "sh",
                "-c",
                "head -c 1073741824 /dev/zero",
            ]))
            .working_directory(work)
            .timeout(Duration::from_secs(120));
            let started = Instant::now();
            let exec = subject.sandbox().exec(request);
            tokio::pin!(exec);
            let mut peak = before;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let result = loop {
                tokio::select! {
                    result = &mut exec => break result,
                    _ = tick.tick() => {
                        if let Some(rss) = hooks.host_rss_bytes() {
                            peak = peak.max(rss);
                        }
                    }
                }
            };
            let elapsed = started.elapsed();
            refused_with(
                Refusal::Exactly(ErrorKind::OutputLimitExceeded),
                std::future::ready(result),
            )
            .await?;
            ensure!(
                elapsed < Duration::from_secs(60),
                "the flood was refused only after {elapsed:?}"
            );
            let growth = peak.saturating_sub(before);
            ensure!(
                growth <= FLOOD_RSS_ALLOWANCE,
                "host memory grew by {growth} bytes during the flood (allowance {FLOOD_RSS_ALLOWANCE})"
            );
            expect_none_left(subject, "head-c1073741824", "/dev/zero", work).await?;
            expect_handle_works(subject, work, &instance_id).await
        })
        .await;

    suite
        .probe("a-slow-consumer-holds-host-memory-bounded", &[], async {
            let before = rss_before(hooks)?;
            let request = ExecRequest::new(Command::argv([
                "sh",
                "-c",
                "head -c \"$1\" /dev/zero",
                "stream",
                &STREAMED_BYTES.to_string(),
            ]))
            .working_directory(work)
            .timeout(Duration::from_secs(600));
            let mut stream = subject
                .sandbox()
                .exec_stream(request, ExecStdin::Closed)
                .await?;
            let mut peak = before;
            let (mut received, mut chunks) = (0u64, 0u64);
            let exit = loop {
                match stream.next().await {
                    Some(Ok(ExecEvent::Output(ExecChunk::Stdout(bytes)))) => {
                        received += bytes.len() as u64;
                        chunks += 1;
                        // The first part at a crawl, so the producer has every chance to run
                        // ahead of the consumer; then as fast as the chunks come.
                        if received < SLOW_PART_BYTES {
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        if chunks % 64 == 0 {
                            if let Some(rss) = hooks.host_rss_bytes() {
                                peak = peak.max(rss);
                            }
                        }
                    }
                    Some(Ok(ExecEvent::Output(ExecChunk::Stderr(bytes)))) => {
                        return Err(ProbeError::Assertion(format!(
                            "the stream wrote {:?} on stderr",
                            String::from_utf8_lossy(&bytes)
                        )))
                    }
                    Some(Ok(ExecEvent::Exit(exit))) => break exit,
                    Some(Err(error)) => return Err(error.into()),
                    None => return Err(ProbeError::Assertion("the stream ended".into())),
                }
            };
            ensure!(exit.exit_code == 0, "the command exited {}", exit.exit_code);
            ensure!(
                received == STREAMED_BYTES,
                "the stream delivered {received} of {STREAMED_BYTES} bytes"
            );
            let growth = peak.saturating_sub(before);
            ensure!(
                growth < SLOW_CONSUMER_RSS_ALLOWANCE,
                "host memory grew by {growth} bytes streaming 1 GiB to a slow consumer \
                 (allowance {SLOW_CONSUMER_RSS_ALLOWANCE})"
            );
            Ok(())
        })
        .await;

    for (index, (name, script)) in hostile.iter().enumerate() {
        suite
            .probe(name, &[], async {
                if exact {
                    a_timeout_leaves_nothing(subject, work, script, 31411 + index, None).await
                } else {
                    // Markers of their own: a group case's escapee is never taken for another
                    // case's survivor.
                    let left = 31521 + index;
                    a_timeout_leaves_nothing(subject, work, script, 31421 + index, Some(left)).await
                }
            })
            .await;
    }

    suite.finish()
}

/// Without `exact_kill`: one of [`RECORD_REMOVING_CASES`] on `subject`, a sandbox of its own
/// (`index` into that table), as one HARDENING probe. Gate `exec`.
pub async fn assert_a_lost_record_retires(
    subject: &dyn ConformanceSubject,
    index: usize,
) -> Result<ConformanceReport, ConformanceError> {
    let (name, script) = RECORD_REMOVING_CASES.get(index).copied().ok_or_else(|| {
        ConformanceError::InvalidArgument(format!("no record-removing case {index}"))
    })?;
    let mut suite = SuiteRun::start(
        HARDENING,
        &[name],
        Some(Capability::Exec),
        subject.capabilities(),
        Verdict::Aggregate,
    )?;
    let paths = ConformancePaths::under(subject.working_directory());
    plant_nothing(subject, &paths).await?;
    let work = paths.work.as_str();
    suite
        .probe(name, &[], async {
            let instance_id = subject.sandbox().instance_id().to_owned();
            let marker = (31431 + index).to_string();
            let request = ExecRequest::new(Command::argv(["sh", "-c", script, "sleep", &marker]))
                .working_directory(work)
                .timeout(Duration::from_secs(2));
            let refused = refused_with(Refusal::Timeout, subject.sandbox().exec(request)).await?;
            match refused.guest_cleanup() {
                Some(sandbox_core::GuestCleanup::Retired) => {
                    // Retired: the sandbox is gone with every process in it, and the handle
                    // says so rather than serve.
                    let after = ExecRequest::new(Command::argv(["true"]))
                        .working_directory(work)
                        .timeout(subject.exec_timeout());
                    let refusal = refused_with(
                        Refusal::Exactly(ErrorKind::Retired),
                        subject.sandbox().exec(after),
                    )
                    .await;
                    match refusal {
                        Ok(_) => Ok(()),
                        Err(crate::suite_runner::RefusalMismatch::WrongKind { error, .. })
                            if error.kind() == ErrorKind::SandboxGone =>
                        {
                            Ok(())
                        }
                        Err(mismatch) => Err(ProbeError::Assertion(format!(
                            "after a retiring kill the handle still served: {mismatch}"
                        ))),
                    }
                }
                Some(sandbox_core::GuestCleanup::Killed) => {
                    let (head, tail) = marker.split_at(marker.len() - 1);
                    expect_no_survivor(subject, head, tail, work).await?;
                    expect_handle_works(subject, work, &instance_id).await
                }
                other => Err(ProbeError::Assertion(format!(
                    "the timeout's kill reported {other:?}, neither Retired nor Killed ({refused})"
                ))),
            }
        })
        .await;
    suite.finish()
}

/// From a second exec, that no process carrying `head + tail` in its command line is running.
async fn expect_no_survivor(
    subject: &dyn ConformanceSubject,
    head: &str,
    tail: &str,
    work: &str,
) -> Result<(), ProbeError> {
    let check = run_argv(
        subject,
        &["sh", "-c", SURVIVOR_CHECK, "check", head, tail],
        work,
    )
    .await?;
    ensure!(
        check.exit_code == 0,
        "the survivor check exited {}",
        check.exit_code
    );
    ensure!(
        check.stdout.is_empty(),
        "processes the timed-out command started are still running: {}",
        String::from_utf8_lossy(&check.stdout)
    );
    Ok(())
}

/// Starts a sibling, then `script` with a 2 s timeout; checks the timeout killed the command
/// (the sandbox kept), that no process carrying its marker remains, that the sibling completes,
/// and that the sandbox keeps serving. With `left` (the group cases), the script gets that
/// marker too, for the processes that leave the command's group: they are not the kill's to end,
/// and the probe ends them itself once the group is judged.
async fn a_timeout_leaves_nothing(
    subject: &dyn ConformanceSubject,
    work: &str,
    script: &str,
    marker: usize,
    left: Option<usize>,
) -> Result<(), ProbeError> {
    let instance_id = subject.sandbox().instance_id().to_owned();
    let sibling = run_argv(subject, &["sh", "-c", "sleep 4; echo sibling-done"], work);
    let hostile = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let marker = marker.to_string();
        let left = left.map(|left| left.to_string());
        let mut argv = vec!["sh", "-c", script, "sleep", &marker];
        argv.extend(left.as_deref());
        let request = ExecRequest::new(Command::argv(argv))
            .working_directory(work)
            .timeout(Duration::from_secs(2));
        let refused = refused_with(Refusal::Timeout, subject.sandbox().exec(request)).await?;
        ensure!(
            refused.guest_cleanup() == Some(sandbox_core::GuestCleanup::Killed),
            "the timeout's kill reported {:?}, not Killed ({refused})",
            refused.guest_cleanup()
        );
        let (head, tail) = marker.split_at(marker.len() - 1);
        let judged = expect_no_survivor(subject, head, tail, work).await;
        if let Some(left) = left {
            let (head, tail) = left.split_at(left.len() - 1);
            run_argv(
                subject,
                &["sh", "-c", LEFT_GROUP_KILL, "kill", head, tail],
                work,
            )
            .await?;
            expect_none_left(subject, &format!("sleep{head}"), tail, work).await?;
        }
        judged
    };
    let (sibling, hostile) = tokio::join!(sibling, hostile);
    hostile?;
    let sibling = sibling?;
    ensure!(
        sibling.exit_code == 0 && sibling.stdout == b"sibling-done\n",
        "the sibling started before the timed-out command ended with {} and {:?}",
        sibling.exit_code,
        String::from_utf8_lossy(&sibling.stdout)
    );
    expect_handle_works(subject, work, &instance_id).await
}

/// Acquires (key, spec), retrying a `Busy` result up to 3 times 1 s apart. A child process of
/// `concurrent-acquires-yield-one` should acquire through this too.
pub async fn acquire_retrying_busy(
    backend: &dyn SandboxBackend,
    key: &SandboxKey,
    spec: &SandboxSpec,
) -> Result<Arc<dyn Sandbox>, SandboxError> {
    let mut retries = 0;
    loop {
        match backend.acquire(key, spec).await {
            Err(e) if e.kind() == ErrorKind::Busy && retries < 3 => {
                retries += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            other => return other,
        }
    }
}

/// `engine-failure-is-not-an-exit-code`, on a dedicated sandbox of `key`: after the engine removes the
/// instance behind the handle, exec fails with one of [`HardeningHooks::gone_kinds`] and never returns an
/// exit code; a later acquire yields a new instance. The caller disposes of `key` afterwards.
pub async fn assert_engine_failure_is_not_an_exit_code(
    backend: &dyn SandboxBackend,
    key: &SandboxKey,
    spec: &SandboxSpec,
    hooks: &dyn HardeningHooks,
) -> Result<ConformanceReport, ConformanceError> {
    let capabilities = backend.declarations().capabilities.clone();
    let mut suite = SuiteRun::start(
        HARDENING,
        &[ENGINE_FAILURE_IS_NOT_AN_EXIT_CODE],
        Some(Capability::Exec),
        &capabilities,
        Verdict::Aggregate,
    )?;
    suite
        .probe(ENGINE_FAILURE_IS_NOT_AN_EXIT_CODE, &[], async {
            let sandbox = backend.acquire(key, spec).await?;
            let old = sandbox.instance_id().to_owned();
            hooks.remove_behind_the_handle(sandbox.as_ref()).await?;
            let gone = hooks.gone_kinds();
            for command in [
                Command::argv(["true"]),
                Command::argv(["sh", "-c", "exit 1"]),
            ] {
                let request = ExecRequest::new(command.clone()).timeout(Duration::from_secs(60));
                match sandbox.exec(request).await {
                    Ok(out) => {
                        return Err(ProbeError::Assertion(format!(
                            "{command:?} on a removed instance returned an exit code ({})",
                            out.exit_code
                        )))
                    }
                    Err(e) if gone.contains(&e.kind()) => {}
                    Err(e) => {
                        return Err(ProbeError::Assertion(format!(
                            "{command:?} on a removed instance returned `{:?}` ({e}), expected one of {gone:?}",
                            e.kind()
                        )))
                    }
                }
            }
            let again = backend.acquire(key, spec).await?;
            ensure!(
                again.instance_id() != old,
                "the acquire after the removal returned the removed instance {old:?}"
            );
            Ok(())
        })
        .await;
    suite.finish()
}

/// `concurrent-acquires-yield-one`: 4 acquires of one fresh key in this process and 4 in a child process,
/// started together, yield one instance, one engine instance and exactly one fresh creation. The caller
/// disposes of `key` afterwards.
pub async fn assert_concurrent_acquires_yield_one(
    backend: &dyn SandboxBackend,
    key: &SandboxKey,
    spec: &SandboxSpec,
    hooks: &dyn HardeningHooks,
) -> Result<ConformanceReport, ConformanceError> {
    let capabilities = backend.declarations().capabilities.clone();
    let mut suite = SuiteRun::start(
        HARDENING,
        &[CONCURRENT_ACQUIRES_YIELD_ONE],
        None,
        &capabilities,
        Verdict::Aggregate,
    )?;
    suite
        .probe(CONCURRENT_ACQUIRES_YIELD_ONE, &[], async {
            let one = || async {
                acquire_retrying_busy(backend, key, spec)
                    .await
                    .map(|s| AcquireOutcome {
                        instance_id: s.instance_id().to_owned(),
                        freshly_created: s.freshly_created(),
                    })
                    .map_err(|e| (e.kind(), e.to_string()))
            };
            let (a, b, c, d, child) = tokio::join!(
                one(),
                one(),
                one(),
                one(),
                hooks.acquire_in_child_process(key, spec, ACQUIRES_PER_PROCESS)
            );
            let child = child?;
            ensure!(
                child.len() == ACQUIRES_PER_PROCESS,
                "the child process reported {} acquires, not {ACQUIRES_PER_PROCESS}",
                child.len()
            );
            let child = child
                .into_iter()
                .map(|r| r.map_err(|kind| (kind, "reported by the child".to_owned())));
            let all: Vec<Result<AcquireOutcome, (ErrorKind, String)>> =
                [a, b, c, d].into_iter().chain(child).collect();
            let mut outcomes = Vec::new();
            for (i, result) in all.into_iter().enumerate() {
                let side = if i < ACQUIRES_PER_PROCESS {
                    "this process"
                } else {
                    "the child process"
                };
                match result {
                    Ok(outcome) => outcomes.push(outcome),
                    Err((kind, message)) => {
                        return Err(ProbeError::Assertion(format!(
                            "an acquire in {side} failed with `{kind:?}`: {message}"
                        )))
                    }
                }
            }
            let ids: BTreeSet<&str> = outcomes.iter().map(|o| o.instance_id.as_str()).collect();
            ensure!(ids.len() == 1, "the acquires yielded instances {ids:?}");
            let fresh = outcomes.iter().filter(|o| o.freshly_created).count();
            ensure!(
                fresh == 1,
                "{fresh} acquires report that they created the instance"
            );
            let engine = hooks.engine_instances_for(key, spec).await?;
            ensure!(
                engine == 1,
                "the engine holds {engine} instances of the key"
            );
            Ok(())
        })
        .await;
    suite.finish()
}

/// A fresh random 32-hex token (the standard library's randomly keyed hasher; no crate needed).
fn fresh_token() -> String {
    let half = || {
        let mut h = RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        h.finish()
    };
    format!("{:016x}{:016x}", half(), half())
}

/// How long the host's own fetch of its token server may take.
const HOST_FETCH_BOUND: Duration = Duration::from_secs(5);

/// `network-closed-by-content`, on a sandbox of its own acquired with egress closed: a token served by
/// this host on `host_address` (an address the engine routes to; never public) must never appear in the
/// guest's output, whatever curl's exit code. The host's own fetch must see it, or the probe is a
/// harness error. Needs `curl` in the image.
pub async fn assert_network_closed_by_content(
    subject: &dyn ConformanceSubject,
    host_address: IpAddr,
) -> Result<ConformanceReport, ConformanceError> {
    let mut suite = SuiteRun::start(
        HARDENING,
        &[NETWORK_CLOSED_BY_CONTENT],
        Some(Capability::Exec),
        subject.capabilities(),
        Verdict::Aggregate,
    )?;
    let paths = ConformancePaths::under(subject.working_directory());
    plant_nothing(subject, &paths).await?;
    let work = paths.work.as_str();
    suite
        .probe(NETWORK_CLOSED_BY_CONTENT, &[], async {
            let token = fresh_token();
            let server = TokenServer::start(host_address, token.clone())
                .await
                .map_err(|e| ProbeError::Harness(e.to_string()))?;
            let seen = token_server::fetch(server.address(), HOST_FETCH_BOUND)
                .await
                .map_err(|e| ProbeError::Harness(e.to_string()))?;
            if !contains(&seen, token.as_bytes()) {
                return Err(ProbeError::Harness(
                    "the host's own fetch did not see the token".into(),
                ));
            }
            let url = server.url();
            let line = format!(
                "curl -s --max-time 5 {url}; curl -s --max-time 5 --noproxy '*' {url}; exit 0"
            );
            let request = ExecRequest::new(Command::argv(["sh", "-c", &line]))
                .working_directory(work)
                .timeout(Duration::from_secs(30));
            let out = subject.sandbox().exec(request).await?;
            ensure!(
                !contains(&out.stdout, token.as_bytes())
                    && !contains(&out.stderr, token.as_bytes()),
                "the guest fetched the host's token with egress closed"
            );
            drop(server);
            Ok(())
        })
        .await;
    suite.finish()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Refuses a spec that is not egress-closed for the network probe's own sandbox.
pub(crate) fn require_closed_egress(spec: &SandboxSpec) -> Result<(), ConformanceError> {
    if spec.egress() != Egress::Closed {
        return Err(ConformanceError::harness(
            HARDENING,
            format!(
                "network-closed-by-content needs an egress-closed spec, not {}",
                spec.egress()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_hex() {
        let (a, b) = (fresh_token(), fresh_token());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn the_survivor_poll_sees_a_marked_process_and_never_itself() {
        let poll = |head: &str, tail: &str| {
            std::process::Command::new("sh")
                .args(["-c", SURVIVOR_POLL, "poll", tail, head])
                .status()
                .unwrap()
                .code()
        };
        // Nothing carries the marker: not even the poll, whose arguments hold both pieces.
        assert_eq!(poll("sleepZZ31", "9"), Some(0));
        // A shell blocked in its `read` builtin: one process, no child left behind. It says
        // `ready` once it runs under its own command line: polled earlier, the forked child
        // may still carry the test binary's, and the poll would rightly see nothing.
        let mut marked = std::process::Command::new("sh")
            .args(["-c", "echo ready; read -r line", "sleepZZ31", "9"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(marked.stdout.as_mut().unwrap()),
            &mut ready,
        )
        .unwrap();
        assert_eq!(ready, "ready\n");
        assert_eq!(poll("sleepZZ31", "9"), Some(1));
        marked.kill().unwrap();
        marked.wait().unwrap();
        assert_eq!(poll("sleepZZ31", "9"), Some(0));
    }
}
