//! EGRESS (docs/conformance.md#the-suites): an allowlisted host is reachable and any other host is not.

use std::time::Duration;

use sandbox_core::{Capability, Command, ExecOutput};

use crate::error::ConformanceError;
use crate::paths::ConformancePaths;
use crate::report::ConformanceReport;
use crate::subject::ConformanceSubject;
use crate::suite_runner::{ensure, ProbeError, SuiteRun, Verdict};

/// The EGRESS suite label.
pub const EGRESS: &str = "EGRESS";
/// The EGRESS_METHODS suite label.
pub const EGRESS_METHODS: &str = "EGRESS_METHODS";

/// The EGRESS probes, in the order they run.
const EGRESS_PROBE_TABLE: &[&str] = &["an-allowed-host-is-reachable", "a-denied-host-is-refused"];

/// The EGRESS_PATHS suite label.
pub const EGRESS_PATHS: &str = "EGRESS_PATHS";

/// The EGRESS_PATHS probes, in the order they run.
const EGRESS_PATHS_PROBE_TABLE: &[&str] = &[
    "an-unscoped-path-is-reachable",
    "a-scoped-path-is-reachable",
    "a-path-outside-the-rule-is-refused",
    "a-dot-segment-bypass-is-refused",
    "an-encoded-dot-segment-bypass-is-refused",
    "a-parameter-dot-segment-bypass-is-refused",
];

/// The EGRESS_METHODS probes, in the order they run.
const EGRESS_METHODS_PROBE_TABLE: &[&str] = &[
    "an-unscoped-post-is-reachable",
    "a-scoped-get-is-reachable",
    "a-scoped-post-is-refused",
];

/// `value` single-quoted for `sh`.
pub(crate) fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

/// The curl bound: 5/6 of the exec timeout, printed `%.3f`.
fn curl_bound(exec_timeout: Duration) -> String {
    format!("{:.3}", exec_timeout.as_secs_f64() * 5.0 / 6.0)
}

fn validate_timeout(exec_timeout: Duration) -> Result<(), ConformanceError> {
    if exec_timeout < Duration::from_secs(1) {
        return Err(ConformanceError::InvalidArgument(format!(
            "the EGRESS exec timeout {exec_timeout:?} must be at least 1 s"
        )));
    }
    Ok(())
}

async fn curl(
    subject: &dyn ConformanceSubject,
    method: Option<&str>,
    url: &str,
    exec_timeout: Duration,
) -> Result<ExecOutput, ProbeError> {
    let method = method
        .map(|m| format!("-X {} ", shell_quote(m)))
        .unwrap_or_default();
    let line = format!(
        "curl -s -o /dev/null -w '%{{http_code}}' --path-as-is {method}--max-time {} {}",
        curl_bound(exec_timeout),
        shell_quote(url)
    );
    // EGRESS has its own timeout, not the subject's probe timeout.
    let wd = ConformancePaths::under(subject.working_directory()).work;
    let request = sandbox_core::ExecRequest::new(Command::argv(["sh", "-c", &line]))
        .working_directory(wd)
        .timeout(exec_timeout);
    Ok(subject.sandbox().exec(request).await?)
}

/// Reached ⇔ exit 0 and the printed status starts with `2`.
fn reached(output: &ExecOutput) -> bool {
    output.exit_code == 0 && output.stdout_text().trim().starts_with('2')
}

/// Asserts egress confinement on a sandbox acquired with `egress = allowlist` naming the allowed host.
/// Both URLs must answer 2xx when reached; `exec_timeout` must be at least 1 s (the reference value is
/// [`EGRESS_EXEC_TIMEOUT`](crate::fixtures::EGRESS_EXEC_TIMEOUT)). Gate `exec`.
pub async fn assert_egress(
    subject: &dyn ConformanceSubject,
    allowed_url: &str,
    denied_url: &str,
    exec_timeout: Duration,
) -> Result<ConformanceReport, ConformanceError> {
    validate_timeout(exec_timeout)?;
    let mut suite = SuiteRun::start(
        EGRESS,
        EGRESS_PROBE_TABLE,
        Some(Capability::Exec),
        subject.capabilities(),
        Verdict::Aggregate,
    )?;
    suite
        .probe("an-allowed-host-is-reachable", &[Capability::Exec], async {
            let out = curl(subject, None, allowed_url, exec_timeout).await?;
            ensure!(
                reached(&out),
                "the allowed URL was not reached (exit {}, status {:?})",
                out.exit_code,
                out.stdout_text().trim()
            );
            Ok(())
        })
        .await;
    suite
        .probe("a-denied-host-is-refused", &[Capability::Exec], async {
            let out = curl(subject, None, denied_url, exec_timeout).await?;
            ensure!(
                !reached(&out),
                "the denied URL was reached (status {:?})",
                out.stdout_text().trim()
            );
            Ok(())
        })
        .await;
    suite.finish()
}

/// One method-scoped request: a harness error when curl is missing (126/127); reached ⇔ exit 0 and a
/// three-digit status starting with `2`.
async fn method_reached(
    subject: &dyn ConformanceSubject,
    method: &str,
    url: &str,
    exec_timeout: Duration,
) -> Result<bool, ProbeError> {
    let out = curl(subject, Some(method), url, exec_timeout).await?;
    if matches!(out.exit_code, 126 | 127) {
        return Err(ProbeError::Harness(format!(
            "curl could not run (exit {})",
            out.exit_code
        )));
    }
    let status = out.stdout_text();
    let status = status.trim();
    Ok(out.exit_code == 0
        && status.len() == 3
        && status.bytes().all(|b| b.is_ascii_digit())
        && status.starts_with('2'))
}

/// The optional EGRESS_METHODS suite: `scoped` allows only GET to the URL's host, `control` allows the
/// host unscoped. Both subjects must declare `egress_methods`.
pub async fn assert_egress_methods(
    scoped: &dyn ConformanceSubject,
    control: &dyn ConformanceSubject,
    url: &str,
    exec_timeout: Duration,
) -> Result<ConformanceReport, ConformanceError> {
    validate_timeout(exec_timeout)?;
    if !control.capabilities().contains(&Capability::EgressMethods) {
        return Err(ConformanceError::gate_not_declared(
            EGRESS_METHODS,
            Capability::EgressMethods,
        ));
    }
    let mut suite = SuiteRun::start(
        EGRESS_METHODS,
        EGRESS_METHODS_PROBE_TABLE,
        Some(Capability::EgressMethods),
        scoped.capabilities(),
        Verdict::Aggregate,
    )?;
    suite
        .probe("an-unscoped-post-is-reachable", &[], async {
            ensure!(
                method_reached(control, "POST", url, exec_timeout).await?,
                "the control's POST was not reached"
            );
            Ok(())
        })
        .await;
    suite
        .probe("a-scoped-get-is-reachable", &[], async {
            ensure!(
                method_reached(scoped, "GET", url, exec_timeout).await?,
                "the GET-only rule refused a GET"
            );
            Ok(())
        })
        .await;
    suite
        .probe("a-scoped-post-is-refused", &[], async {
            ensure!(
                !method_reached(scoped, "POST", url, exec_timeout).await?,
                "the GET-only rule let a POST through"
            );
            Ok(())
        })
        .await;
    suite.finish()
}

/// The optional EGRESS_PATHS suite: `scoped` allows GET on the paths `/v1/*` only of `origin`'s
/// host (`origin` is `scheme://host[:port]`, no path), `control` allows the host unscoped; the
/// origin answers 2xx on every path. Requests are sent with their paths as written (`curl
/// --path-as-is`), so the dot-segment bypasses reach the egress enforcement unnormalised. Both
/// subjects must declare `egress_paths`.
pub async fn assert_egress_paths(
    scoped: &dyn ConformanceSubject,
    control: &dyn ConformanceSubject,
    origin: &str,
    exec_timeout: Duration,
) -> Result<ConformanceReport, ConformanceError> {
    validate_timeout(exec_timeout)?;
    if !control.capabilities().contains(&Capability::EgressPaths) {
        return Err(ConformanceError::gate_not_declared(
            EGRESS_PATHS,
            Capability::EgressPaths,
        ));
    }
    let mut suite = SuiteRun::start(
        EGRESS_PATHS,
        EGRESS_PATHS_PROBE_TABLE,
        Some(Capability::EgressPaths),
        scoped.capabilities(),
        Verdict::Aggregate,
    )?;
    let url = |path: &str| format!("{origin}{path}");
    suite
        .probe("an-unscoped-path-is-reachable", &[], async {
            ensure!(
                method_reached(control, "GET", &url("/admin"), exec_timeout).await?,
                "the control's GET /admin was not reached"
            );
            Ok(())
        })
        .await;
    suite
        .probe("a-scoped-path-is-reachable", &[], async {
            ensure!(
                method_reached(scoped, "GET", &url("/v1/x"), exec_timeout).await?,
                "the /v1/* rule refused GET /v1/x"
            );
            Ok(())
        })
        .await;
    for (probe, path) in [
        ("a-path-outside-the-rule-is-refused", "/admin"),
        ("a-dot-segment-bypass-is-refused", "/v1/../admin"),
        (
            "an-encoded-dot-segment-bypass-is-refused",
            "/v1/%2e%2e/admin",
        ),
        ("a-parameter-dot-segment-bypass-is-refused", "/v1/..;/admin"),
    ] {
        suite
            .probe(probe, &[], async {
                ensure!(
                    !method_reached(scoped, "GET", &url(path), exec_timeout).await?,
                    "the /v1/* rule let GET {path} through"
                );
                Ok(())
            })
            .await;
    }
    suite.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_bounds() {
        assert_eq!(shell_quote("http://a/'x"), "'http://a/'\\''x'");
        assert_eq!(curl_bound(Duration::from_secs(30)), "25.000");
        assert_eq!(curl_bound(Duration::from_secs(1)), "0.833");
        assert!(validate_timeout(Duration::from_millis(999)).is_err());
    }
}
