//! The cleanup rungs: what a host may do to a sandbox between two uses, weakest first.

use crate::wire::{wire_enum, wire_from_str};
use crate::{BackendDeclarations, Capability};

wire_enum! {
    /// One cleanup a host may apply between two uses of a sandbox, ordered from the weakest
    /// (`reclaim` < `reset` < `dispose`): each rung removes at least what the one below removes.
    pub enum CleanupRung ("cleanup rung") {
        /// Remove the finished call's directory; everything else the call made stays
        /// (the `reclaim` capability).
        Reclaim => "reclaim",
        /// Return the sandbox to its state when it was acquired: every file and process made
        /// since is gone, the storage base is kept (the `snapshot` capability).
        Reset => "reset",
        /// Remove the sandbox; the next acquire makes a new one. Every backend can.
        Dispose => "dispose",
    }
}

wire_from_str!(CleanupRung, "cleanup rung");

impl CleanupRung {
    /// The capability a backend declares to offer this rung; `None` for `dispose`, which every
    /// backend offers.
    ///
    /// ```
    /// use sandbox_core::{Capability, CleanupRung};
    /// assert_eq!(CleanupRung::Reset.capability(), Some(Capability::Snapshot));
    /// assert_eq!(CleanupRung::Dispose.capability(), None);
    /// ```
    pub fn capability(self) -> Option<Capability> {
        match self {
            CleanupRung::Reclaim => Some(Capability::Reclaim),
            CleanupRung::Reset => Some(Capability::Snapshot),
            CleanupRung::Dispose => None,
        }
    }

    /// The weakest rung at or above `floor` that `declarations` offer. Always one: `dispose` is
    /// offered by every backend, so a floor the backend cannot meet by a cheaper rung is met by
    /// disposal, never lowered.
    ///
    /// ```
    /// use std::collections::BTreeSet;
    /// use sandbox_core::{BackendDeclarations, Capability, CleanupRung};
    ///
    /// let silent = BackendDeclarations::default();
    /// assert_eq!(CleanupRung::at_least(CleanupRung::Reset, &silent), CleanupRung::Dispose);
    ///
    /// let snapshots = BackendDeclarations {
    ///     capabilities: BTreeSet::from([Capability::Exec, Capability::Snapshot]),
    ///     ..BackendDeclarations::default()
    /// };
    /// assert_eq!(CleanupRung::at_least(CleanupRung::Reclaim, &snapshots), CleanupRung::Reset);
    /// ```
    pub fn at_least(floor: CleanupRung, declarations: &BackendDeclarations) -> CleanupRung {
        CleanupRung::ALL
            .iter()
            .copied()
            .filter(|rung| *rung >= floor)
            .find(|rung| rung.capability().is_none_or(|c| declarations.serves(c)))
            .unwrap_or(CleanupRung::Dispose)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn declaring(capabilities: &[Capability]) -> BackendDeclarations {
        BackendDeclarations {
            capabilities: capabilities.iter().copied().collect::<BTreeSet<_>>(),
            ..BackendDeclarations::default()
        }
    }

    #[test]
    fn rungs_are_ordered_and_round_trip() {
        assert!(CleanupRung::Reclaim < CleanupRung::Reset);
        assert!(CleanupRung::Reset < CleanupRung::Dispose);
        for &rung in CleanupRung::ALL {
            assert_eq!(rung.as_str().parse::<CleanupRung>().unwrap(), rung);
        }
        assert!("RESET".parse::<CleanupRung>().is_err());
        assert!("snapshot".parse::<CleanupRung>().is_err());
    }

    #[test]
    fn the_weakest_declared_rung_at_or_above_the_floor() {
        let none = declaring(&[Capability::Exec]);
        let reclaim = declaring(&[Capability::Exec, Capability::Reclaim]);
        let snapshot = declaring(&[Capability::Exec, Capability::Snapshot]);
        let both = declaring(&[Capability::Exec, Capability::Reclaim, Capability::Snapshot]);
        let cases = [
            (CleanupRung::Reclaim, &none, CleanupRung::Dispose),
            (CleanupRung::Reclaim, &reclaim, CleanupRung::Reclaim),
            (CleanupRung::Reclaim, &snapshot, CleanupRung::Reset),
            (CleanupRung::Reclaim, &both, CleanupRung::Reclaim),
            (CleanupRung::Reset, &reclaim, CleanupRung::Dispose),
            (CleanupRung::Reset, &both, CleanupRung::Reset),
            (CleanupRung::Dispose, &both, CleanupRung::Dispose),
        ];
        for (floor, declarations, expected) in cases {
            assert_eq!(
                CleanupRung::at_least(floor, declarations),
                expected,
                "{floor} over {:?}",
                declarations.capabilities
            );
        }
    }
}
