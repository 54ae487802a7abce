//! The secret-name denylist: a second layer behind "the guest gets only what the caller names".

/// Substrings that mark a name as secret-looking anywhere in it.
const DENIED_SUBSTRINGS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "APIKEY",
    "API_KEY",
    "PRIVATE_KEY",
    "ACCESS_KEY",
];

/// Whole words (split on `_`, `-`, `.`) that mark a name. `SESSION` is deliberately absent:
/// `DBUS_SESSION_BUS_ADDRESS` may be what a CLI needs to reach its keychain.
const DENIED_WORDS: &[&str] = &[
    "KEY", "KEYS", "PAT", "PASS", "AUTH", "COOKIE", "COOKIES", "CREDS", "OTP",
];

/// Cloud, CI-runtime and secret-manager families.
const DENIED_PREFIXES: &[&str] = &[
    "AWS_", "AZURE_", "ARM_", "GOOGLE_", "GCP_", "ACTIONS_", "VAULT_", "OP_",
];

/// Exact names that lead to credentials.
const DENIED_EXACT: &[&str] = &[
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "GPG_AGENT_INFO",
    "GNUPGHOME",
    "XAUTHORITY",
    "KUBECONFIG",
    "NETRC",
    "DOCKER_USERNAME",
    "DOCKER_PAT",
];

/// Whether an environment variable name looks like it carries a secret.
///
/// The name is upper-cased and split into words on `_`, `-` and `.`. It is denied when it contains a
/// secret-looking substring, has a secret-looking word, starts with a cloud or secret-manager prefix, or is
/// one of a few exact names. `PWD`, `OLDPWD` and `KEYBOARD_*` are not matched.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    DENIED_SUBSTRINGS.iter().any(|s| upper.contains(s))
        || upper
            .split(['_', '-', '.'])
            .any(|word| DENIED_WORDS.contains(&word))
        || DENIED_PREFIXES.iter().any(|p| upper.starts_with(p))
        || DENIED_EXACT.contains(&upper.as_str())
}

#[cfg(test)]
mod tests {
    use super::is_secret_name;

    #[test]
    fn denied_names() {
        for name in [
            "GITHUB_TOKEN",
            "API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION",
            "DB_PASS",
            "DB_PASSWORD",
            "MYSQL_PASSWD",
            "GPG_PASSPHRASE",
            "GITHUB_AUTH",
            "SSH_AUTH_SOCK",
            "SSH_AGENT_PID",
            "GPG_AGENT_INFO",
            "GNUPGHOME",
            "XAUTHORITY",
            "KUBECONFIG",
            "NETRC",
            "DOCKER_USERNAME",
            "DOCKER_PAT",
            "GH_PAT",
            "OPENAI_APIKEY",
            "SIGNING_PRIVATE_KEY",
            "S3_ACCESS_KEY",
            "SESSION_COOKIE",
            "BROWSER_COOKIES",
            "GIT_CREDS",
            "MFA_OTP",
            "AZURE_CLIENT_ID",
            "ARM_TENANT_ID",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "GCP_PROJECT",
            "ACTIONS_RUNTIME_URL",
            "VAULT_ADDR",
            "OP_SERVICE_ACCOUNT",
            "SSH_KEYS",
            "my-key",
            "app.key",
            "github_token",
            "npm_config__auth",
            "SECRET",
        ] {
            assert!(is_secret_name(name), "{name} was not denied");
        }
    }

    #[test]
    fn allowed_names() {
        for name in [
            "PATH",
            "HOME",
            "PWD",
            "OLDPWD",
            "LANG",
            "KEYBOARD_LAYOUT",
            "KEYBOARD",
            "MONKEY",
            "DBUS_SESSION_BUS_ADDRESS",
            "SESSION_ID",
            "PATTERN",
            "PATH_INFO",
            "PASSAGE",
            "TERM",
            "DEBIAN_FRONTEND",
            "OPTIONS",
            "TOOLS_OP",
            "DOCKER_HOST",
            "CARGO_HOME",
            "PYTHONPATH",
        ] {
            assert!(!is_secret_name(name), "{name} was denied");
        }
    }
}
