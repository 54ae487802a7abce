//! The host matcher's specification, written as plainly as possible: an entry matches its own
//! name, ASCII case-insensitively; `*.d` matches strict subdomains of `d`, never `d`; a host
//! with an empty label or a character outside letters, digits, `-` and `_` never matches.
//! Included by path from the matcher's property tests and from its fuzz target, so both judge
//! against one model.

/// Whether `host` matches one of `entries`, by the plain rule.
pub fn model(entries: &[String], host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    let labels_ok = host.split('.').all(|label| {
        !label.is_empty()
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    });
    labels_ok
        && entries.iter().any(|entry| {
            let entry = entry.to_ascii_lowercase();
            match entry.strip_prefix("*.") {
                Some(domain) => {
                    host.len() > domain.len() + 1
                        && host.ends_with(domain)
                        && host.as_bytes()[host.len() - domain.len() - 1] == b'.'
                        && !host.starts_with('.')
                }
                None => host == entry,
            }
        })
}
