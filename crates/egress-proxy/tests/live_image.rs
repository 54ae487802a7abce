//! The proxy image on a real engine (feature `live`; needs `sandbox-egress-proxy:local` and
//! `sandbox-base:local`, built by `cargo xtask images`).
//!
//! An internal network of the test's own (`docker network create --internal`: nothing on it
//! routes anywhere but to its members), two `serve` containers under the aliases
//! `allowed.test` and `denied.test`, the proxy on that network with the socket in a fresh named
//! volume, and a `--network none` workload that runs the forwarder from the read-only volume
//! and curls through it. Every engine object has a random suffix and is removed on every exit.

#[path = "support/topology.rs"]
#[allow(dead_code)] // shared with the benchmark, which uses other parts of it
mod topology;

use std::time::Duration;

use topology::{
    docker, in_workload, internal_network, private_but_not_gateway, random_suffix, serve,
    start_proxy, Cleanup,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_filters_egress_from_a_closed_workload() {
    let suffix = random_suffix();
    let mut cleanup = Cleanup::default();
    let network = internal_network(&mut cleanup, &suffix).await;
    for host in ["allowed.test", "denied.test"] {
        serve(&mut cleanup, &suffix, &network, host, &["--body", host]).await;
    }
    let private = private_but_not_gateway(&network).await;
    let private: Vec<&str> = private.iter().map(String::as_str).collect();
    let volume = start_proxy(&mut cleanup, &suffix, "private", &network, &private).await;

    let out = in_workload(
        &mut cleanup,
        &suffix,
        &volume,
        "ls -ln /run/maf-egress; \
         for u in http://allowed.test/ http://denied.test/ http://ALLOWED.test/x http://allowed.test:8080/; do \
           curl -sS -m 10 -x http://127.0.0.1:3128 -w ' [%{http_code}]\\n' \"$u\"; done; \
         curl -sS -m 10 -p -x http://127.0.0.1:3128 -w ' [%{http_code}]\\n' http://allowed.test/; \
         /run/maf-egress/egress-forward forward --listen 127.0.0.1:3129 \
           --socket /run/maf-egress/absent.sock --handoff-socket /run/maf-egress/handoff.sock & \
         sleep 0.3; curl -sS -m 10 -x http://127.0.0.1:3129 -w ' [%{http_code}]\\n' http://allowed.test/; \
         curl -sS -m 10 --noproxy '*' http://allowed.test/ >/dev/null 2>&1; echo direct=$?",
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.iter().any(|l| l.contains("65532 65532")
            && l.ends_with("proxy.sock")
            && l.starts_with("srw-rw-rw-")),
        "{out}"
    );
    assert!(
        lines.iter().any(|l| l.contains("65532 65532")
            && l.ends_with("handoff.sock")
            && l.starts_with("srw-rw-rw-")),
        "{out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("-rwxr-xr-x") && l.ends_with("egress-forward")),
        "{out}"
    );
    let answers: Vec<&str> = lines.iter().copied().filter(|l| l.ends_with(']')).collect();
    assert_eq!(answers.len(), 6, "{out}");
    assert_eq!(answers[0], "allowed.test [200]", "{out}");
    assert!(
        answers[1].ends_with("[403]") && out.contains("host not on the allowlist"),
        "{out}"
    );
    assert_eq!(answers[2], "allowed.test [200]", "{out}");
    assert!(answers[3].ends_with("[403]"), "{out}");
    assert_eq!(
        answers[4], "allowed.test [200]",
        "a CONNECT tunnel carries it: {out}"
    );
    assert_eq!(
        answers[5], "allowed.test [200]",
        "a forwarder with no socket to relay to reaches the proxy only by handing off: {out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("direct=") && *l != "direct=0"),
        "{out}"
    );

    // The proxy logged one JSON decision per request.
    let proxy = format!("maf-egress-test-{suffix}-proxy-private");
    let (_, _, log) = docker(&["logs", &proxy], Duration::from_secs(30)).await;
    let decisions: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(decisions.len(), 6, "{log}");
    assert!(decisions
        .iter()
        .any(|d| d["decision"] == "deny" && d["host"] == "denied.test"));
    assert!(decisions
        .iter()
        .any(|d| d["decision"] == "allow" && d["method"] == "CONNECT"));

    // Without --allow-private the same allowed name resolves to a private address: refused.
    let closed = start_proxy(&mut cleanup, &suffix, "public", &network, &[]).await;
    let out = in_workload(
        &mut cleanup,
        &suffix,
        &closed,
        "curl -sS -m 10 -x http://127.0.0.1:3128 -w ' [%{http_code}]\\n' http://allowed.test/",
    )
    .await;
    assert!(
        out.contains("forbidden address (private") && out.trim_end().ends_with("[403]"),
        "{out}"
    );
    drop(cleanup);
}
