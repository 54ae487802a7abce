//! The key a host names its sandboxes by.

use std::fmt;

/// Who a sandbox belongs to: four host-supplied strings, never taken from the model.
///
/// `call_id == ""` means the key is conversation-scoped; a non-empty `call_id` makes it call-scoped.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SandboxKey {
    /// The host's scope (a tenant, an evaluation run).
    pub scope: String,
    /// The conversation.
    pub thread_id: String,
    /// The agent within the conversation.
    pub agent_id: String,
    /// The tool call, or `""` for a conversation-scoped key.
    pub call_id: String,
}

impl SandboxKey {
    /// A conversation-scoped key.
    pub fn conversation(
        scope: impl Into<String>,
        thread_id: impl Into<String>,
        agent_id: impl Into<String>,
    ) -> Self {
        SandboxKey {
            scope: scope.into(),
            thread_id: thread_id.into(),
            agent_id: agent_id.into(),
            call_id: String::new(),
        }
    }

    /// The same key narrowed to one tool call.
    pub fn with_call(mut self, call_id: impl Into<String>) -> Self {
        self.call_id = call_id.into();
        self
    }

    /// Whether the key names a tool call.
    pub fn is_call(&self) -> bool {
        !self.call_id.is_empty()
    }

    /// The conversation this key belongs to (the key without its call id).
    pub fn conversation_key(&self) -> SandboxKey {
        SandboxKey {
            call_id: String::new(),
            ..self.clone()
        }
    }
}

impl fmt::Display for SandboxKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?}/{:?}/{:?}",
            self.scope, self.thread_id, self.agent_id
        )?;
        if self.is_call() {
            write!(f, " call {:?}", self.call_id)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_and_conversation() {
        let k = SandboxKey::conversation("s", "t", "a");
        assert!(!k.is_call());
        let c = k.clone().with_call("c1");
        assert!(c.is_call());
        assert_eq!(c.conversation_key(), k);
        assert_ne!(c, k);
    }
}
