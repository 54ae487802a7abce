//! The egress decisions of the server's sandboxes, kept briefly so that an exec result can list
//! the destinations its command was refused (`egress_denied`): a model whose fetch failed learns
//! why. Bounded: at most [`PER_SANDBOX`] refusals per sandbox and [`SANDBOXES`] sandboxes, each
//! kept [`KEPT_FOR`]. Events carry no credential value, so neither does this log.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox_core::credential::{EgressEvent, EgressObserver};
use tokio::time::Instant;

/// Refusals kept per sandbox (the oldest go first).
pub const PER_SANDBOX: usize = 64;
/// Sandboxes with refusals kept at once (the longest quiet go first).
pub const SANDBOXES: usize = 1024;
/// How long a refusal is kept.
pub const KEPT_FOR: Duration = Duration::from_secs(600);
/// How long an exec of an allowlist sandbox waits after its command for the last decisions to
/// arrive from the proxy's log.
pub const SETTLE: Duration = Duration::from_millis(300);

/// The refusals of the server's sandboxes, by instance id.
#[derive(Debug, Default)]
pub struct EgressLog {
    denied: Mutex<HashMap<String, VecDeque<(Instant, String)>>>,
}

impl EgressLog {
    /// An observer that records every refusal in `log`.
    pub fn observer(log: &Arc<EgressLog>) -> EgressObserver {
        let log = Arc::clone(log);
        EgressObserver::new(move |event: &EgressEvent| log.record(event, Instant::now()))
    }

    /// Records `event` at `now` when it is a refusal.
    pub fn record(&self, event: &EgressEvent, now: Instant) {
        if event.allowed {
            return;
        }
        let mut denied = self.denied.lock().unwrap_or_else(|e| e.into_inner());
        denied.retain(|_, kept| {
            kept.back()
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) < KEPT_FOR)
        });
        if !denied.contains_key(&event.sandbox) && denied.len() >= SANDBOXES {
            let quietest = denied
                .iter()
                .min_by_key(|(_, kept)| kept.back().map(|(at, _)| *at))
                .map(|(id, _)| id.clone());
            if let Some(id) = quietest {
                denied.remove(&id);
            }
        }
        let kept = denied.entry(event.sandbox.clone()).or_default();
        if kept.len() >= PER_SANDBOX {
            kept.pop_front();
        }
        kept.push_back((now, event.to_string()));
    }

    /// The refusals of sandbox `instance` recorded at or after `since`, oldest first.
    pub fn denied_since(&self, instance: &str, since: Instant) -> Vec<String> {
        let denied = self.denied.lock().unwrap_or_else(|e| e.into_inner());
        denied
            .get(instance)
            .map(|kept| {
                kept.iter()
                    .filter(|(at, _)| *at >= since)
                    .map(|(_, line)| line.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deny(sandbox: &str, path: &str) -> EgressEvent {
        EgressEvent {
            sandbox: sandbox.into(),
            allowed: false,
            host: Some("api.test".into()),
            port: Some(443),
            method: Some("GET".into()),
            path: Some(path.into()),
            reason: format!("GET {path} matches no rule"),
            ..EgressEvent::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_are_kept_per_sandbox_bounded_and_briefly() {
        let log = Arc::new(EgressLog::default());
        let observer = EgressLog::observer(&log);
        let start = Instant::now();
        observer.notify(&deny("a", "/x"));
        observer.notify(&EgressEvent {
            allowed: true,
            ..deny("a", "/ok")
        });
        observer.notify(&deny("b", "/y"));
        assert_eq!(
            log.denied_since("a", start),
            ["deny GET api.test:443/x: GET /x matches no rule"]
        );
        assert_eq!(log.denied_since("b", start).len(), 1);
        assert!(log.denied_since("c", start).is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        let later = Instant::now();
        assert!(
            log.denied_since("a", later).is_empty(),
            "only since the exec began"
        );
        for n in 0..PER_SANDBOX + 3 {
            log.record(&deny("a", &format!("/{n}")), Instant::now());
        }
        let kept = log.denied_since("a", start);
        assert_eq!(kept.len(), PER_SANDBOX);
        assert!(
            kept[0].contains("/3:"),
            "the oldest went first: {}",
            kept[0]
        );
        // Past KEPT_FOR, a sandbox's refusals are dropped at the next record.
        tokio::time::advance(KEPT_FOR).await;
        log.record(&deny("c", "/z"), Instant::now());
        assert!(log.denied_since("a", start).is_empty());
        assert!(log.denied_since("b", start).is_empty());
        assert_eq!(log.denied_since("c", start).len(), 1);
    }

    #[test]
    fn the_quietest_sandbox_goes_when_too_many_are_kept() {
        let log = EgressLog::default();
        let start = Instant::now();
        for n in 0..SANDBOXES {
            log.record(
                &deny(&format!("s{n}"), "/"),
                start + Duration::from_millis(n as u64),
            );
        }
        log.record(&deny("new", "/"), start + Duration::from_secs(5));
        assert!(
            log.denied_since("s0", start).is_empty(),
            "the quietest went"
        );
        assert_eq!(log.denied_since("s1", start).len(), 1);
        assert_eq!(log.denied_since("new", start).len(), 1);
    }
}
