//! The sbx backend's names (docs/sbx-backend.md#naming): the validated name prefix, and the
//! conversation, key and sandbox names a key and kind derive, all from [`sbx_digest`].

use std::fmt;

use super::{json_dumps_list, sha256_hex};
use crate::error::SandboxError;
use crate::key::SandboxKey;

/// The sbx digest `d(n, parts)` (docs/sbx-backend.md#naming): the first `n` lowercase hex digits (at most 64) of SHA-256 over
/// the Python JSON of the parts.
///
/// ```
/// use sandbox_core::naming::sbx::sbx_digest;
/// assert_eq!(sbx_digest(8, &["python"]), "80db6ea4");
/// ```
pub fn sbx_digest<S: AsRef<str>>(n: usize, parts: &[S]) -> String {
    let mut hex = sha256_hex(json_dumps_list(parts).as_bytes());
    hex.truncate(n);
    hex
}

/// The leading part of every sbx sandbox name: `[a-z0-9]{1,16}`, default `maf`.
///
/// Validated once at construction so no name function can be handed an unchecked prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamePrefix(String);

impl NamePrefix {
    /// The default prefix, `maf`.
    pub const DEFAULT: &'static str = "maf";

    /// Checks a prefix: 1 to 16 characters of `[a-z0-9]`, else [`SandboxError::InvalidArgument`].
    pub fn new(prefix: impl Into<String>) -> Result<Self, SandboxError> {
        let prefix = prefix.into();
        let valid = (1..=16).contains(&prefix.len())
            && prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if valid {
            Ok(NamePrefix(prefix))
        } else {
            Err(SandboxError::invalid(format!(
                "name prefix {prefix:?} must be 1 to 16 characters of a-z and 0-9"
            )))
        }
    }

    /// The prefix.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for NamePrefix {
    fn default() -> Self {
        NamePrefix(Self::DEFAULT.to_owned())
    }
}

impl fmt::Display for NamePrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The prefix shared by every sbx sandbox of a conversation: `<prefix>-` + d(12, scope, thread_id) + `-`.
pub fn sbx_conversation_prefix(prefix: &NamePrefix, key: &SandboxKey) -> String {
    format!(
        "{prefix}-{}-",
        sbx_digest(12, &[&key.scope, &key.thread_id])
    )
}

/// The prefix shared by every sbx sandbox of a key: the conversation prefix + d(10, scope, thread_id,
/// agent_id, call_id) + `-`.
pub fn sbx_key_prefix(prefix: &NamePrefix, key: &SandboxKey) -> String {
    let fields = [&key.scope, &key.thread_id, &key.agent_id, &key.call_id];
    format!(
        "{}{}-",
        sbx_conversation_prefix(prefix, key),
        sbx_digest(10, &fields)
    )
}

/// The sbx sandbox name (docs/sbx-backend.md#naming): the key prefix + d(8, kind). At most 49 characters.
///
/// ```
/// use sandbox_core::naming::sbx::{sbx_sandbox_name, NamePrefix};
/// use sandbox_core::SandboxKey;
/// let key = SandboxKey::conversation("prod", "thread-1", "agent");
/// assert_eq!(
///     sbx_sandbox_name(&NamePrefix::default(), &key, "python"),
///     "maf-f8fb3a606cf7-ee5188b3f1-80db6ea4"
/// );
/// ```
pub fn sbx_sandbox_name(prefix: &NamePrefix, key: &SandboxKey, kind: &str) -> String {
    format!("{}{}", sbx_key_prefix(prefix, key), sbx_digest(8, &[kind]))
}
