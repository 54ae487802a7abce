//! The only place exit-code integers are chosen, so scripts see one stable table.

use sandbox_core::ErrorKind;

/// `run`/`exec`: the caller's `--timeout` expired.
pub const TIMEOUT: u8 = 124;
/// `run`/`exec`: anything that is not the command's own status.
pub const RUN_FAILURE: u8 = 125;
/// Other commands: usage error.
pub const USAGE: u8 = 2;
/// Other commands: invalid argument.
pub const INVALID_ARGUMENT: u8 = 64;
/// Other commands: confinement refusal.
pub const CONFINEMENT: u8 = 65;
/// Other commands: not found.
pub const NOT_FOUND: u8 = 66;
/// Other commands: wrong kind of entry.
pub const WRONG_KIND: u8 = 67;
/// Other commands: over the transfer cap.
pub const OVER_CAP: u8 = 68;
/// Other commands: not permitted.
pub const NOT_PERMITTED: u8 = 69;
/// Other commands: engine or sandbox error, undisposed leftovers, failed image build.
pub const ENGINE: u8 = 70;
/// Other commands: retired sandbox.
pub const RETIRED: u8 = 71;

/// The exit code of a command other than `run`/`exec` that failed with `kind`.
pub fn for_kind(kind: ErrorKind) -> u8 {
    use ErrorKind as K;
    match kind {
        K::InvalidArgument | K::SpecMismatch | K::NoBackend => INVALID_ARGUMENT,
        K::Confinement => CONFINEMENT,
        K::NotFound => NOT_FOUND,
        K::IsADirectory | K::NotADirectory | K::NotRegularFile => WRONG_KIND,
        K::TransferCapExceeded => OVER_CAP,
        K::NotPermitted
        | K::CapabilityNotSupported
        | K::CapabilityDenied
        | K::OsFamilyNotSupported
        | K::EgressNotEnforced
        | K::ScopeNotEnforced
        | K::TransferLimitsNotPermitted
        | K::HostNotConfined
        | K::Unsupported => NOT_PERMITTED,
        K::Retired => RETIRED,
        // Engine and sandbox failures, and anything a later core version adds.
        _ => ENGINE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind as K;

    #[test]
    fn table() {
        let rows = [
            (K::InvalidArgument, 64),
            (K::SpecMismatch, 64),
            (K::NoBackend, 64),
            (K::Confinement, 65),
            (K::NotFound, 66),
            (K::IsADirectory, 67),
            (K::NotADirectory, 67),
            (K::NotRegularFile, 67),
            (K::TransferCapExceeded, 68),
            (K::NotPermitted, 69),
            (K::CapabilityNotSupported, 69),
            (K::CapabilityDenied, 69),
            (K::OsFamilyNotSupported, 69),
            (K::EgressNotEnforced, 69),
            (K::ScopeNotEnforced, 69),
            (K::TransferLimitsNotPermitted, 69),
            (K::HostNotConfined, 69),
            (K::Unsupported, 69),
            (K::Engine, 70),
            (K::EngineTimeout, 70),
            (K::BackendUnavailable, 70),
            (K::LoginRequired, 70),
            (K::DaemonFault, 70),
            (K::SandboxGone, 70),
            (K::WorkspaceMismatch, 70),
            (K::Busy, 70),
            (K::ImageMissing, 70),
            (K::Unclean, 70),
            (K::GuestRefused, 70),
            (K::Io, 70),
            (K::ContractViolation, 70),
            (K::Timeout, 70),
            (K::OutputLimitExceeded, 70),
            (K::Retired, 71),
        ];
        for (kind, code) in rows {
            assert_eq!(for_kind(kind), code, "{kind:?}");
        }
    }
}
