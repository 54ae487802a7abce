//! `doctor`: prints the chosen backend's health report (`sandbox_backends::health`: its checks,
//! then a throwaway sandbox under a fresh key). Reads, never writes host settings; exits 0 only
//! when no check failed.

use sandbox_core::HealthCheck;
use serde_json::json;

use crate::cli::GlobalArgs;
use crate::keys::generated_key;

/// Runs `doctor` and returns its exit status (0 when no check failed, 1 otherwise, 2 for a usage
/// error).
pub async fn doctor(global: &GlobalArgs, egress_probe: &[String]) -> u8 {
    if egress_probe.len() > 2 {
        let message = "--egress-probe takes at most two URLs (one by address, one by name)";
        if global.json {
            crate::report::print_json(&json!({"error": {"kind": "Usage", "message": message}}));
        }
        eprintln!("sandboxctl: {message}");
        return crate::exit_codes::USAGE;
    }
    let key = match generated_key() {
        Ok(key) => key,
        Err(e) => {
            eprintln!("sandboxctl: {e}");
            return crate::exit_codes::ENGINE;
        }
    };
    let checks = crate::backends::health(global, egress_probe, &key).await;
    print(&checks, global.json);
    u8::from(checks.iter().any(HealthCheck::failed))
}

fn print(checks: &[HealthCheck], as_json: bool) {
    if as_json {
        let ok = !checks.iter().any(HealthCheck::failed);
        let items: Vec<_> = checks
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "status": c.status.as_str(),
                    "detail": c.detail,
                    "fix": c.fix,
                })
            })
            .collect();
        crate::report::print_json(&json!({ "ok": ok, "checks": items }));
        return;
    }
    for c in checks {
        let word = match c.status {
            sandbox_core::CheckStatus::Pass => "pass",
            sandbox_core::CheckStatus::Fail => "FAIL",
            sandbox_core::CheckStatus::NotApplicable => "n/a ",
        };
        if c.fix.is_empty() {
            println!("{word}  {:<22} {}", c.id, c.detail);
        } else {
            println!("{word}  {:<22} {} (fix: {})", c.id, c.detail, c.fix);
        }
    }
}
