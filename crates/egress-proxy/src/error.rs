//! The one error type of the crate and its cold constructors.

use std::io;
use std::path::PathBuf;

/// What can go wrong setting up or running one of the roles.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// An `--allow` entry is not a host of the allowlist grammar.
    #[error("allowlist entry {entry:?} refused: {reason}")]
    InvalidAllow {
        /// The entry as given.
        entry: String,
        /// Why the grammar refused it.
        reason: String,
    },
    /// A `--rule` is not `HOST METHODS PATHS` of valid parts.
    #[error("rule {rule:?} refused: {reason}")]
    InvalidRule {
        /// The rule as given.
        rule: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A credential grant line is unusable (the message never quotes the line: it holds a
    /// secret).
    #[error("credential grant on line {line} refused: {reason}")]
    InvalidGrant {
        /// The line number on standard input, from 1.
        line: usize,
        /// Which field is wrong and why.
        reason: String,
    },
    /// Making the certificate authority, a certificate or a TLS configuration failed.
    #[error("TLS set-up: {0}")]
    Tls(String),
    /// A configuration value is unusable (an empty allowlist, port 0, a bad address).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A file-system or socket operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

#[cold]
pub(crate) fn io_error(
    action: &'static str,
    path: impl Into<PathBuf>,
    source: io::Error,
) -> ProxyError {
    ProxyError::Io {
        action,
        path: path.into(),
        source,
    }
}

#[cold]
pub(crate) fn invalid_config(what: impl Into<String>) -> ProxyError {
    ProxyError::InvalidConfig(what.into())
}

#[cold]
pub(crate) fn invalid_rule(rule: &str, reason: impl Into<String>) -> ProxyError {
    ProxyError::InvalidRule {
        rule: rule.to_owned(),
        reason: reason.into(),
    }
}

#[cold]
pub(crate) fn invalid_grant(line: usize, reason: impl Into<String>) -> ProxyError {
    ProxyError::InvalidGrant {
        line,
        reason: reason.into(),
    }
}

#[cold]
pub(crate) fn tls_error(what: impl std::fmt::Display) -> ProxyError {
    ProxyError::Tls(what.to_string())
}
