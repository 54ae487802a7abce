//! The path normaliser's and matcher's specification, written as plainly as possible: split the
//! path at `/`, cut each segment at its first `;`, decode escapes of unreserved characters and
//! upper-case the others (refusing escapes of `/`, `\`, `%`, controls and DEL, malformed ones and
//! characters outside `pchar`), drop empty and `.` segments, let `..` remove the segment before it
//! (refusing one at the root), keep a trailing `/`. A pattern ending in `*` matches by prefix,
//! any other by equality. Included by path from the property tests and from the fuzz target, so
//! both judge against one model.

/// The normalised target (`path[?query]`), or `None` when it is refused.
pub fn model_normalize(target: &str) -> Option<String> {
    if target.contains('#') {
        return None;
    }
    let (path, query) = match target.find('?') {
        Some(at) => (&target[..at], Some(&target[at + 1..])),
        None => (target, None),
    };
    if !path.starts_with('/') {
        return None;
    }
    let mut kept: Vec<String> = Vec::new();
    let mut ends_in_slash = false;
    for raw in path[1..].split('/') {
        let mut segment = String::new();
        let chars: Vec<char> = raw.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c == '%' {
                let hex: String = chars.get(i + 1..i + 3)?.iter().collect();
                if hex.len() != 2 || !hex.chars().all(|h| h.is_ascii_hexdigit()) {
                    return None;
                }
                let value = u8::from_str_radix(&hex, 16).ok()?;
                let decoded = char::from(value);
                if decoded.is_ascii_alphanumeric() || "-._~".contains(decoded) {
                    segment.push(decoded);
                } else if decoded == '/'
                    || decoded == '\\'
                    || decoded == '%'
                    || value < 32
                    || value == 127
                {
                    return None;
                } else {
                    segment.push_str(&format!("%{}", hex.to_uppercase()));
                }
                i += 3;
            } else if c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@".contains(c) {
                segment.push(c);
                i += 1;
            } else {
                return None;
            }
        }
        let segment = match segment.find(';') {
            Some(at) => segment[..at].to_owned(),
            None => segment,
        };
        ends_in_slash = segment.is_empty() || segment == "." || segment == "..";
        if segment == ".." {
            kept.pop()?;
        } else if !segment.is_empty() && segment != "." {
            kept.push(segment);
        }
    }
    let mut out = String::new();
    for segment in &kept {
        out = out + "/" + segment;
    }
    if out.is_empty() || ends_in_slash {
        out.push('/');
    }
    if let Some(query) = query {
        out = out + "?" + query;
    }
    Some(out)
}

/// Whether `pattern` (as written, already normalised) matches `target` (as requested).
pub fn model_matches(pattern: &str, target: &str) -> bool {
    let Some(normal) = model_normalize(target) else {
        return false;
    };
    let path = normal.split('?').next().unwrap_or("");
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => path == pattern,
    }
}
