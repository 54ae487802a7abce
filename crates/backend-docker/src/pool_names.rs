//! The names and labels a warm pool is found by (docs/docker-backend.md#warm-pool): the key its
//! members are made under, their names while filled and once ready, and the name of the claim
//! record that gives one to a key.
//!
//! A leaf: plain values and pure functions, so the ownership checks, the listings and disposal
//! can tell a pool member and a claimed one without depending on the machinery that fills and
//! claims them ([`crate::pool`]).

use sandbox_core::naming::docker::{label_value, LABEL_SCOPE, POOL_SCOPE};
use sandbox_core::SandboxKey;

/// Prefix of every pool member's name, ready or being filled.
const MEMBER_PREFIX: &str = "maf-sandbox-pool-";
/// Suffix of a member's name while it is made and prepared: never claimed under it.
const FILLING_SUFFIX: &str = "-filling";
/// Prefix of a claim record's name (a volume), followed by the claimed container's id.
const CLAIM_PREFIX: &str = "maf-sandbox-claim-";
/// The agent of every pool key.
const POOL_AGENT: &str = "pool";
/// The kind every pool member is made as.
pub(crate) const POOL_KIND: &str = "pool";
/// The role label's value on a claim record.
pub(crate) const CLAIM_ROLE: &str = "claim";
/// Hex digits of the shape digest in a pool key's thread and a member's name.
pub(crate) const SHAPE_HEX: usize = 16;
/// Hex digits of the nonce that tells one member of a shape from another.
const NONCE_HEX: usize = 8;

/// The key the members of one shape are made under: scope [`POOL_SCOPE`], thread the shape's
/// digest.
pub(crate) fn pool_key(shape: &str) -> SandboxKey {
    SandboxKey::conversation(POOL_SCOPE, shape, POOL_AGENT)
}

/// A ready member's name: the prefix, the shape, a nonce (its first [`NONCE_HEX`] digits).
pub(crate) fn member_name(shape: &str, nonce: &str) -> String {
    format!(
        "{MEMBER_PREFIX}{shape}-{}",
        &nonce[..nonce.len().min(NONCE_HEX)]
    )
}

/// The name a member is filled under before it is ready.
pub(crate) fn filling_name(member: &str) -> String {
    format!("{member}{FILLING_SUFFIX}")
}

/// Whether a container name is a pool member's, ready or being filled: the pool's own, never a
/// key's.
pub(crate) fn is_pool_name(name: &str) -> bool {
    name.starts_with(MEMBER_PREFIX)
}

/// Whether `name` is a ready member of `shape`: the only names a claim takes.
pub(crate) fn is_ready_member(name: &str, shape: &str) -> bool {
    name.strip_prefix(MEMBER_PREFIX)
        .and_then(|rest| rest.strip_prefix(shape))
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|nonce| {
            nonce.len() == NONCE_HEX && nonce.bytes().all(|b| b.is_ascii_hexdigit())
        })
}

/// Whether `name` is a member still being filled.
pub(crate) fn is_filling(name: &str) -> bool {
    is_pool_name(name) && name.ends_with(FILLING_SUFFIX)
}

/// The claim record (a volume) of container `id`.
pub(crate) fn claim_record_name(id: &str) -> String {
    format!("{CLAIM_PREFIX}{id}")
}

/// Whether a container's own labels make it a pool member (scope [`POOL_SCOPE`]). Once renamed
/// away from a pool name it is a claimed member, whose owner is its claim record.
pub(crate) fn made_for_pool(own_labels: &std::collections::BTreeMap<String, String>) -> bool {
    own_labels.get(LABEL_SCOPE) == Some(&label_value(POOL_SCOPE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tell_ready_members_filling_ones_and_keys_apart() {
        let shape = "0123456789abcdef";
        let ready = member_name(shape, "deadbeefcafe");
        assert_eq!(ready, "maf-sandbox-pool-0123456789abcdef-deadbeef");
        assert!(is_ready_member(&ready, shape));
        assert!(!is_ready_member(&ready, "fedcba9876543210"));
        let filling = filling_name(&ready);
        assert!(is_pool_name(&filling) && is_filling(&filling));
        assert!(!is_ready_member(&filling, shape));
        assert!(!is_filling(&ready));
        assert!(!is_pool_name("maf-sandbox-docker-aef172d1c789"));
        assert!(!is_ready_member(&format!("{ready}x"), shape));
        let key = pool_key(shape);
        assert_eq!(
            (key.scope.as_str(), key.thread_id.as_str()),
            (POOL_SCOPE, shape)
        );
        assert_eq!(claim_record_name("ab12"), "maf-sandbox-claim-ab12");
    }
}
