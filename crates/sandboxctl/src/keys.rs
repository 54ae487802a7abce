//! Sandbox keys from the command line.

use clap::Args;
use sandbox_core::{SandboxError, SandboxKey};

/// The scope of generated keys, and the default of `list`.
pub const GENERATED_SCOPE: &str = "sandboxctl";

/// How a command names its sandbox.
#[derive(Debug, Clone, Default, Args)]
pub struct KeyArgs {
    /// The key as SCOPE/THREAD/AGENT (exactly three fields).
    #[arg(long, value_name = "SCOPE/THREAD/AGENT")]
    pub key: Option<String>,
    /// The scope, for fields that contain `/` (with --thread and --agent).
    #[arg(long, value_name = "S")]
    pub scope: Option<String>,
    /// The thread (conversation) id.
    #[arg(long, value_name = "T")]
    pub thread: Option<String>,
    /// The agent id.
    #[arg(long, value_name = "A")]
    pub agent: Option<String>,
    /// Makes the key call-scoped.
    #[arg(long, value_name = "C")]
    pub call: Option<String>,
}

/// Why a key could not be read from the flags.
#[derive(Debug, PartialEq, Eq)]
pub enum KeyError {
    /// `--key` and the separate fields were both given (a usage error).
    BothForms,
    /// The key is malformed or incomplete (an invalid argument).
    Invalid(String),
}

impl From<KeyError> for SandboxError {
    fn from(e: KeyError) -> Self {
        match e {
            KeyError::BothForms => SandboxError::invalid(
                "give either --key SCOPE/THREAD/AGENT or --scope/--thread/--agent, not both",
            ),
            KeyError::Invalid(m) => SandboxError::invalid(m),
        }
    }
}

impl KeyArgs {
    /// The key the flags name, or `None` when none was given.
    pub fn parse(&self) -> Result<Option<SandboxKey>, KeyError> {
        let separate = self.scope.is_some() || self.thread.is_some() || self.agent.is_some();
        let key = match (&self.key, separate) {
            (Some(_), true) => return Err(KeyError::BothForms),
            (Some(text), false) => {
                let fields: Vec<&str> = text.split('/').collect();
                let [scope, thread, agent] = fields[..] else {
                    return Err(KeyError::Invalid(format!(
                        "--key {text:?} must be SCOPE/THREAD/AGENT (exactly three fields; use --scope/--thread/--agent for fields containing '/')"
                    )));
                };
                SandboxKey::conversation(scope, thread, agent)
            }
            (None, true) => match (&self.scope, &self.thread, &self.agent) {
                (Some(s), Some(t), Some(a)) => SandboxKey::conversation(s, t, a),
                _ => {
                    return Err(KeyError::Invalid(
                        "--scope, --thread and --agent must be given together".into(),
                    ))
                }
            },
            (None, false) => {
                if self.call.is_some() {
                    return Err(KeyError::Invalid("--call needs a key".into()));
                }
                return Ok(None);
            }
        };
        check_field("scope", &key.scope)?;
        check_field("thread", &key.thread_id)?;
        check_field("agent", &key.agent_id)?;
        Ok(Some(match &self.call {
            Some(call) => {
                check_field("call", call)?;
                key.with_call(call)
            }
            None => key,
        }))
    }

    /// The key the flags name; a command that needs one fails without.
    pub fn require(&self) -> Result<SandboxKey, KeyError> {
        self.parse()?.ok_or_else(|| {
            KeyError::Invalid(
                "this command needs --key SCOPE/THREAD/AGENT (or --scope/--thread/--agent)".into(),
            )
        })
    }
}

/// Refuses a key field the CLI does not accept: empty, or holding a control character (a newline, a
/// tab, an escape sequence would forge or garble the lines that print it). The library accepts both, so
/// keys made elsewhere stay reachable through the API.
pub fn check_field(field: &str, value: &str) -> Result<(), KeyError> {
    if value.is_empty() {
        return Err(KeyError::Invalid(format!("the {field} must not be empty")));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(KeyError::Invalid(format!(
            "the {field} {value:?} holds the control character {c:?}"
        )));
    }
    Ok(())
}

/// A fresh key: scope `sandboxctl`, a random thread id (16 hex digits), agent `cli`.
///
/// # Errors
/// The operating system's random source fails: no thread id is made up from a clock.
pub fn generated_key() -> Result<SandboxKey, SandboxError> {
    let thread = host_state::random_hex(16).map_err(|source| SandboxError::Io {
        operation: "draw a thread id",
        path: "the random source".to_owned(),
        source,
    })?;
    Ok(SandboxKey::conversation(GENERATED_SCOPE, thread, "cli"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(
        key: Option<&str>,
        s: Option<&str>,
        t: Option<&str>,
        a: Option<&str>,
        c: Option<&str>,
    ) -> KeyArgs {
        KeyArgs {
            key: key.map(Into::into),
            scope: s.map(Into::into),
            thread: t.map(Into::into),
            agent: a.map(Into::into),
            call: c.map(Into::into),
        }
    }

    #[test]
    fn forms() {
        assert_eq!(
            args(Some("s/t/a"), None, None, None, None).parse().unwrap(),
            Some(SandboxKey::conversation("s", "t", "a"))
        );
        assert_eq!(
            args(None, Some("s/x"), Some("t"), Some("a"), Some("c"))
                .parse()
                .unwrap(),
            Some(SandboxKey::conversation("s/x", "t", "a").with_call("c"))
        );
        assert_eq!(args(None, None, None, None, None).parse().unwrap(), None);
    }

    #[test]
    fn refusals() {
        assert_eq!(
            args(Some("s/t/a"), Some("s"), None, None, None).parse(),
            Err(KeyError::BothForms)
        );
        for bad in ["s/t", "s/t/a/b", "st"] {
            assert!(matches!(
                args(Some(bad), None, None, None, None).parse(),
                Err(KeyError::Invalid(_))
            ));
        }
        assert!(matches!(
            args(None, Some("s"), None, Some("a"), None).parse(),
            Err(KeyError::Invalid(_))
        ));
        assert!(matches!(
            args(None, None, None, None, Some("c")).parse(),
            Err(KeyError::Invalid(_))
        ));
        assert!(matches!(
            args(Some("s/t/a"), None, None, None, Some("")).parse(),
            Err(KeyError::Invalid(_))
        ));
    }

    #[test]
    fn generated_keys_differ() {
        let a = generated_key().unwrap();
        let b = generated_key().unwrap();
        assert_eq!(a.scope, GENERATED_SCOPE);
        assert_eq!(a.agent_id, "cli");
        assert_eq!(a.thread_id.len(), 16);
        assert_ne!(a.thread_id, b.thread_id);
    }

    #[test]
    fn empty_and_control_fields_are_refused() {
        for (key, call) in [
            ("scope//", None),
            ("/t/a", None),
            ("s//a", None),
            ("s/t/", None),
            ("s/t\u{1b}[31m/a", None),
            ("s\n/t/a", None),
            ("s/t/a\t", None),
            ("s/t/a\u{85}", None),
            ("s/t/a", Some("c\n")),
        ] {
            assert!(
                matches!(
                    args(Some(key), None, None, None, call).parse(),
                    Err(KeyError::Invalid(_))
                ),
                "{key:?} {call:?}"
            );
        }
        assert!(matches!(
            args(None, Some(""), Some("t"), Some("a"), None).parse(),
            Err(KeyError::Invalid(_))
        ));
        // Spaces, slashes in separate fields and non-ASCII letters stay accepted.
        assert!(args(None, Some("s/x y"), Some("thé"), Some("a"), None)
            .parse()
            .is_ok());
    }
}
