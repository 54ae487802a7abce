//! The operator's egress flags, shared by every host binary (`sandboxctl run`, `sandbox-mcp`):
//! method and path rules (`--rule 'HOST METHODS PATHS'`) and credential grants
//! (`--credential-file PATH`), parsed into the core's [`EgressRule`] and [`CredentialGrant`] in one
//! place, so both hosts accept exactly the same text.
//!
//! A credential file is read through the one guarded opener of host reads (`host-files`), as a
//! credential the operator names on purpose (so a credential path is not refused; a backend's host
//! state and pseudo file systems are). Its token never appears in an error: errors name the file
//! and the field, never a value.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use host_files::{HostPathGuard, Source};
use sandbox_core::credential::{BearerToken, CredentialGrant};
use sandbox_core::{EgressRule, SandboxBackend, SandboxError};

use crate::BackendArgs;
use serde_json::Value;

/// The largest credential file read.
pub const MAX_CREDENTIAL_FILE: u64 = 64 * 1024;

/// Parses a `--rule 'HOST METHODS PATHS'`: single spaces, `METHODS` and `PATHS` comma-separated, each
/// `*` for all.
///
/// # Errors
/// InvalidArgument naming the flag and the rule.
pub fn parse_rule(text: &str) -> Result<EgressRule, SandboxError> {
    let fields: Vec<&str> = text.split(' ').collect();
    let [host, methods, paths] = fields[..] else {
        return Err(SandboxError::invalid(format!(
            "--rule {text:?}: expected 'HOST METHODS PATHS' (e.g. 'api.example.com GET,HEAD /v1/*')"
        )));
    };
    let list = |field: &str| {
        (field != "*").then(|| field.split(',').map(str::to_owned).collect::<Vec<_>>())
    };
    EgressRule::new(host, list(methods), list(paths))
        .map_err(|e| SandboxError::invalid(format!("--rule {text:?}: {e}")))
}

/// A credential file's grant: one JSON object `{"host", "port" (default 443), "methods" (a list,
/// or `"*"`, the default), "paths" (a list), "token", and "expires_in_secs" or "expires_unix"}`.
/// `shown` names the file in errors; `now` is when a relative expiry starts.
///
/// # Errors
/// InvalidArgument naming the file and the field at fault, never a value.
pub fn parse_credential(
    text: &[u8],
    shown: &str,
    now: SystemTime,
) -> Result<CredentialGrant, SandboxError> {
    let bad = |why: &str| SandboxError::invalid(format!("--credential-file {shown}: {why}"));
    let value: Value = serde_json::from_slice(text).map_err(|_| bad("not a JSON object"))?;
    let object = value.as_object().ok_or_else(|| bad("not a JSON object"))?;
    const FIELDS: [&str; 7] = [
        "host",
        "port",
        "methods",
        "paths",
        "token",
        "expires_in_secs",
        "expires_unix",
    ];
    if object.keys().any(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(
            "an unknown field (host, port, methods, paths, token, expires_in_secs, expires_unix)",
        ));
    }
    let host = object
        .get("host")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("`host` must be a string"))?;
    let port = match object.get("port") {
        None => 443,
        Some(port) => port
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| bad("`port` must be 1..=65535"))?,
    };
    let strings = |list: &Vec<Value>, what: &str| {
        list.iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad(&format!("`{what}` must list strings")))
    };
    let methods = match object.get("methods") {
        None => None,
        Some(Value::String(star)) if star == "*" => None,
        Some(Value::Array(list)) => Some(strings(list, "methods")?),
        Some(_) => return Err(bad("`methods` must be \"*\" or a list")),
    };
    let paths = match object.get("paths") {
        Some(Value::Array(list)) => strings(list, "paths")?,
        _ => return Err(bad("`paths` must be a list of path prefixes")),
    };
    let token = object
        .get("token")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("`token` must be a string"))?;
    let token = BearerToken::new(token).map_err(|e| bad(&e.to_string()))?;
    let expires = match (object.get("expires_in_secs"), object.get("expires_unix")) {
        (Some(secs), None) => secs
            .as_u64()
            .and_then(|s| now.checked_add(Duration::from_secs(s)))
            .ok_or_else(|| bad("`expires_in_secs` must be a number of seconds"))?,
        (None, Some(unix)) => unix
            .as_u64()
            .and_then(|s| SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(s)))
            .ok_or_else(|| bad("`expires_unix` must be seconds since the epoch"))?,
        _ => {
            return Err(bad(
                "give exactly one of `expires_in_secs` and `expires_unix`",
            ))
        }
    };
    CredentialGrant::new(host, port, methods, paths, token, expires)
        .map_err(|e| bad(&e.to_string()))
}

/// Reads and parses one `--credential-file` through `guard`.
///
/// # Errors
/// NotPermitted when the guard refuses the path; InvalidArgument for a file that cannot be
/// read or parsed (naming the file, never its content).
pub fn read_credential(
    path: &Path,
    guard: &HostPathGuard,
) -> Result<CredentialGrant, SandboxError> {
    let shown = path.display().to_string();
    // A credential the operator names on purpose: credential paths are not refused here, a
    // backend's host state and pseudo file systems are.
    let text = Source::open(path, guard, true)
        .and_then(|source| source.read_capped(MAX_CREDENTIAL_FILE))
        .map_err(|e| match e {
            SandboxError::NotPermitted(why) => {
                SandboxError::NotPermitted(format!("--credential-file: {why}"))
            }
            other => SandboxError::invalid(format!("--credential-file {shown}: {other}")),
        })?;
    parse_credential(&text, &shown, SystemTime::now())
}

/// Reads every `--credential-file` in `paths` through the host guard of `backend` and the
/// backends `args` configure ([`crate::host_guard`] with no output root, so it admits no write):
/// the one way a host binary reads an operator's credentials.
///
/// # Errors
/// As [`read_credential`], for the first file that fails; the backend's failure to report its
/// host state roots.
///
/// # Cancel safety and drop
/// Dropping the future drops the backend's request in flight; nothing is read after it.
pub async fn read_credentials(
    args: &BackendArgs,
    backend: &dyn SandboxBackend,
    paths: &[PathBuf],
) -> Result<Vec<CredentialGrant>, SandboxError> {
    if paths.is_empty() {
        return Ok(Vec::new());
    }
    let guard = crate::host_guard(args, backend, None).await?;
    paths
        .iter()
        .map(|path| read_credential(path, &guard))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_from_three_fields() {
        let rule = parse_rule("api.example.com GET,HEAD /v1/*,/health").unwrap();
        assert_eq!(rule.host(), "api.example.com");
        assert_eq!(
            rule.methods(),
            Some(&["GET".to_owned(), "HEAD".to_owned()][..])
        );
        assert_eq!(
            rule.paths(),
            Some(&["/v1/*".to_owned(), "/health".to_owned()][..])
        );
        let any = parse_rule("a.test * /x").unwrap();
        assert_eq!(any.methods(), None);
        let all_paths = parse_rule("a.test POST *").unwrap();
        assert_eq!(all_paths.paths(), None);
        for bad in [
            "a.test GET",
            "a.test  GET /x",
            "a.test GET /x extra",
            "a.test get /x",
            "a.test GET v1",
            "1.2.3.4 GET /x",
            "",
        ] {
            let error = parse_rule(bad).expect_err(bad);
            assert!(error.to_string().contains("--rule"), "{error}");
        }
    }

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000)
    }

    #[test]
    fn credential_files_parse_with_defaults_and_never_echo_the_token() {
        let grant = parse_credential(
            br#"{"host":"api.test","paths":["/v1/*"],"token":"SECRET-tok","expires_in_secs":60}"#,
            "f",
            now(),
        )
        .unwrap();
        assert_eq!(grant.host(), "api.test");
        assert_eq!(grant.port(), 443);
        assert_eq!(grant.methods(), None);
        assert_eq!(grant.paths(), &["/v1/*".to_owned()]);
        assert_eq!(grant.token().reveal(), "SECRET-tok");
        assert_eq!(grant.expires(), now() + Duration::from_secs(60));
        let grant = parse_credential(
            br#"{"host":"api.test","port":8443,"methods":["GET"],"paths":["/"],"token":"t","expires_unix":5}"#,
            "f",
            now(),
        )
        .unwrap();
        assert_eq!(grant.port(), 8443);
        assert_eq!(grant.methods(), Some(&["GET".to_owned()][..]));
        assert_eq!(grant.expires_unix(), 5);

        for (bad, needle) in [
            (&b"SECRET-tok"[..], "not a JSON object"),
            (b"[\"SECRET-tok\"]", "not a JSON object"),
            (br#"{"host":"a.test","paths":["/"],"token":"SECRET-tok","expires_in_secs":1,"x":"SECRET-tok"}"#, "unknown field"),
            (br#"{"host":"a.test","paths":["/"],"token":"SECRET tok","expires_in_secs":1}"#, "b64token"),
            (br#"{"host":"a.test","paths":["/"],"token":"SECRET-tok"}"#, "exactly one"),
            (br#"{"host":"a.test","paths":["/"],"token":"SECRET-tok","expires_in_secs":1,"expires_unix":1}"#, "exactly one"),
            (br#"{"host":"a.test","paths":"/","token":"SECRET-tok","expires_in_secs":1}"#, "`paths`"),
            (br#"{"host":"a.test","paths":["/"],"methods":"GET","token":"SECRET-tok","expires_in_secs":1}"#, "`methods`"),
            (br#"{"host":"a.test","paths":["/"],"methods":[1],"token":"SECRET-tok","expires_in_secs":1}"#, "`methods`"),
            (br#"{"host":"a.test","port":0,"paths":["/"],"token":"SECRET-tok","expires_in_secs":1}"#, "port 0"),
            (br#"{"host":"a.test","port":70000,"paths":["/"],"token":"SECRET-tok","expires_in_secs":1}"#, "`port`"),
            (br#"{"host":"*.a.test","paths":["/"],"token":"SECRET-tok","expires_in_secs":1}"#, "exact host"),
            (br#"{"paths":["/"],"token":"SECRET-tok","expires_in_secs":1}"#, "`host`"),
            (br#"{"host":"a.test","paths":["/"],"token":7,"expires_in_secs":1}"#, "`token`"),
            (br#"{"host":"a.test","paths":["/"],"token":"SECRET-tok","expires_in_secs":-1}"#, "expires_in_secs"),
        ] {
            let error = parse_credential(bad, "cred.json", now()).expect_err(needle).to_string();
            assert!(error.contains(needle), "{error} lacks {needle}: {}", String::from_utf8_lossy(bad));
            assert!(
                error.starts_with("invalid argument: --credential-file cred.json: "),
                "{error}"
            );
            assert!(!error.contains("SECRET"), "{error} quotes the token");
        }
    }

    #[test]
    fn credential_files_are_read_through_the_guard() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("grant.json");
        std::fs::write(
            &file,
            br#"{"host":"api.test","paths":["/v1/*"],"token":"tok","expires_in_secs":60}"#,
        )
        .unwrap();
        let guard = host_files::host_guard([], None).unwrap();
        assert_eq!(read_credential(&file, &guard).unwrap().host(), "api.test");
        // A backend's host state is refused, as every guarded read refuses it.
        let state = host_files::host_guard([dir.path().to_path_buf()], None).unwrap();
        let refused = read_credential(&file, &state).unwrap_err();
        assert!(
            matches!(refused, SandboxError::NotPermitted(_)),
            "{refused}"
        );
        assert!(
            refused
                .to_string()
                .starts_with("not permitted: --credential-file: "),
            "{refused}"
        );
        // Too large, a directory, missing: bad arguments naming the file.
        std::fs::write(&file, vec![b' '; MAX_CREDENTIAL_FILE as usize + 1]).unwrap();
        assert!(read_credential(&file, &guard).is_err());
        assert!(read_credential(dir.path(), &guard).is_err());
        assert!(read_credential(&dir.path().join("missing"), &guard).is_err());
        // A pseudo file system never.
        assert!(read_credential(Path::new("/proc/self/environ"), &guard).is_err());
    }
}
