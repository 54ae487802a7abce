//! The Docker backend's names and labels (docs/docker-backend.md#names-and-labels): the container
//! name a key and kind derive, the ownership labels every container and egress companion carries,
//! and the key label a listing is read back from.

use base64::Engine as _;

use super::{json_dumps_list, parse_json_string_list, sha256_hex};
use crate::key::SandboxKey;

/// Prefix of every docker container name.
pub const DOCKER_NAME_PREFIX: &str = "maf-sandbox-docker-";
/// Docker label: [`label_value`] of the key's scope.
pub const LABEL_SCOPE: &str = "maf-sandbox.scope";
/// Docker label: [`label_value`] of the key's thread id.
pub const LABEL_THREAD: &str = "maf-sandbox.thread";
/// Docker label: [`label_value`] of the key's agent id.
pub const LABEL_AGENT: &str = "maf-sandbox.agent";
/// Docker label: [`label_value`] of the sandbox kind.
pub const LABEL_KIND: &str = "maf-sandbox.kind";
/// Docker label: [`label_value`] of the call id, present only for a call-scoped key.
pub const LABEL_CALL: &str = "maf-sandbox.call";
/// Docker label prefix: `maf-sandbox.label.<k>` carries [`label_value`] of each spec label `k`.
pub const LABEL_USER_PREFIX: &str = "maf-sandbox.label.";
/// Docker label: the key label ([`docker_key_label`]).
pub const LABEL_KEY_V1: &str = "maf-sandbox.key.v1";
/// Docker label: the raw normalised storage base, never digested.
pub const LABEL_WORK_DIR_V1: &str = "maf-sandbox.work-dir.v1";
/// Docker label on an egress proxy container: its role (`proxy`).
pub const LABEL_ROLE: &str = "maf-sandbox.role";
/// Docker label on an egress proxy container: the SHA-256 of its policy.
pub const LABEL_EGRESS_V1: &str = "maf-sandbox.egress.v1";
/// Docker label on a container being created: its create's mark (a per-call nonce), by which an
/// abandoned create is found again.
pub const LABEL_CREATE_MARK: &str = "maf-sandbox.create-mark";
/// Docker label on a warm pool member's claim record (a volume): the id of the container it
/// gives to a key (docs/docker-backend.md#warm-pool).
pub const LABEL_INSTANCE: &str = "maf-sandbox.instance";
/// Docker label on a claim record: the claiming call's nonce, by which the claimer tells its own
/// record from another's.
pub const LABEL_CLAIM_MARK: &str = "maf-sandbox.claim-mark";
/// The scope of the key every warm pool member is made under (its thread is the pool's shape
/// digest): the pool is listed and purged like any scope.
pub const POOL_SCOPE: &str = "maf-sandbox-pool";
/// Docker label on a local image built around the exec init: the binary's SHA-256.
pub const LABEL_EXEC_INIT_SHA256: &str = "maf-sandbox.exec-init.sha256";
/// Docker label on a local image that carries the `host-tool` program: the binary's SHA-256.
pub const LABEL_HOST_TOOL_SHA256: &str = "maf-sandbox.host-tool.sha256";
/// Docker label on the egress proxy's local image: the binary's SHA-256.
pub const LABEL_EGRESS_PROXY_SHA256: &str = "maf-sandbox.egress-proxy.sha256";

/// Longest docker label value kept raw.
const LABEL_RAW_MAX: usize = 63;
/// Cap on the key label: summed field characters, and the encoded length.
const KEY_LABEL_CAP: usize = 4096;

/// The docker container name of a sandbox (docs/docker-backend.md#names-and-labels).
///
/// SHA-256 over each part as `<UTF-8 byte length in decimal>:<bytes>`, parts = scope, thread id, agent id,
/// kind, then `egress_id` if non-empty, then `call:<call_id>` if the key names a call; the name is
/// [`DOCKER_NAME_PREFIX`] + the first 12 hex digits. `egress_id` is `""` for closed egress.
///
/// ```
/// use sandbox_core::naming::docker::docker_container_name;
/// use sandbox_core::SandboxKey;
/// let key = SandboxKey::conversation("prod", "thread-1", "agent");
/// assert_eq!(docker_container_name(&key, "python", ""), "maf-sandbox-docker-aef172d1c789");
/// ```
pub fn docker_container_name(key: &SandboxKey, kind: &str, egress_id: &str) -> String {
    let call_part = format!("call:{}", key.call_id);
    let mut parts = vec![
        key.scope.as_str(),
        key.thread_id.as_str(),
        key.agent_id.as_str(),
        kind,
    ];
    if !egress_id.is_empty() {
        parts.push(egress_id);
    }
    if key.is_call() {
        parts.push(&call_part);
    }
    let preimage = docker_name_preimage(&parts);
    format!("{DOCKER_NAME_PREFIX}{}", &sha256_hex(&preimage)[..12])
}

/// The bytes a docker container name digests: each part as its UTF-8 byte length in ASCII decimal, `:`,
/// then its bytes, with nothing between parts. The length prefix makes the encoding injective: no two part
/// lists share a preimage (`["a|b", "c"]` and `["a", "b|c"]` differ), whatever characters the parts hold.
pub fn docker_name_preimage<S: AsRef<str>>(parts: &[S]) -> Vec<u8> {
    let mut preimage = Vec::new();
    for part in parts {
        let part = part.as_ref();
        preimage.extend_from_slice(part.len().to_string().as_bytes());
        preimage.push(b':');
        preimage.extend_from_slice(part.as_bytes());
    }
    preimage
}

/// Whether a label value has the shape of a digest (`sha256-` + 48 lowercase hex), so its raw field cannot
/// be read back from it.
pub fn is_digest_label(value: &str) -> bool {
    value.strip_prefix("sha256-").is_some_and(|hex| {
        hex.len() == 48 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// The docker label value of a raw field (docs/docker-backend.md#names-and-labels): the raw string when it is 1..=63 characters of
/// `[A-Za-z0-9._-]` and not digest-shaped, else `sha256-` + the first 48 hex digits of its SHA-256.
///
/// Never truncated, so two values sharing a long prefix never share a label. Used identically on write and
/// on query.
///
/// ```
/// use sandbox_core::naming::docker::label_value;
/// assert_eq!(label_value("ok.value_1-2"), "ok.value_1-2");
/// assert_eq!(label_value(""), "sha256-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934c");
/// ```
pub fn label_value(raw: &str) -> String {
    let raw_is_safe = !raw.is_empty()
        && raw.len() <= LABEL_RAW_MAX
        && raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !is_digest_label(raw);
    if raw_is_safe {
        raw.to_owned()
    } else {
        format!("sha256-{}", &sha256_hex(raw.as_bytes())[..48])
    }
}

/// The docker key label `maf-sandbox.key.v1` (docs/docker-backend.md#names-and-labels): base64url, with `=` padding, of the Python JSON of
/// `[scope, thread_id, agent_id, call_id]`; `""` when the fields hold more than 4096 characters in all or
/// the encoding is longer than 4096.
///
/// ```
/// use sandbox_core::naming::docker::docker_key_label;
/// use sandbox_core::SandboxKey;
/// let key = SandboxKey::conversation("prod", "thread-1", "agent");
/// assert_eq!(docker_key_label(&key), "WyJwcm9kIiwgInRocmVhZC0xIiwgImFnZW50IiwgIiJd");
/// ```
pub fn docker_key_label(key: &SandboxKey) -> String {
    let fields = [&key.scope, &key.thread_id, &key.agent_id, &key.call_id];
    let characters: usize = fields.iter().map(|f| f.chars().count()).sum();
    if characters > KEY_LABEL_CAP {
        return String::new();
    }
    let encoded = base64::engine::general_purpose::URL_SAFE.encode(json_dumps_list(&fields));
    if encoded.len() > KEY_LABEL_CAP {
        return String::new();
    }
    encoded
}

/// Reads a key back from a docker key label: the inverse of [`docker_key_label`].
///
/// `None` when the label is empty (the key was too long to record), not padded base64url, not a JSON list
/// of exactly four strings, or too long to have been written by [`docker_key_label`].
pub fn decode_docker_key_label(label: &str) -> Option<SandboxKey> {
    if label.is_empty() || label.len() > KEY_LABEL_CAP {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE
        .decode(label)
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let [scope, thread_id, agent_id, call_id]: [String; 4] =
        parse_json_string_list(&text)?.try_into().ok()?;
    Some(SandboxKey {
        scope,
        thread_id,
        agent_id,
        call_id,
    })
}
