//! Capabilities a spec requires and a backend declares.

use std::collections::BTreeSet;

use crate::wire::wire_enum;
use crate::ParseError;

wire_enum! {
    /// One thing a sandbox can do for its host.
    pub enum Capability ("capability") {
        /// Run commands.
        Exec => "exec",
        /// Write files into the sandbox.
        FilesIn => "files_in",
        /// Stat and read named paths (no enumeration).
        FilesOut => "files_out",
        /// Enumerate one directory.
        FilesList => "files_list",
        /// Remove paths.
        FilesDelete => "files_delete",
        /// Remove a call's directory. Backend-only: a spec may not require it.
        Reclaim => "reclaim",
        /// Return a sandbox to its state at acquire ([`Sandbox::reset`](crate::Sandbox::reset))
        /// and copy one into a new sandbox under another key
        /// ([`SandboxBackend::fork`](crate::SandboxBackend::fork)).
        Snapshot => "snapshot",
        /// Egress rules that restrict HTTP methods.
        EgressMethods => "egress_methods",
        /// Egress rules that restrict URL paths.
        EgressPaths => "egress_paths",
        /// A call's kill (its timeout, its output over budget, its stream dropped) ends every
        /// process the call started, in whatever process group or session it moved to; a kill
        /// that cannot show it did retires the sandbox. Without it the kill reaches the
        /// command's process group only: a process that left it (`setsid`, a daemon) runs on
        /// until the sandbox is disposed of, and a command that removes the group's record
        /// retires its sandbox.
        ExactKill => "exact_kill",
        /// A command may call the host's tools while it runs
        /// ([`run_with_host_tools`](crate::host_tool_run::run_with_host_tools)): the guest
        /// carries the `host-tool` relay and the backend streams exec with stdin.
        HostTools => "host_tools",
    }
}

/// Wire strings the contract knows but this version deliberately does not support.
const OUT_OF_SCOPE: &[&str] = &["run_code", "attached_identity"];

impl std::str::FromStr for Capability {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        if let Some(c) = Capability::parse_known(s) {
            return Ok(c);
        }
        if OUT_OF_SCOPE.contains(&s) {
            return Err(ParseError::NotSupportedInThisVersion {
                what: "capability",
                value: s.to_owned(),
            });
        }
        Err(ParseError::Unknown {
            what: "capability",
            value: s.to_owned(),
        })
    }
}

/// Capabilities that need a prepared storage base: each one addresses paths relative to it.
pub(crate) const STORAGE_CAPABILITIES: [Capability; 5] = [
    Capability::Exec,
    Capability::FilesIn,
    Capability::FilesOut,
    Capability::FilesList,
    Capability::FilesDelete,
];

impl Capability {
    /// What every sandbox owes and what a silent backend declares: `{exec, files_in}`.
    pub fn defaults() -> BTreeSet<Capability> {
        BTreeSet::from([Capability::Exec, Capability::FilesIn])
    }

    /// Exec, every file capability and reclaim: what a backend that runs commands and moves
    /// files through the full contract declares before anything of its own
    /// ([`Snapshot`](Capability::Snapshot), [`ExactKill`](Capability::ExactKill),
    /// [`HostTools`](Capability::HostTools), the egress rules).
    pub fn exec_and_files() -> BTreeSet<Capability> {
        BTreeSet::from([
            Capability::Exec,
            Capability::FilesIn,
            Capability::FilesOut,
            Capability::FilesList,
            Capability::FilesDelete,
            Capability::Reclaim,
        ])
    }

    /// Whether a set of required capabilities needs the storage base prepared.
    pub fn needs_storage_base(required: &BTreeSet<Capability>) -> bool {
        STORAGE_CAPABILITIES.iter().any(|c| required.contains(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_strings() {
        for &c in Capability::ALL {
            assert_eq!(c.as_str().parse::<Capability>().unwrap(), c);
        }
    }

    #[test]
    fn out_of_scope_is_its_own_error() {
        for s in OUT_OF_SCOPE {
            assert!(matches!(
                s.parse::<Capability>(),
                Err(ParseError::NotSupportedInThisVersion { .. })
            ));
        }
        assert!(matches!(
            "teleport".parse::<Capability>(),
            Err(ParseError::Unknown { .. })
        ));
        assert!(matches!(
            "EXEC".parse::<Capability>(),
            Err(ParseError::Unknown { .. })
        ));
    }

    #[test]
    fn exec_and_files_is_everything_but_the_optional_extras() {
        let extras = BTreeSet::from([
            Capability::Snapshot,
            Capability::EgressMethods,
            Capability::EgressPaths,
            Capability::ExactKill,
            Capability::HostTools,
        ]);
        let everything: BTreeSet<Capability> = Capability::ALL.iter().copied().collect();
        assert_eq!(
            Capability::exec_and_files(),
            everything.difference(&extras).copied().collect()
        );
        assert!(Capability::defaults().is_subset(&Capability::exec_and_files()));
    }

    #[test]
    fn defaults_and_storage() {
        assert_eq!(
            Capability::defaults().into_iter().collect::<Vec<_>>(),
            vec![Capability::Exec, Capability::FilesIn]
        );
        assert!(Capability::needs_storage_base(&Capability::defaults()));
        assert!(!Capability::needs_storage_base(&BTreeSet::from([
            Capability::EgressPaths
        ])));
        assert!(!Capability::needs_storage_base(&BTreeSet::new()));
    }
}
