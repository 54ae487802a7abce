//! The fault switches: what each one is, how `NAME[=VALUE]` is read, and the effective set of
//! one invocation (`faults.json` plus `SBX_SIM_FAULTS`).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::{Result, SimError};

/// The environment variable whose `name[=value],…` entries are added to `faults.json` for one
/// invocation.
pub const FAULTS_ENV: &str = "SBX_SIM_FAULTS";

/// What `agent-socket` leaves at `/run/ssh-agent.sock` in a new sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketKind {
    /// An empty 0666 file.
    File,
    /// A dangling symbolic link.
    Link,
}

/// One fault switch with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Every gated command fails as if the login lapsed.
    LoginLapsed,
    /// Every gated command fails as if the daemon lost its VM backend.
    DaemonLostBackend,
    /// `settings get ssh.agentForwardingEnabled` says `true`.
    AgentForwarding,
    /// New sandboxes get `/run/ssh-agent.sock`, as from a daemon not restarted.
    AgentSocket(SocketKind),
    /// `mcp ls` lists one extra server.
    McpServer,
    /// `ls` lists nothing; `create` and `rm` fail with `backend unavailable`.
    LostEngine,
    /// The create worker waits this long before `docker run`.
    SlowCreate(Duration),
    /// The create never happens; the foreground blocks until killed.
    HungCreate,
    /// `exec` (only when the joined argv contains the substring, if given) blocks forever.
    HungExec(Option<String>),
    /// `ls --json` answers the legacy `{"sandboxes":[…]}` object.
    LsShapeKeyed,
    /// `mcp ls --json` answers `{"servers":[…]}`.
    McpShapeKeyed,
    /// `ls --json` answers an object without `sandboxes`.
    LsMalformed,
}

/// Every fault name, in the order `sim fault ls` prints them.
pub const FAULT_NAMES: [&str; 12] = [
    "login-lapsed",
    "daemon-fault",
    "agent-forwarding",
    "agent-socket",
    "mcp-server",
    "lost-engine",
    "slow-create",
    "hung-create",
    "hung-exec",
    "ls-shape",
    "mcp-shape",
    "ls-malformed",
];

impl Fault {
    /// Reads one `NAME[=VALUE]` switch.
    ///
    /// # Errors
    ///
    /// An unknown name, a value where none is taken, or a missing or bad value.
    pub fn parse(spec: &str) -> Result<Fault> {
        let (name, value) = match spec.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (spec, None),
        };
        Fault::from_parts(name, value)
    }

    /// Builds a switch from its name and optional value.
    ///
    /// # Errors
    ///
    /// As [`Fault::parse`].
    pub fn from_parts(name: &str, value: Option<&str>) -> Result<Fault> {
        let no_value = |fault: Fault| match value {
            None => Ok(fault),
            Some(v) => Err(SimError::invalid(format!(
                "fault {name} takes no value (got {v:?})"
            ))),
        };
        match name {
            "login-lapsed" => no_value(Fault::LoginLapsed),
            "daemon-fault" => no_value(Fault::DaemonLostBackend),
            "agent-forwarding" => no_value(Fault::AgentForwarding),
            "mcp-server" => no_value(Fault::McpServer),
            "lost-engine" => no_value(Fault::LostEngine),
            "hung-create" => no_value(Fault::HungCreate),
            "ls-malformed" => no_value(Fault::LsMalformed),
            "agent-socket" => match value {
                None | Some("file") => Ok(Fault::AgentSocket(SocketKind::File)),
                Some("link") => Ok(Fault::AgentSocket(SocketKind::Link)),
                Some(v) => Err(SimError::invalid(format!(
                    "fault agent-socket takes file or link (got {v:?})"
                ))),
            },
            "slow-create" => {
                let seconds = value
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 86_400.0)
                    .ok_or_else(|| {
                        SimError::invalid("fault slow-create needs SECONDS (0 to 86400)")
                    })?;
                Ok(Fault::SlowCreate(Duration::from_secs_f64(seconds)))
            }
            "hung-exec" => Ok(Fault::HungExec(
                value.filter(|v| !v.is_empty()).map(str::to_owned),
            )),
            "ls-shape" | "mcp-shape" => match value {
                Some("keyed") if name == "ls-shape" => Ok(Fault::LsShapeKeyed),
                Some("keyed") => Ok(Fault::McpShapeKeyed),
                _ => Err(SimError::invalid(format!(
                    "fault {name} takes the value keyed"
                ))),
            },
            other => Err(SimError::invalid(format!(
                "unknown fault {other:?}; known: {}",
                FAULT_NAMES.join(", ")
            ))),
        }
    }

    /// The switch's name, the key in `faults.json`.
    pub fn name(&self) -> &'static str {
        match self {
            Fault::LoginLapsed => "login-lapsed",
            Fault::DaemonLostBackend => "daemon-fault",
            Fault::AgentForwarding => "agent-forwarding",
            Fault::AgentSocket(_) => "agent-socket",
            Fault::McpServer => "mcp-server",
            Fault::LostEngine => "lost-engine",
            Fault::SlowCreate(_) => "slow-create",
            Fault::HungCreate => "hung-create",
            Fault::HungExec(_) => "hung-exec",
            Fault::LsShapeKeyed => "ls-shape",
            Fault::McpShapeKeyed => "mcp-shape",
            Fault::LsMalformed => "ls-malformed",
        }
    }

    /// The switch's value as stored, if it has one.
    pub fn value(&self) -> Option<String> {
        match self {
            Fault::AgentSocket(SocketKind::File) => Some("file".to_owned()),
            Fault::AgentSocket(SocketKind::Link) => Some("link".to_owned()),
            Fault::SlowCreate(d) => Some(format!("{}", d.as_secs_f64())),
            Fault::HungExec(sub) => sub.clone(),
            Fault::LsShapeKeyed | Fault::McpShapeKeyed => Some("keyed".to_owned()),
            _ => None,
        }
    }
}

/// The faults in force for one invocation, at most one per name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultSet {
    by_name: BTreeMap<&'static str, Fault>,
}

impl FaultSet {
    /// The set stored in `faults.json` (name → value or null).
    ///
    /// # Errors
    ///
    /// A stored entry that is not a valid switch.
    pub fn from_stored(stored: &BTreeMap<String, Option<String>>) -> Result<FaultSet> {
        let mut set = FaultSet::default();
        for (name, value) in stored {
            set.insert(Fault::from_parts(name, value.as_deref())?);
        }
        Ok(set)
    }

    /// The form stored in `faults.json`.
    pub fn to_stored(&self) -> BTreeMap<String, Option<String>> {
        self.by_name
            .values()
            .map(|f| (f.name().to_owned(), f.value()))
            .collect()
    }

    /// Adds the `name[=value],…` entries of `SBX_SIM_FAULTS` (empty entries ignored); an entry
    /// replaces a stored switch of the same name.
    ///
    /// # Errors
    ///
    /// An entry that is not a valid switch, named with the variable.
    pub fn add_env(&mut self, text: &str) -> Result<()> {
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let fault =
                Fault::parse(entry).map_err(|e| SimError::invalid(format!("{FAULTS_ENV}: {e}")))?;
            self.insert(fault);
        }
        Ok(())
    }

    /// Sets a switch, replacing one of the same name.
    pub fn insert(&mut self, fault: Fault) {
        self.by_name.insert(fault.name(), fault);
    }

    /// Clears one switch by name; whether it was set.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.by_name.len();
        self.by_name.retain(|k, _| *k != name);
        before != self.by_name.len()
    }

    /// Clears every switch.
    pub fn clear(&mut self) {
        self.by_name.clear();
    }

    /// The switch of this name, if set.
    pub fn get(&self, name: &str) -> Option<&Fault> {
        self.by_name.get(name)
    }

    /// Whether a switch of this name is set.
    pub fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Every switch, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Fault> {
        self.by_name.values()
    }

    /// The gate in front of every command but `version`, `login` and `sim …`: a lapsed login,
    /// then a daemon fault.
    ///
    /// # Errors
    ///
    /// [`SimError::NotLoggedIn`] or [`SimError::BackendUnavailable`].
    pub fn gate(&self) -> Result<()> {
        if self.has("login-lapsed") {
            return Err(SimError::NotLoggedIn);
        }
        if self.has("daemon-fault") {
            return Err(SimError::BackendUnavailable);
        }
        Ok(())
    }

    /// Whether `hung-exec` applies to an exec whose argv, joined with spaces, is `joined`.
    pub fn exec_hangs(&self, joined: &str) -> bool {
        match self.get("hung-exec") {
            Some(Fault::HungExec(Some(sub))) => joined.contains(sub.as_str()),
            Some(Fault::HungExec(None)) => true,
            _ => false,
        }
    }

    /// The `slow-create` delay, zero when unset.
    pub fn create_delay(&self) -> Duration {
        match self.get("slow-create") {
            Some(Fault::SlowCreate(d)) => *d,
            _ => Duration::ZERO,
        }
    }

    /// The `agent-socket` kind, when set.
    pub fn agent_socket(&self) -> Option<SocketKind> {
        match self.get("agent-socket") {
            Some(Fault::AgentSocket(kind)) => Some(*kind),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_fault_parses_and_round_trips() {
        let specs = [
            "login-lapsed",
            "daemon-fault",
            "agent-forwarding",
            "agent-socket",
            "agent-socket=link",
            "mcp-server",
            "lost-engine",
            "slow-create=2.5",
            "hung-create",
            "hung-exec",
            "hung-exec=sleep 99",
            "ls-shape=keyed",
            "mcp-shape=keyed",
            "ls-malformed",
        ];
        for spec in specs {
            let fault = Fault::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert!(FAULT_NAMES.contains(&fault.name()), "{spec}");
            let again = Fault::from_parts(fault.name(), fault.value().as_deref()).unwrap();
            assert_eq!(again, fault, "{spec}");
        }
        assert_eq!(
            Fault::parse("agent-socket").unwrap(),
            Fault::AgentSocket(SocketKind::File)
        );
        assert_eq!(
            Fault::parse("slow-create=3").unwrap(),
            Fault::SlowCreate(Duration::from_secs(3))
        );
    }

    #[test]
    fn bad_switches_are_refused_with_the_reason() {
        let cases = [
            ("no-such-fault", "unknown fault"),
            ("login-lapsed=1", "takes no value"),
            ("slow-create", "needs SECONDS"),
            ("slow-create=-1", "needs SECONDS"),
            ("slow-create=abc", "needs SECONDS"),
            ("slow-create=inf", "needs SECONDS"),
            ("agent-socket=dir", "file or link"),
            ("ls-shape", "keyed"),
            ("mcp-shape=array", "keyed"),
        ];
        for (spec, reason) in cases {
            let err = Fault::parse(spec).expect_err(spec).to_string();
            assert!(err.contains(reason), "{spec}: {err}");
        }
    }

    #[test]
    fn the_environment_adds_to_and_overrides_the_stored_set() {
        let mut stored = BTreeMap::new();
        stored.insert("slow-create".to_owned(), Some("9".to_owned()));
        stored.insert("mcp-server".to_owned(), None);
        let mut set = FaultSet::from_stored(&stored).unwrap();
        set.add_env(" slow-create=1 ,, lost-engine").unwrap();
        assert_eq!(set.create_delay(), Duration::from_secs(1));
        assert!(set.has("lost-engine") && set.has("mcp-server"));
        assert_eq!(set.iter().count(), 3);
        let err = set.add_env("bogus").unwrap_err().to_string();
        assert!(err.starts_with(FAULTS_ENV), "{err}");
        let round = FaultSet::from_stored(&set.to_stored()).unwrap();
        assert_eq!(round, set);
    }

    #[test]
    fn the_gate_reports_a_lapsed_login_before_a_daemon_fault() {
        let mut set = FaultSet::default();
        assert!(set.gate().is_ok());
        set.insert(Fault::DaemonLostBackend);
        assert!(matches!(set.gate(), Err(SimError::BackendUnavailable)));
        set.insert(Fault::LoginLapsed);
        assert!(matches!(set.gate(), Err(SimError::NotLoggedIn)));
        assert!(set.remove("login-lapsed"));
        assert!(!set.remove("login-lapsed"));
    }

    proptest::proptest! {
        #[test]
        fn any_switch_text_parses_or_is_refused_without_panic(text in "\\PC{0,40}") {
            if let Ok(fault) = Fault::parse(&text) {
                proptest::prop_assert!(FAULT_NAMES.contains(&fault.name()));
            }
            let mut set = FaultSet::default();
            let _ = set.add_env(&text);
        }
    }

    #[test]
    fn hung_exec_matches_only_its_substring() {
        let mut set = FaultSet::default();
        assert!(!set.exec_hangs("sb sh -c true"));
        set.insert(Fault::parse("hung-exec=sleep").unwrap());
        assert!(set.exec_hangs("sb sh -c sleep 5"));
        assert!(!set.exec_hangs("sb sh -c true"));
        set.insert(Fault::parse("hung-exec").unwrap());
        assert!(set.exec_hangs("anything"));
    }
}
