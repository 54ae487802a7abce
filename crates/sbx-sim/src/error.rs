//! The one error type of the simulator: everything that ends a command with exit 1.
//!
//! Each message is the text printed after `ERROR: ` on one stderr line, worded as real `sbx`
//! words the same failure where a client classifies it by text (`already exists`, `not found`,
//! `backend unavailable`, `not logged in`, `kit startup exited with code 127`).

use std::path::PathBuf;

/// An operational failure of one command (usage errors are clap's and exit 2 instead).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The `login-lapsed` fault is set.
    #[error("You are not logged in. Run 'sbx login' to sign in.")]
    NotLoggedIn,
    /// The `daemon-fault` or `lost-engine` fault answers for the daemon.
    #[error("backend unavailable: sandboxd cannot reach its engine")]
    BackendUnavailable,
    /// A create whose name is taken (checked first, then settled by the engine's atomic name).
    #[error("sandbox {name} already exists")]
    AlreadyExists {
        /// The sandbox name.
        name: String,
    },
    /// No sandbox of this name in this state home.
    #[error("sandbox {name} not found")]
    NotFound {
        /// The sandbox name.
        name: String,
    },
    /// The template has no `/bin/sh` or no `/bin/bash`.
    #[error("kit startup exited with code 127")]
    TemplateCannotStart,
    /// User namespaces cannot be made inside the sandbox, so the exec wrapper could not work.
    #[error(
        "user namespaces are not usable in the sandbox ({detail}); allow them on the host \
         (sysctl kernel.unprivileged_userns_clone=1, kernel.apparmor_restrict_unprivileged_userns=0)"
    )]
    NoUserNamespaces {
        /// What `unshare` said.
        detail: String,
    },
    /// A request the command refuses (bad value, wrong state, unknown key).
    #[error("{message}")]
    Invalid {
        /// What is wrong, and with which value.
        message: String,
    },
    /// A docker call ran and failed.
    #[error("docker {what} failed: {detail}")]
    Docker {
        /// Which call (`run`, `inspect`, `rm`, …).
        what: &'static str,
        /// The tail of docker's stderr, or `exit <rc>`.
        detail: String,
    },
    /// A docker call could not complete: not started, past its deadline, over its output cap.
    #[error("docker {what}: {source}")]
    Runner {
        /// Which call.
        what: &'static str,
        /// The bounded runner's error.
        #[source]
        source: bounded_process::Error,
    },
    /// Docker answered with something this program cannot read.
    #[error("docker {what} answered something unreadable: {detail}")]
    Malformed {
        /// Which call.
        what: &'static str,
        /// Why it could not be read.
        detail: String,
    },
    /// A file of the state directory could not be read or written.
    #[error("state file {}: {source}", path.display())]
    State {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl SimError {
    /// A refused request. Cold: never the common path.
    #[cold]
    #[inline(never)]
    pub fn invalid(message: impl Into<String>) -> Self {
        SimError::Invalid {
            message: message.into(),
        }
    }

    /// A failed state-file operation. Cold: never the common path.
    #[cold]
    #[inline(never)]
    pub fn state(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SimError::State {
            path: path.into(),
            source,
        }
    }

    /// A docker call that exited non-zero. Cold: never the common path.
    #[cold]
    #[inline(never)]
    pub fn docker(what: &'static str, detail: impl Into<String>) -> Self {
        SimError::Docker {
            what,
            detail: detail.into(),
        }
    }

    /// A docker call the runner could not complete. Cold: never the common path.
    #[cold]
    #[inline(never)]
    pub fn runner(what: &'static str, source: bounded_process::Error) -> Self {
        SimError::Runner { what, source }
    }

    /// An unreadable docker answer. Cold: never the common path.
    #[cold]
    #[inline(never)]
    pub fn malformed(what: &'static str, detail: impl Into<String>) -> Self {
        SimError::Malformed {
            what,
            detail: detail.into(),
        }
    }

    /// The one line printed on stderr: `ERROR: ` and the message with line breaks flattened.
    pub fn error_line(&self) -> String {
        let text = self.to_string();
        let flat: Vec<&str> = text.split(['\n', '\r']).filter(|s| !s.is_empty()).collect();
        format!("ERROR: {}", flat.join(" "))
    }
}

/// Shorthand for this crate's results.
pub type Result<T, E = SimError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_line_is_one_line_with_the_prefix() {
        let err = SimError::docker("run", "first\r\nsecond\n\nthird");
        assert_eq!(
            err.error_line(),
            "ERROR: docker run failed: first second third"
        );
        assert_eq!(
            SimError::NotFound { name: "sb".into() }.error_line(),
            "ERROR: sandbox sb not found"
        );
        assert_eq!(
            SimError::NotLoggedIn.error_line(),
            "ERROR: You are not logged in. Run 'sbx login' to sign in."
        );
        assert_eq!(
            SimError::BackendUnavailable.error_line(),
            "ERROR: backend unavailable: sandboxd cannot reach its engine"
        );
        assert_eq!(
            SimError::TemplateCannotStart.error_line(),
            "ERROR: kit startup exited with code 127"
        );
    }
}
