//! Disposal reports. Disposal never raises: it returns one of these.

use std::fmt;

use crate::wire::{wire_enum, wire_from_str};

wire_enum! {
    /// Why a disposal did not land. Declaration order is the folding precedence.
    pub enum DisposalCode ("disposal code") {
        /// The engine was never reached; worth retrying.
        Unreachable => "unreachable",
        /// The disposal did not finish; its outcome is unknown.
        Timeout => "timeout",
        /// The engine answered and the sandbox is still there.
        Refused => "refused",
        /// The enumeration failed; a sweep may be partial.
        Unlisted => "unlisted",
        /// Unclassified.
        Unknown => "unknown",
    }
}
wire_from_str!(DisposalCode, "disposal code");

/// One failed disposal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DisposalFailure {
    /// The class of failure.
    pub code: DisposalCode,
    /// What happened, for people.
    pub detail: String,
}

impl DisposalFailure {
    /// A failure of `code` with `detail`.
    pub fn new(code: DisposalCode, detail: impl Into<String>) -> Self {
        DisposalFailure {
            code,
            detail: detail.into(),
        }
    }

    /// The same failure with `prefix` before its detail (the router names the backend this way).
    pub fn prefixed(self, prefix: &str) -> Self {
        DisposalFailure {
            code: self.code,
            detail: format!("{prefix}{}", self.detail),
        }
    }

    /// Folds failures into one: `None` when there are none; one is returned unchanged; several take the
    /// code first present in the precedence unreachable > timeout > refused > unlisted > unknown and join
    /// their details with `"; "`.
    ///
    /// ```
    /// use sandbox_core::{DisposalCode, DisposalFailure};
    /// let folded = DisposalFailure::fold([
    ///     DisposalFailure::new(DisposalCode::Refused, "a"),
    ///     DisposalFailure::new(DisposalCode::Timeout, "b"),
    /// ]);
    /// assert_eq!(folded, Some(DisposalFailure::new(DisposalCode::Timeout, "a; b")));
    /// assert_eq!(DisposalFailure::fold([]), None);
    /// ```
    pub fn fold(failures: impl IntoIterator<Item = DisposalFailure>) -> Option<DisposalFailure> {
        let mut failures: Vec<DisposalFailure> = failures.into_iter().collect();
        match failures.len() {
            0 => None,
            1 => failures.pop(),
            _ => {
                let code = failures.iter().map(|f| f.code).min()?;
                let detail = failures
                    .iter()
                    .map(|f| f.detail.as_str())
                    .collect::<Vec<_>>()
                    .join("; ");
                Some(DisposalFailure { code, detail })
            }
        }
    }
}

impl fmt::Display for DisposalFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

/// The outcome of disposing of every sandbox of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScopePurge {
    /// How many sandboxes were disposed of.
    pub disposed: u32,
    /// What did not land, folded.
    pub undisposed: Option<DisposalFailure>,
}

/// Which sandboxes of a key one disposal targets.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DisposeSelector {
    /// Only this kind; `None` sweeps every kind of the key.
    pub kind: Option<String>,
    /// Only this physical instance; a stale or absent id is a no-op and never selects its replacement.
    pub instance_id: Option<String>,
}

impl DisposeSelector {
    /// Every kind of the key.
    pub fn all() -> Self {
        DisposeSelector::default()
    }

    /// One kind.
    pub fn kind(kind: impl Into<String>) -> Self {
        DisposeSelector {
            kind: Some(kind.into()),
            instance_id: None,
        }
    }

    /// One physical instance of one kind.
    pub fn instance(kind: impl Into<String>, instance_id: impl Into<String>) -> Self {
        DisposeSelector {
            kind: Some(kind.into()),
            instance_id: Some(instance_id.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_empty_and_one() {
        assert_eq!(DisposalFailure::fold(Vec::new()), None);
        let one = DisposalFailure::new(DisposalCode::Unknown, "x");
        assert_eq!(DisposalFailure::fold(vec![one.clone()]), Some(one));
    }

    #[test]
    fn fold_takes_precedence_and_joins_details() {
        let got = DisposalFailure::fold(vec![
            DisposalFailure::new(DisposalCode::Unlisted, "a"),
            DisposalFailure::new(DisposalCode::Timeout, "b"),
            DisposalFailure::new(DisposalCode::Refused, "c"),
        ])
        .unwrap();
        assert_eq!(got.code, DisposalCode::Timeout);
        assert_eq!(got.detail, "a; b; c");
        assert_eq!(got.to_string(), "timeout: a; b; c");
        let got = DisposalFailure::fold(vec![
            DisposalFailure::new(DisposalCode::Unknown, "u"),
            DisposalFailure::new(DisposalCode::Unreachable, "r"),
        ])
        .unwrap();
        assert_eq!(got.code, DisposalCode::Unreachable);
    }

    #[test]
    fn precedence_order() {
        let order: Vec<&str> = DisposalCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            order,
            ["unreachable", "timeout", "refused", "unlisted", "unknown"]
        );
    }
}
