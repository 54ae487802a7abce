//! The isolation ladder, isolation scopes and OS families.

use crate::wire::{wire_enum, wire_from_str};

wire_enum! {
    /// The isolation rung a backend provides, least to most isolated. Ordering is by rank.
    ///
    /// The old string `process` is not accepted: it once meant `none` and must never be read as `os_process`.
    pub enum Isolation ("isolation") {
        /// Rank 0: no boundary (fakes, tests).
        None => "none",
        /// Rank 1: a software boundary inside the host process.
        Runtime => "runtime",
        /// Rank 2: a separate process sharing the kernel and file system.
        OsProcess => "os_process",
        /// Rank 3: namespaces and cgroups, shared kernel.
        Container => "container",
        /// Rank 4: a user-space kernel (gVisor class).
        HardenedContainer => "hardened_container",
        /// Rank 5: a hypervisor boundary (sbx, Firecracker, Kata).
        Microvm => "microvm",
        /// Rank 6: a dedicated full virtual machine.
        Vm => "vm",
    }
}
wire_from_str!(Isolation, "isolation");

impl Isolation {
    /// The rung's rank, 0 (`none`) to 6 (`vm`).
    pub fn rank(self) -> u8 {
        self as u8
    }

    /// Whether this rung meets `floor`. `None` as the floor means "no opinion" and always passes.
    pub fn meets_floor(self, floor: Option<Isolation>) -> bool {
        floor.is_none_or(|f| self.rank() >= f.rank())
    }
}

wire_enum! {
    /// How long one sandbox lives: a conversation (reused) or one tool call. Ordering is by rank.
    pub enum IsolationScope ("isolation scope") {
        /// Rank 0: one sandbox per key-without-call and kind, reused across calls.
        Conversation => "conversation",
        /// Rank 1: one sandbox per tool call, disposed when the call ends.
        Call => "call",
    }
}
wire_from_str!(IsolationScope, "isolation scope");

impl IsolationScope {
    /// The scope's rank.
    pub fn rank(self) -> u8 {
        self as u8
    }

    /// The effective scope: the higher of the host floor and the spec's own.
    pub fn effective(host_floor: IsolationScope, spec: IsolationScope) -> IsolationScope {
        host_floor.max(spec)
    }
}

wire_enum! {
    /// The guest OS family: path grammar and argv quoting, not installed software.
    pub enum OsFamily ("OS family") {
        /// POSIX paths and `sh`.
        Posix => "posix",
        /// Windows paths and quoting.
        Windows => "windows",
    }
}
wire_from_str!(OsFamily, "OS family");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_follow_the_ladder() {
        let ranks: Vec<u8> = Isolation::ALL.iter().map(|i| i.rank()).collect();
        assert_eq!(ranks, vec![0, 1, 2, 3, 4, 5, 6]);
        assert!(Isolation::Microvm > Isolation::Container);
        assert!(Isolation::None < Isolation::Runtime);
    }

    #[test]
    fn wire_strings_round_trip() {
        for &i in Isolation::ALL {
            assert_eq!(i.as_str().parse::<Isolation>().unwrap(), i);
        }
        assert_eq!(
            "os_process".parse::<Isolation>().unwrap(),
            Isolation::OsProcess
        );
    }

    #[test]
    fn process_is_refused_not_mapped() {
        let err = "process".parse::<Isolation>().unwrap_err();
        assert!(matches!(err, crate::ParseError::Unknown { .. }));
        for bad in ["", "Container", "microVM", " vm", "vm ", "os-process"] {
            assert!(bad.parse::<Isolation>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn floors() {
        assert!(Isolation::Container.meets_floor(None));
        assert!(Isolation::None.meets_floor(None));
        assert!(Isolation::Container.meets_floor(Some(Isolation::Container)));
        assert!(!Isolation::Container.meets_floor(Some(Isolation::Microvm)));
        assert!(Isolation::Vm.meets_floor(Some(Isolation::Microvm)));
        assert!(!Isolation::None.meets_floor(Some(Isolation::Runtime)));
    }

    #[test]
    fn scopes_and_families() {
        assert_eq!(
            IsolationScope::effective(IsolationScope::Call, IsolationScope::Conversation),
            IsolationScope::Call
        );
        assert_eq!(
            IsolationScope::effective(IsolationScope::Conversation, IsolationScope::Conversation),
            IsolationScope::Conversation
        );
        assert_eq!(
            "call".parse::<IsolationScope>().unwrap(),
            IsolationScope::Call
        );
        assert!("Call".parse::<IsolationScope>().is_err());
        assert_eq!("windows".parse::<OsFamily>().unwrap(), OsFamily::Windows);
        assert!("linux".parse::<OsFamily>().is_err());
    }
}
