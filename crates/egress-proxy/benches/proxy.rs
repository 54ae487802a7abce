//! The egress proxy's cost on a download (docs/egress-proxy.md#cost), on a real engine (feature
//! `live`; needs `sandbox-egress-proxy:local` and `sandbox-base:local`).
//!
//! - Pass/fail: an HTTP GET of 1 MiB from an allowed `serve` container through forwarder and
//!   proxy, from a `--network none` workload, within 1.15× the same GET made directly from a
//!   container on the servers' internal network (wall, `curl`'s `time_total`, ratio of the two
//!   medians).
//! - Pass/fail: connection setup, the median time to first byte (`time_starttransfer`) through
//!   the proxy minus the direct one, at most 5 ms.
//! - The same two for a terminated HTTPS origin (1.3×, +10 ms), and 100 terminated connections
//!   started at once, none failing (the burst's wall against 100 direct TLS GETs at once is
//!   reported).
//!
//! The topology is the live test's (`tests/support/topology.rs`). Timing happens inside the
//! containers: one `docker exec` per side per batch runs `curl` several times, so the exec's own
//! cost stays out of the numbers; the sides alternate which goes first from batch to batch, to
//! share the machine's load. Prints `name: backend X ms, raw Y ms, ratio Z (target ≤ T)
//! PASS|FAIL [N rounds]` and `name: ours X ms, raw Y ms, added Z ms at p50 (target ≤ +T ms)
//! PASS|FAIL [N rounds]`, appends the rows to `target/bench/rows.jsonl`, and exits non-zero when
//! a target is missed.

#[path = "../tests/support/topology.rs"]
#[allow(dead_code)] // shared with the live test, which uses other parts of it
mod topology;

use std::time::Duration;

use paired_bench::{exit_with, in_turn, median, record_row, Metric, Target};
use topology::{
    docker, docker_ok, internal_network, private_but_not_gateway, random_suffix, serve,
    start_direct, start_proxy, start_workload, Cleanup,
};

/// The body `serve` answers with.
const SIZE: u64 = 1 << 20;
/// Discarded downloads per side before the measured ones.
const WARMUP: usize = 3;
/// Batches per side (one `docker exec` each).
const BATCHES: usize = 10;
/// Downloads per batch.
const PER_BATCH: usize = 15;
/// The wall target: through the proxy at most this many times the direct download.
const WALL_TARGET: f64 = 1.15;
/// The connection setup target: at most this much added to the time to first byte.
const SETUP_TARGET_MS: f64 = 5.0;
/// The deadline of one batch's `docker exec`.
const BATCH_DEADLINE: Duration = Duration::from_secs(120);

/// One download as `curl` timed it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    first_byte_ms: f64,
    total_ms: f64,
}

/// How one side reaches its origin.
struct Side<'a> {
    container: &'a str,
    curl_flags: &'a str,
    url: &'a str,
}

impl Side<'_> {
    /// Downloads the body `n` times in one `docker exec`; checks every answer is a 200 with the
    /// whole body.
    async fn batch(&self, n: usize) -> Vec<Sample> {
        let script = format!(
            "i=0; while [ $i -lt {n} ]; do i=$((i+1)); \
             curl -sS -m 30 {} -o /dev/null \
             -w '%{{http_code}} %{{size_download}} %{{time_starttransfer}} %{{time_total}}\\n' \
             {} || exit 1; done",
            self.curl_flags, self.url
        );
        let (code, out, err) = docker(
            &["exec", self.container, "sh", "-c", &script],
            BATCH_DEADLINE,
        )
        .await;
        assert_eq!(code, 0, "curl in {}: {out} {err}", self.container);
        let samples: Vec<Sample> = out.lines().map(parse_line).collect();
        assert_eq!(samples.len(), n, "one line per download: {out}");
        samples
    }

    /// Waits until a download answers (the forwarder starts with the workload), within 100
    /// tries 0.1 s apart.
    async fn wait_until_answers(&self) {
        let script = format!(
            "i=0; while [ $i -lt 100 ]; do i=$((i+1)); \
             curl -s -m 5 {} -o /dev/null {} && exit 0; sleep 0.1; done; exit 1",
            self.curl_flags, self.url
        );
        let (code, out, err) = docker(
            &["exec", self.container, "sh", "-c", &script],
            BATCH_DEADLINE,
        )
        .await;
        assert_eq!(code, 0, "{} never answered: {out} {err}", self.url);
    }
}

/// Parses `CODE SIZE FIRST_BYTE_S TOTAL_S`; panics unless it is a 200 of the whole body.
fn parse_line(line: &str) -> Sample {
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 4, "a curl timing line: {line:?}");
    assert_eq!(fields[0], "200", "an answer of 200: {line:?}");
    assert_eq!(
        fields[1].parse::<f64>().ok(),
        Some(SIZE as f64),
        "the whole body: {line:?}"
    );
    let seconds = |s: &str| s.parse::<f64>().expect("curl prints seconds") * 1000.0;
    Sample {
        first_byte_ms: seconds(fields[2]),
        total_ms: seconds(fields[3]),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let suffix = random_suffix();
    let mut cleanup = Cleanup::default();
    let network = internal_network(&mut cleanup, &suffix).await;
    let size = SIZE.to_string();
    serve(
        &mut cleanup,
        &suffix,
        &network,
        "allowed.test",
        &["--size", &size],
    )
    .await;
    let private = private_but_not_gateway(&network).await;
    let private: Vec<&str> = private.iter().map(String::as_str).collect();
    let volume = start_proxy(&mut cleanup, &suffix, "bench", &network, &private).await;
    let workload = start_workload(&mut cleanup, &suffix, &volume).await;
    let direct = start_direct(&mut cleanup, &suffix, &network).await;

    let proxied = Side {
        container: &workload,
        curl_flags: "-x http://127.0.0.1:3128",
        url: "http://allowed.test/",
    };
    let direct_side = Side {
        container: &direct,
        curl_flags: "--noproxy '*'",
        url: "http://allowed.test/",
    };
    proxied.wait_until_answers().await;
    let (wall_pass, setup_pass) = report(
        &proxied,
        &direct_side,
        ("proxy GET 1 MiB wall", WALL_TARGET),
        ("proxy connection setup", SETUP_TARGET_MS),
    )
    .await;

    let tls_pass = tls_rows(&mut cleanup, &suffix, &network, &private, &direct).await;

    drop(cleanup);
    exit_with(wall_pass && setup_pass && tls_pass);
}

/// Warms both sides up, then downloads in alternating batches; the samples of each.
async fn alternate(ours_side: &Side<'_>, raw_side: &Side<'_>) -> (Vec<Sample>, Vec<Sample>) {
    ours_side.batch(WARMUP).await;
    raw_side.batch(WARMUP).await;
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for batch in 0..BATCHES {
        let (o, r) = in_turn(batch, ours_side.batch(PER_BATCH), raw_side.batch(PER_BATCH)).await;
        ours.extend(o);
        raw.extend(r);
    }
    (ours, raw)
}

/// Downloads through `ours_side` against `raw_side` and reports two rows: the wall time
/// (`wall`: its name and the largest ratio of the medians that passes) and the connection setup
/// (`setup`: its name and the most milliseconds the proxy may add to the time to first byte).
/// Whether each was met.
async fn report(
    ours_side: &Side<'_>,
    raw_side: &Side<'_>,
    (wall_name, wall_target): (&str, f64),
    (setup_name, setup_target_ms): (&str, f64),
) -> (bool, bool) {
    let (ours, raw) = alternate(ours_side, raw_side).await;
    // Each side downloads in batches of its own, so a sample has no partner on the other side.
    let mut wall = Metric::new(wall_name, Target::AtMost(wall_target)).of_batches();
    let mut setup = Metric::new(setup_name, Target::ReportedOnly).of_batches();
    for (ours, raw) in ours.iter().zip(&raw) {
        wall.push_ms(ours.total_ms, raw.total_ms);
        setup.push_ms(ours.first_byte_ms, raw.first_byte_ms);
    }
    (
        wall.report(),
        setup.report_added(setup_name, setup_target_ms),
    )
}

/// The terminated wall target: through the proxy (two TLS sessions, the request judged) at most
/// this many times the direct TLS download.
const TLS_WALL_TARGET: f64 = 1.30;
/// The terminated setup target, a cached leaf: at most this much added to the time to first byte.
const TLS_SETUP_TARGET_MS: f64 = 10.0;

/// A CA of the bench's own and a leaf for `secure.test` (PEM: CA, leaf, key).
fn origin_certificates() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("a CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // A name of its own: a leaf whose issuer's name equals its subject's reads as self-signed
    // to OpenSSL (rcgen gives both the same default name).
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "egress bench origin CA");
    let ca = params.self_signed(&ca_key).expect("the CA");
    let leaf_key = KeyPair::generate().expect("a leaf key");
    let leaf = CertificateParams::new(vec!["secure.test".to_owned()])
        .expect("leaf params")
        .signed_by(&leaf_key, &ca, &ca_key)
        .expect("the leaf");
    (ca.pem(), leaf.pem(), leaf_key.serialize_pem())
}

/// `proxy TLS GET 1 MiB wall` and `proxy TLS setup`: an HTTPS origin of the bench's own
/// (`secure.test`, its CA given to the proxy as an upstream bundle), a proxy that terminates it
/// (a rule for it), the workload trusting the proxy's CA, against the same GET made directly
/// over TLS. Whether both targets were met.
async fn tls_rows(
    cleanup: &mut Cleanup,
    suffix: &str,
    network: &str,
    private: &[&str],
    direct: &str,
) -> bool {
    let (ca, cert, key) = origin_certificates();
    let size = SIZE.to_string();
    // TLS on port 80: `serve` listens there, and 80 is a port the proxy serves.
    serve(
        cleanup,
        suffix,
        network,
        "secure.test",
        &[
            "--size",
            &size,
            "--tls-cert-pem",
            &cert,
            "--tls-key-pem",
            &key,
        ],
    )
    .await;
    // The origin's CA reaches the proxy in its volume, written before the proxy starts (the
    // volume then owned by the proxy's user, as a fresh one would be).
    let volume = format!("maf-egress-test-{suffix}-tls");
    cleanup.volumes.push(volume.clone());
    docker_ok(&["volume", "create", &volume]).await;
    let mount = format!("{volume}:/v");
    let write = format!(
        "printf '%s' '{ca}' > /v/origin-ca.pem && chown -R 65532:65532 /v && chmod 0755 /v"
    );
    docker_ok(&[
        "run",
        "--rm",
        "--pull=never",
        "--user",
        "0",
        "--network",
        "none",
        "-v",
        &mount,
        topology::WORKLOAD_IMAGE,
        "sh",
        "-c",
        &write,
    ])
    .await;
    let mut extra: Vec<&str> = private.to_vec();
    extra.extend([
        "--allow",
        "secure.test",
        "--rule",
        "secure.test GET /*",
        "--ca-cert-out",
        "/run/maf-egress/ca.pem",
        "--upstream-ca",
        "/run/maf-egress/origin-ca.pem",
    ]);
    let volume = start_proxy(cleanup, suffix, "tls", network, &extra).await;
    let workload = start_workload(cleanup, suffix, &volume).await;
    let direct_ca = format!("printf '%s' '{ca}' > /tmp/origin-ca.pem");
    docker_ok(&["exec", direct, "sh", "-c", &direct_ca]).await;
    let terminated = Side {
        container: &workload,
        curl_flags: "-x http://127.0.0.1:3128 --cacert /run/maf-egress/ca.pem",
        url: "https://secure.test:80/",
    };
    let straight = Side {
        container: direct,
        curl_flags: "--noproxy '*' --cacert /tmp/origin-ca.pem",
        url: "https://secure.test:80/",
    };
    terminated.wait_until_answers().await;
    let (wall_pass, setup_pass) = report(
        &terminated,
        &straight,
        ("proxy TLS GET 1 MiB wall", TLS_WALL_TARGET),
        ("proxy TLS setup", TLS_SETUP_TARGET_MS),
    )
    .await;
    let burst_pass = burst_row(&terminated, &straight).await;
    wall_pass && setup_pass && burst_pass
}

/// Connections of one burst.
const BURST: usize = 100;
/// Bursts per side, the sides taking turns to go first.
const BURST_ROUNDS: usize = 3;

/// `proxy TLS 100 concurrent`: 100 terminated GETs started at once, every one answered 200 with
/// the whole body (the target: none failed); the burst's wall (median of the rounds) is reported
/// against 100 direct TLS GETs started at once.
async fn burst_row(terminated: &Side<'_>, straight: &Side<'_>) -> bool {
    let (mut ours_walls, mut raw_walls, mut failed) = (Vec::new(), Vec::new(), 0);
    for round in 0..BURST_ROUNDS {
        let ((ours_wall, lost), (raw_wall, raw_lost)) =
            in_turn(round, burst(terminated, BURST), burst(straight, BURST)).await;
        assert_eq!(raw_lost, 0, "a direct GET of the burst failed");
        ours_walls.push(ours_wall);
        raw_walls.push(raw_wall);
        failed += lost;
    }
    let (ours, raw) = (median(ours_walls), median(raw_walls));
    let pass = failed == 0;
    let name = "proxy TLS 100 concurrent";
    println!(
        "{name}: ours {ours:.1} ms, raw {raw:.1} ms, ratio {:.2}, {failed} of {} failed (target 0 failed) {} [{BURST_ROUNDS} rounds]",
        ours / raw,
        BURST * BURST_ROUNDS,
        if pass { "PASS" } else { "FAIL" }
    );
    record_row(name, ours, raw, ours / raw, "0 failed", pass);
    pass
}

/// Starts `n` downloads at once in one `docker exec` and waits for all of them: the burst's wall
/// (timed inside the container) and how many did not answer 200 with the whole body.
async fn burst(side: &Side<'_>, n: usize) -> (f64, usize) {
    let script = format!(
        "d=$(mktemp -d); s=$(date +%s%N); i=0; while [ $i -lt {n} ]; do i=$((i+1)); \
         (curl -sS -m 60 {} -o /dev/null -w '%{{http_code}} %{{size_download}}\\n' {} \
         || echo failed) > $d/$i 2>&1 & done; wait; e=$(date +%s%N); \
         cat $d/*; rm -r $d; echo wall $(( (e - s) / 1000 ))",
        side.curl_flags, side.url
    );
    let (code, out, err) = docker(
        &["exec", side.container, "sh", "-c", &script],
        BATCH_DEADLINE,
    )
    .await;
    assert_eq!(code, 0, "the burst in {}: {out} {err}", side.container);
    let whole = format!("200 {SIZE}");
    let answered = out.lines().filter(|line| *line == whole).count();
    let wall_us: f64 = out
        .lines()
        .find_map(|line| line.strip_prefix("wall "))
        .and_then(|us| us.trim().parse().ok())
        .unwrap_or_else(|| panic!("no wall line: {out}"));
    (wall_us / 1000.0, n - answered.min(n))
}
