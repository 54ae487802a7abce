//! What an accept loop does with an accept error, shared by the proxy's, the forwarder's and
//! the test server's.
//!
//! An error about one connection (it was aborted or reset before it was taken, the call was
//! interrupted) or about a shortage of descriptors (`EMFILE`, `ENFILE`: connections in flight
//! hold them) passes: the loop waits a moment, so a shortage lets connections finish instead of
//! spinning on `accept`, and goes on. Any other error (the listener itself is broken) ends the
//! loop with it.

use std::time::Duration;

use rustix::io::Errno;

/// How long a loop waits after an error that passes.
const PAUSE: Duration = Duration::from_millis(50);

/// Whether `error` from `accept` leaves the listener usable.
pub(crate) fn is_per_connection(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::Interrupted
    ) || error.raw_os_error().is_some_and(|code| {
        code == Errno::MFILE.raw_os_error() || code == Errno::NFILE.raw_os_error()
    })
}

/// After an accept error: waits and returns `Ok` when the loop should go on, else the error.
///
/// # Errors
/// `error` itself when it is not [per connection](is_per_connection).
pub(crate) async fn pass_or_fail(error: std::io::Error) -> std::io::Result<()> {
    if is_per_connection(&error) {
        tokio::time::sleep(PAUSE).await;
        Ok(())
    } else {
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn connection_errors_and_descriptor_shortages_pass_and_nothing_else() {
        for kind in [
            ErrorKind::ConnectionAborted,
            ErrorKind::ConnectionReset,
            ErrorKind::Interrupted,
        ] {
            assert!(is_per_connection(&Error::from(kind)), "{kind:?}");
        }
        for errno in [Errno::MFILE, Errno::NFILE] {
            assert!(is_per_connection(&errno.into()), "{errno:?}");
        }
        // EINVAL: a socket that is not listening.
        for errno in [
            Errno::INVAL,
            Errno::BADF,
            Errno::NOTSOCK,
            Errno::NOMEM,
            Errno::PERM,
        ] {
            assert!(!is_per_connection(&errno.into()), "{errno:?}");
        }
        for kind in [
            ErrorKind::InvalidInput,
            ErrorKind::PermissionDenied,
            ErrorKind::Other,
        ] {
            assert!(!is_per_connection(&Error::from(kind)), "{kind:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_passing_error_waits_and_a_failing_one_returns_at_once() {
        let started = tokio::time::Instant::now();
        assert!(pass_or_fail(Errno::MFILE.into()).await.is_ok());
        assert!(started.elapsed() >= PAUSE);
        let started = tokio::time::Instant::now();
        let failed = pass_or_fail(Errno::INVAL.into()).await.unwrap_err();
        assert_eq!(failed.raw_os_error(), Some(Errno::INVAL.raw_os_error()));
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
