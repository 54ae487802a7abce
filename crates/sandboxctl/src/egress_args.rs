//! The egress events `run --json` reports. (`run`'s `--rule` and `--credential-file` are parsed
//! by `sandbox_backends::egress_flags`, shared with the MCP server.) A credential's token never
//! appears in the report: events carry none.

use sandbox_core::credential::EgressEvent;
use serde_json::{json, Value};

/// One event as `run --json` reports it (never a credential's value: events carry none).
pub(crate) fn event_json(event: &EgressEvent) -> Value {
    json!({
        "decision": if event.allowed { "allow" } else { "deny" },
        "host": event.host,
        "port": event.port,
        "method": event.method,
        "path": event.path,
        "rule": event.rule,
        "reason": event.reason,
        "bytes_up": event.bytes_up,
        "bytes_down": event.bytes_down,
        "duration_ms": event.duration.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "credential_applied": event.credential_applied,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn events_report_every_field_and_no_value() {
        let event = EgressEvent {
            sandbox: "c".into(),
            allowed: false,
            host: Some("api.test".into()),
            port: Some(443),
            method: Some("POST".into()),
            path: Some("/v1/x".into()),
            rule: None,
            reason: "POST /v1/x matches no rule".into(),
            bytes_up: None,
            bytes_down: None,
            duration: Some(Duration::from_millis(12)),
            credential_applied: false,
        };
        assert_eq!(
            event_json(&event),
            json!({
                "decision": "deny", "host": "api.test", "port": 443, "method": "POST",
                "path": "/v1/x", "rule": null, "reason": "POST /v1/x matches no rule",
                "bytes_up": null, "bytes_down": null, "duration_ms": 12,
                "credential_applied": false,
            })
        );
        let allowed = EgressEvent {
            allowed: true,
            credential_applied: true,
            ..event
        };
        assert_eq!(event_json(&allowed)["decision"], "allow");
        assert_eq!(event_json(&allowed)["credential_applied"], true);
    }
}
