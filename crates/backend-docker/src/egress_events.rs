//! Egress decisions surfaced to the host (docs/docker-backend.md#allowlist-egress): each proxy
//! logs one JSON line per decision on stderr; with an observer configured, the backend follows
//! the log of each proxy it serves a sandbox through (from the moment it starts following) and
//! hands every decision line to the observer as an [`EgressEvent`] of that sandbox.
//!
//! One follower per proxy container per process; it ends when the proxy's log ends (the proxy
//! stopped or was removed: a proxy made again is followed again by the acquire that made it), or
//! after [`FOLLOW_AT_MOST`]. A line that is not a decision (the ready line, a start-up error) is
//! skipped; a line is read at most [`MAX_LINE`] bytes long.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::query_parameters::LogsOptionsBuilder;
use futures_util::StreamExt as _;
use sandbox_core::credential::{EgressEvent, EgressObserver};

use crate::connection::EngineConnection;

/// The longest decision line read; the rest of a longer one is dropped with it.
pub(crate) const MAX_LINE: usize = 16 * 1024;
/// How long one follower runs at most (then an acquire follows the proxy again).
pub(crate) const FOLLOW_AT_MOST: Duration = Duration::from_secs(24 * 3600);

/// The event a proxy's decision line says, for `sandbox`; `None` for any other line.
pub(crate) fn parse_decision(line: &str, sandbox: &str) -> Option<EgressEvent> {
    let value: serde_json::Value = serde_json::from_str(line.trim_end()).ok()?;
    let object = value.as_object()?;
    let allowed = match object.get("decision")?.as_str()? {
        "allow" => true,
        "deny" => false,
        _ => return None,
    };
    let text = |key: &str| object.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    let number = |key: &str| object.get(key).and_then(serde_json::Value::as_u64);
    Some(EgressEvent {
        sandbox: sandbox.to_owned(),
        allowed,
        host: text("host"),
        port: number("port").and_then(|p| u16::try_from(p).ok()),
        method: text("method"),
        path: text("path"),
        rule: text("rule"),
        reason: text("reason").unwrap_or_default(),
        bytes_up: number("bytes_up"),
        bytes_down: number("bytes_down"),
        duration: number("duration_ms").map(Duration::from_millis),
        credential_applied: object
            .get("credential")
            .and_then(serde_json::Value::as_bool)
            == Some(true),
    })
}

/// Splits what arrived into whole lines, keeping a partial last line in `pending` (cut at
/// [`MAX_LINE`]: an overlong line is dropped whole).
pub(crate) fn whole_lines(
    pending: &mut Vec<u8>,
    arrived: &[u8],
    overlong: &mut bool,
) -> Vec<String> {
    let mut lines = Vec::new();
    for &byte in arrived {
        if byte == b'\n' {
            if !*overlong {
                lines.push(String::from_utf8_lossy(pending).into_owned());
            }
            pending.clear();
            *overlong = false;
        } else if pending.len() < MAX_LINE {
            pending.push(byte);
        } else {
            *overlong = true;
        }
    }
    lines
}

/// The followers of one backend.
#[derive(Debug)]
pub(crate) struct EgressFollowers {
    engine: EngineConnection,
    observer: Option<EgressObserver>,
    /// The proxies followed now, by container id.
    following: Arc<Mutex<HashSet<String>>>,
}

impl EgressFollowers {
    pub(crate) fn new(engine: EngineConnection, observer: Option<EgressObserver>) -> Self {
        EgressFollowers {
            engine,
            observer,
            following: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// Follows proxy `proxy` (a container id) for sandbox `sandbox` (its workload's id), unless
    /// no observer is configured or it is followed already.
    pub(crate) fn follow(&self, proxy: &str, sandbox: &str) {
        let Some(observer) = self.observer.clone() else {
            return;
        };
        {
            let mut following = self.following.lock().unwrap_or_else(|e| e.into_inner());
            if !following.insert(proxy.to_owned()) {
                return;
            }
        }
        let docker = self.engine.api().clone();
        let following = Arc::clone(&self.following);
        let (proxy, sandbox) = (proxy.to_owned(), sandbox.to_owned());
        tokio::spawn(async move {
            let since = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let options = LogsOptionsBuilder::new()
                .stderr(true)
                .follow(true)
                .since(i32::try_from(since).unwrap_or(i32::MAX))
                .build();
            let _ = tokio::time::timeout(FOLLOW_AT_MOST, async {
                let mut stream = docker.logs(&proxy, Some(options));
                let (mut pending, mut overlong) = (Vec::new(), false);
                while let Some(Ok(chunk)) = stream.next().await {
                    let LogOutput::StdErr { message } = chunk else {
                        continue;
                    };
                    for line in whole_lines(&mut pending, &message, &mut overlong) {
                        if let Some(event) = parse_decision(&line, &sandbox) {
                            tracing::debug!(%event, "egress decision");
                            observer.notify(&event);
                        }
                    }
                }
            })
            .await;
            following
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&proxy);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_lines_become_events_and_nothing_else_does() {
        let line = r#"{"decision":"allow","method":"GET","host":"api.test","port":443,"reason":"terminated","path":"/v1/x","rule":"api.test GET /v1/*","credential":true,"bytes_up":3,"bytes_down":120,"duration_ms":42}"#;
        let event = parse_decision(line, "c1").unwrap();
        assert_eq!(
            event,
            EgressEvent {
                sandbox: "c1".into(),
                allowed: true,
                host: Some("api.test".into()),
                port: Some(443),
                method: Some("GET".into()),
                path: Some("/v1/x".into()),
                rule: Some("api.test GET /v1/*".into()),
                reason: "terminated".into(),
                bytes_up: Some(3),
                bytes_down: Some(120),
                duration: Some(Duration::from_millis(42)),
                credential_applied: true,
            }
        );
        let deny = r#"{"decision":"deny","method":null,"host":null,"port":null,"reason":"too many connections","path":null,"rule":null,"credential":false,"bytes_up":null,"bytes_down":null,"duration_ms":null}"#;
        let event = parse_decision(deny, "c2").unwrap();
        assert!(!event.allowed);
        assert_eq!(event.reason, "too many connections");
        assert_eq!((event.host, event.port, event.duration), (None, None, None));
        assert!(!event.credential_applied);
        for other in [
            "maf-egress-proxy ready v1",
            "",
            "{}",
            r#"{"decision":"maybe"}"#,
            r#"{"decision":1}"#,
            "[1]",
        ] {
            assert_eq!(parse_decision(other, "c"), None, "{other}");
        }
        // A port out of range is no port; a credential that is not `true` was not applied.
        let odd = parse_decision(
            r#"{"decision":"deny","port":70000,"credential":"yes"}"#,
            "c",
        )
        .unwrap();
        assert_eq!(odd.port, None);
        assert!(!odd.credential_applied);
    }

    #[test]
    fn lines_are_whole_and_overlong_ones_dropped() {
        let (mut pending, mut overlong) = (Vec::new(), false);
        assert!(whole_lines(&mut pending, b"ab", &mut overlong).is_empty());
        assert_eq!(
            whole_lines(&mut pending, b"c\nde\nf", &mut overlong),
            ["abc", "de"]
        );
        assert_eq!(pending, b"f");
        let long = vec![b'x'; MAX_LINE + 5];
        assert!(whole_lines(&mut pending, &long, &mut overlong).is_empty());
        assert!(overlong);
        assert_eq!(pending.len(), MAX_LINE);
        assert_eq!(whole_lines(&mut pending, b"\nok\n", &mut overlong), ["ok"]);
        assert!(!overlong);
        let exact = vec![b'y'; MAX_LINE];
        let mut input = exact.clone();
        input.push(b'\n');
        assert_eq!(
            whole_lines(&mut pending, &input, &mut overlong),
            [String::from_utf8(exact).unwrap()]
        );
    }
}
