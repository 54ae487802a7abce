//! The secret-name denylist: a second layer behind "the guest gets only what the caller names".
//!
//! [`ExecEnv`](crate::ExecEnv) refuses a secret-looking name unless the caller allows it by name; a
//! backend that forwards host environment to a tool of its own (the sbx CLI) filters with
//! [`is_secret_name`] too.

/// Substrings that mark a name as secret-looking anywhere in it. They are matched against the name with
/// its separators (`_`, `-`, `.`) removed, so `API_KEY`, `APIKEY` and `api-key` read alike.
const DENIED_SUBSTRINGS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "APIKEY",
    "PRIVATEKEY",
    "ACCESSKEY",
    "SSHKEY",
    // JSON web tokens are bearer credentials whatever the rest of the name says.
    "JWT",
    // SSH private key file names, as variables that hold one.
    "IDRSA",
    "IDED25519",
    "IDECDSA",
    "IDDSA",
    // Connection strings carry a user and a password.
    "CONNSTR",
    "CONNECTIONSTRING",
];

/// Whole words (split on `_`, `-`, `.`) that mark a name. `SESSION` is deliberately absent:
/// `DBUS_SESSION_BUS_ADDRESS` may be what a CLI needs to reach its keychain. `PWD` marks a name only as one
/// word among others (`DB_PWD`): the shell's own `PWD` is the working directory.
const DENIED_WORDS: &[&str] = &[
    "KEY", "KEYS", "PAT", "PASS", "PWD", "AUTH", "COOKIE", "COOKIES", "CREDS", "OTP", "DSN",
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

/// Names never matched, though a rule above would: the shell's working directory.
const ALLOWED_EXACT: &[&str] = &["PWD"];

/// Words naming a data store or a message broker: a `…_URL` or `…_URI` with one of them is a connection
/// URL, which conventionally carries `user:password@` (`DATABASE_URL`, `REDIS_URL`).
const DATA_STORE_WORDS: &[&str] = &[
    "DATABASE",
    "DB",
    "POSTGRES",
    "POSTGRESQL",
    "PG",
    "PSQL",
    "MYSQL",
    "MARIADB",
    "MSSQL",
    "SQL",
    "SQLSERVER",
    "SQLALCHEMY",
    "MONGO",
    "MONGODB",
    "REDIS",
    "VALKEY",
    "MEMCACHED",
    "RABBITMQ",
    "AMQP",
    "BROKER",
    "KAFKA",
    "NATS",
    "CLICKHOUSE",
    "COCKROACH",
    "COCKROACHDB",
    "CASSANDRA",
    "NEO4J",
    "ELASTICSEARCH",
    "OPENSEARCH",
    "SUPABASE",
    "CONNECTION",
    "CONN",
];

/// Last words of a name that holds a URL.
const URL_WORDS: &[&str] = &["URL", "URI", "URLS", "URIS"];

/// Whether an environment variable name looks like it carries a secret.
///
/// The name is upper-cased and split into words on `_`, `-` and `.`. It is denied when, with its
/// separators removed, it contains a secret-looking substring (`TOKEN`, `PASSWORD`, `APIKEY`,
/// `PRIVATEKEY`, `SSHKEY`, `JWT`, ...); when it has a secret-looking word (`KEY`, `PASS`, `PWD`, `AUTH`,
/// `DSN`, ...); when it names a connection URL of a data store or broker (`DATABASE_URL`, `REDIS_URL`);
/// when it starts with a cloud or secret-manager prefix; or when it is one of a few exact names.
/// `PWD`, `OLDPWD` and `KEYBOARD_*` are not matched, nor a URL of anything else (`API_URL`).
///
/// ```
/// use sandbox_core::hygiene::is_secret_name;
/// assert!(is_secret_name("DATABASE_URL") && is_secret_name("DB_PWD") && is_secret_name("SENTRY_DSN"));
/// assert!(!is_secret_name("PWD") && !is_secret_name("API_URL") && !is_secret_name("KEYBOARD_LAYOUT"));
/// ```
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if ALLOWED_EXACT.contains(&upper.as_str()) {
        return false;
    }
    let words: Vec<&str> = upper
        .split(['_', '-', '.'])
        .filter(|w| !w.is_empty())
        .collect();
    let compact: String = words.concat();
    let connection_url = words.len() > 1
        && words.last().is_some_and(|last| URL_WORDS.contains(last))
        && words.iter().any(|w| DATA_STORE_WORDS.contains(w));
    DENIED_SUBSTRINGS.iter().any(|s| compact.contains(s))
        || words.iter().any(|word| DENIED_WORDS.contains(word))
        || connection_url
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
            // Passwords spelled short, keys spelled as one word, tokens by their format, and connection
            // strings that carry credentials.
            "DB_PWD",
            "MYSQL_PWD",
            "PGPASSWORD",
            "MY_PRIVATEKEY",
            "PRIVATEKEY",
            "SSHKEY",
            "SSH_KEY_PATH",
            "GIT_SSH_KEY",
            "ID_RSA",
            "ID_ED25519",
            "JWT",
            "AUTH_JWT",
            "JWT_SIGNING",
            "DATABASE_URL",
            "DATABASE_URI",
            "DB_URL",
            "POSTGRES_URL",
            "POSTGRESQL_URI",
            "PG_URL",
            "MYSQL_URL",
            "MONGODB_URI",
            "MONGO_URL",
            "REDIS_URL",
            "AMQP_URL",
            "RABBITMQ_URL",
            "CELERY_BROKER_URL",
            "SENTRY_DSN",
            "DSN",
            "DB_CONNECTION_STRING",
            "SQL_CONN_STR",
            "database-url",
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
            "OLDPWD",
            "PWDX_HOME",
            "HOME_URL",
            "API_URL",
            "SERVICE_URL",
            "DOCS_URI",
            "PIP_INDEX_URL",
            "CONDA_PREFIX",
            "DISPLAY",
            "TZ",
            "USER",
        ] {
            assert!(!is_secret_name(name), "{name} was denied");
        }
    }

    #[test]
    fn widened_names_are_refused_by_name_and_pass_when_allowed() {
        use crate::{ErrorKind, ExecEnv};
        for name in [
            "DATABASE_URL",
            "DB_PWD",
            "SENTRY_DSN",
            "MY_PRIVATEKEY",
            "JWT",
            "SSHKEY",
        ] {
            let env = ExecEnv::default().set(name, b"postgres://u:p@db/x");
            let e = env.validate().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.to_string().contains(name), "{e}");
            assert!(env.allow_secret_name(name).validate().is_ok(), "{name}");
        }
    }
}
