//! The check of a fork's keys that every backend's `fork` makes before any I/O.

use crate::{SandboxError, SandboxKey};

/// Refuses a fork whose target is its source, as
/// [`SandboxBackend::fork`](crate::SandboxBackend::fork) requires of every backend (and the
/// router before it picks one): a fork is a new sandbox under another key.
///
/// # Errors
/// [`SandboxError::InvalidArgument`] when `target` is `source`.
pub fn refuse_fork_onto_source(
    source: &SandboxKey,
    target: &SandboxKey,
) -> Result<(), SandboxError> {
    if source == target {
        return Err(fork_onto_source());
    }
    Ok(())
}

#[cold]
fn fork_onto_source() -> SandboxError {
    SandboxError::invalid("a fork needs a target key other than its source")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn only_another_key_is_a_forks_target() {
        let source = SandboxKey::conversation("s", "t", "a");
        let refused = refuse_fork_onto_source(&source, &source.clone()).unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::InvalidArgument);
        assert!(
            refused.to_string().contains("other than its source"),
            "{refused}"
        );
        let other_thread = SandboxKey::conversation("s", "u", "a");
        assert!(refuse_fork_onto_source(&source, &other_thread).is_ok());
        let a_call = source.clone().with_call("c");
        assert!(refuse_fork_onto_source(&source, &a_call).is_ok());
    }
}
