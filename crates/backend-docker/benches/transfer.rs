//! File transfer through the engine's archive endpoints (docs/docker-backend.md#file-rules).
//!
//! - Pass/fail: a 64 MiB `write_file` within 1.0× and a 64 MiB `read_file` within 1.1× a raw
//!   `docker cp` of the same bytes, in (host file to container) and out (container to host file).
//!   Reported beside them: the same bytes through one bare API `PUT` and `GET` of the archive
//!   (the client library's own cost), and the backend's checks alone.
//! - Reported only: a 1 KiB `write_file`, `read_file` and `stat_file` three components below the
//!   storage base (`d1/d2/small.bin`), each against one raw `docker exec` doing the same
//!   (`cat >`, `cat`, `stat`), against the spec's reference of 3×. Each backend call checks the ancestors with archive
//!   `HEAD` stats (a few at a time) before it acts.

mod support;

use std::path::Path;

use backend_docker::defaults::TRANSFER_CEILING;
use futures_util::StreamExt as _;
use paired_bench::raw_docker::{docker, docker_with_stdin};
use paired_bench::{exit_with, paired, round_robin, Metric, Target};
use sandbox_core::{Command, ExecRequest, Sandbox, SandboxSpec};
use support::{backend, SideBySide};

const MIB: usize = 1024 * 1024;
const BIG: usize = 64 * MIB;
const SMALL: usize = 1024;
const BIG_WARMUP: usize = 1;
const BIG_ROUNDS: usize = 11;
const SMALL_WARMUP: usize = 2;
const SMALL_ROUNDS: usize = 15;

/// Where the raw container keeps its files (its user can create it).
const RAW_WORK: &str = "/tmp/work";

#[tokio::main]
async fn main() {
    let backend = backend().await;
    let spec = SandboxSpec::builder("bench")
        .image(support::IMAGE)
        .files_in(TRANSFER_CEILING)
        .files_out(TRANSFER_CEILING)
        .build()
        .expect("a valid spec");
    let SideBySide {
        sweep,
        sandbox,
        raw,
        ..
    } = SideBySide::start(&backend, "transfer", &spec).await;
    docker(&["exec", &raw, "mkdir", "-p", &format!("{RAW_WORK}/d1/d2")]).await;
    let host = tempfile::tempdir().expect("a host temp dir");

    let passed =
        big(sandbox.as_ref(), &raw, host.path()).await & small(sandbox.as_ref(), &raw).await;

    drop(sandbox);
    sweep.finish(&backend, &["t"]).await;
    exit_with(passed);
}

/// 64 MiB in and out; returns whether both targets are met. Each round also times the raw
/// CLI's own exec legs (`docker exec -i … cat >`, `docker exec … cat`), the engine checks alone
/// (`stat_file` of the same path: the same ancestor walk and leaf stat) and, for the write, one
/// bare API `PUT` of the same file's tar (built before the round) into the sandbox's own
/// container, so the report shows where the difference from `docker cp` comes from.
async fn big(sandbox: &dyn Sandbox, raw: &str, host: &Path) -> bool {
    let data = conformance::fixtures::incompressible_bytes(BIG, 0x5eed);
    let api = bollard::Docker::connect_with_unix_defaults()
        .expect("a client of the default socket")
        .negotiate_version()
        .await
        .expect("the engine answers");
    let bare_tar = guest_tar(sandbox, "big.bin", &data).await;
    let source = host.join("big.bin");
    std::fs::write(&source, &data).expect("the host file is written");
    let source = source.to_str().expect("a UTF-8 temp path").to_owned();
    let raw_file = format!("{RAW_WORK}/big.bin");
    let raw_big = format!("{raw}:{raw_file}");
    let raw_exec_file = format!("{RAW_WORK}/big-exec.bin");

    let mut write = Metric::new("64 MiB write", Target::AtMost(1.0));
    let mut exec_in = Metric::new(
        "64 MiB in, raw docker exec -i vs raw docker cp",
        Target::ReportedOnly,
    );
    let mut bare_in = Metric::new(
        "64 MiB in, one bare API PUT of the tar vs raw docker cp",
        Target::ReportedOnly,
    );
    let mut over_bare = Metric::new(
        "64 MiB write vs one bare API PUT of the tar",
        Target::ReportedOnly,
    );
    let mut write_checks = Metric::new(
        "64 MiB write's engine checks alone (stat_file) vs raw docker cp",
        Target::ReportedOnly,
    );
    for round in 0..BIG_WARMUP + BIG_ROUNDS {
        let times = round_robin(
            round,
            vec![
                Box::pin(async {
                    sandbox
                        .write_file("big.bin", &data, ".")
                        .await
                        .expect("write_file");
                }),
                Box::pin(async {
                    docker(&["cp", &source, &raw_big]).await;
                }),
                Box::pin(async {
                    docker_with_stdin(
                        &[
                            "exec",
                            "-i",
                            raw,
                            "sh",
                            "-c",
                            r#"cat >"$1""#,
                            "sh",
                            &raw_exec_file,
                        ],
                        Some(&data),
                    )
                    .await;
                }),
                Box::pin(async {
                    let options = bollard::query_parameters::UploadToContainerOptionsBuilder::new()
                        .path(support::BASE)
                        .no_overwrite_dir_non_dir("true")
                        .build();
                    api.upload_to_container(
                        sandbox.instance_id(),
                        Some(options),
                        bollard::body_full(bare_tar.clone()),
                    )
                    .await
                    .expect("the bare PUT");
                }),
                Box::pin(async {
                    let entry = sandbox.stat_file("big.bin", ".").await.expect("stat_file");
                    assert!(entry.is_some());
                }),
            ],
        )
        .await;
        if round >= BIG_WARMUP {
            write.push((times[0], times[1]));
            exec_in.push((times[2], times[1]));
            bare_in.push((times[3], times[1]));
            over_bare.push((times[0], times[3]));
            write_checks.push((times[4], times[1]));
        }
    }

    let target = host.join("out.bin");
    let target_str = target.to_str().expect("a UTF-8 temp path").to_owned();
    let mut read = Metric::new("64 MiB read", Target::AtMost(1.1));
    let mut exec_out = Metric::new(
        "64 MiB out, raw docker exec cat vs raw docker cp",
        Target::ReportedOnly,
    );
    let mut bare_out = Metric::new(
        "64 MiB read vs one bare API GET of the archive",
        Target::ReportedOnly,
    );
    let mut checks = Metric::new(
        "64 MiB read's engine checks alone (stat_file) vs raw docker cp",
        Target::ReportedOnly,
    );
    for round in 0..BIG_WARMUP + BIG_ROUNDS {
        let mut got = Vec::new();
        let mut raw_got = Vec::new();
        let mut size = None;
        let mut bare_tar_out = Vec::new();
        let times = round_robin(
            round,
            vec![
                Box::pin(async {
                    got = sandbox
                        .read_file("big.bin", ".", BIG as u64)
                        .await
                        .expect("read_file");
                }),
                Box::pin(async {
                    docker(&["cp", &raw_big, &target_str]).await;
                }),
                Box::pin(async {
                    raw_got = docker(&["exec", raw, "cat", &raw_file]).await.stdout;
                }),
                Box::pin(async {
                    let entry = sandbox.stat_file("big.bin", ".").await.expect("stat_file");
                    size = entry.and_then(|e| e.size_bytes());
                }),
                Box::pin(async {
                    let options =
                        bollard::query_parameters::DownloadFromContainerOptionsBuilder::new()
                            .path(&format!("{}/big.bin", support::BASE))
                            .build();
                    let mut stream =
                        api.download_from_container(sandbox.instance_id(), Some(options));
                    while let Some(chunk) = stream.next().await {
                        bare_tar_out.extend_from_slice(&chunk.expect("the bare GET"));
                    }
                }),
            ],
        )
        .await;
        assert!(got == data, "read_file returned what was written");
        assert!(raw_got == data, "docker exec cat returned what was written");
        assert!(
            bare_tar_out.len() > BIG,
            "the bare GET returned the whole archive"
        );
        assert_eq!(size, Some(BIG as u64));
        let copied = std::fs::read(&target).expect("docker cp wrote the host file");
        assert!(copied == data, "docker cp returned what was written");
        std::fs::remove_file(&target).expect("the copy is removed");
        if round >= BIG_WARMUP {
            read.push((times[0], times[1]));
            exec_out.push((times[2], times[1]));
            checks.push((times[3], times[1]));
            bare_out.push((times[0], times[4]));
        }
    }
    let write_ok = write.report();
    exec_in.report();
    bare_in.report();
    over_bare.report();
    write_checks.report();
    let read_ok = read.report();
    bare_out.report();
    exec_out.report();
    checks.report();
    write_ok && read_ok
}

/// A tar of one file `name` holding `data`, owned by the sandbox's guest user with mode 0644, as
/// the backend's write uploads it (built in memory, outside any timing).
async fn guest_tar(sandbox: &dyn Sandbox, name: &str, data: &[u8]) -> bytes::Bytes {
    let output = sandbox
        .exec(ExecRequest::new(Command::argv([
            "sh",
            "-c",
            "id -u; id -g",
        ])))
        .await
        .expect("id runs");
    let text = output.stdout_text();
    let mut ids = text
        .split_whitespace()
        .map(|n| n.parse::<u64>().expect("an id"));
    let (uid, gid) = (ids.next().expect("a uid"), ids.next().expect("a gid"));
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_uid(uid);
    header.set_gid(gid);
    header.set_size(data.len() as u64);
    let mut builder = tar::Builder::new(Vec::with_capacity(data.len() + 4096));
    builder
        .append_data(&mut header, name, data)
        .expect("the tar is built");
    builder.into_inner().expect("the tar ends").into()
}

/// 1 KiB write, read and stat at depth 3, each against one raw `docker exec`; returns whether
/// every target is met.
async fn small(sandbox: &dyn Sandbox, raw: &str) -> bool {
    const PATH: &str = "d1/d2/small.bin";
    let data = conformance::fixtures::incompressible_bytes(SMALL, 0x1c1c);
    let raw_path = format!("{RAW_WORK}/{PATH}");
    let mut write = Metric::new("1 KiB write", Target::AtMost(1.0));
    let mut read = Metric::new("1 KiB read", Target::AtMost(1.0));
    let mut stat = Metric::new("1 KiB stat", Target::AtMost(0.25));
    for round in 0..SMALL_WARMUP + SMALL_ROUNDS {
        let write_pair = paired(
            round,
            async {
                sandbox
                    .write_file(PATH, &data, ".")
                    .await
                    .expect("write_file");
            },
            async {
                docker_with_stdin(
                    &[
                        "exec",
                        "-i",
                        raw,
                        "sh",
                        "-c",
                        r#"cat >"$1""#,
                        "sh",
                        &raw_path,
                    ],
                    Some(&data),
                )
                .await;
            },
        )
        .await;
        let mut got = Vec::new();
        let mut raw_got = Vec::new();
        let read_pair = paired(
            round,
            async {
                got = sandbox
                    .read_file(PATH, ".", SMALL as u64)
                    .await
                    .expect("read_file");
            },
            async {
                raw_got = docker(&["exec", raw, "cat", &raw_path]).await.stdout;
            },
        )
        .await;
        assert!(
            got == data && raw_got == data,
            "both reads return the bytes"
        );
        let mut size = None;
        let mut raw_size = String::new();
        let stat_pair = paired(
            round,
            async {
                let entry = sandbox.stat_file(PATH, ".").await.expect("stat_file");
                size = entry.and_then(|e| e.size_bytes());
            },
            async {
                let output = docker(&["exec", raw, "stat", "-c", "%s", &raw_path]).await;
                raw_size = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            },
        )
        .await;
        assert_eq!(size, Some(SMALL as u64));
        assert_eq!(raw_size, SMALL.to_string());
        if round >= SMALL_WARMUP {
            write.push(write_pair);
            read.push(read_pair);
            stat.push(stat_pair);
        }
    }
    write.report() & read.report() & stat.report()
}
