//! A branch and its state machine.
//!
//! ```text
//! created ──▶ active ──▶ completed
//!    │          ├──────▶ timeout   (deadline_exceeded | budget_exhausted)
//!    └──────────┴──────▶ failed    (reported_failure | parent_returning | session_ended)
//! ```
//!
//! Terminal states never change. The store makes every transition one
//! conditional update from `active`, so concurrent returns, deadlines and
//! exhaustion cannot both win.

use std::{fmt, str::FromStr};

use chrono::{DateTime, Utc};

use crate::{BranchId, BranchKind, Ledger, ReturnTier, SessionId, Subject, TenantId, Tokens};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BranchStatus {
    /// Being set up; not yet usable.
    Created,
    /// Running: may consume tokens, have children, and return.
    Active,
    /// Returned normally by the agent.
    Completed,
    /// Force-returned for its deadline or its budget.
    Timeout,
    /// Returned with `outcome = "failure"`, or force-returned because its
    /// parent returned or its session ended.
    Failed,
}

impl BranchStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Active => "active",
            Self::Completed => "completed",
            Self::Timeout => "timeout",
            Self::Failed => "failed",
        }
    }

    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Timeout | Self::Failed)
    }

    /// The legal transitions of the state machine.
    pub const fn can_become(self, next: Self) -> bool {
        matches!(
            (self, next),
            (Self::Created, Self::Active | Self::Failed)
                | (Self::Active, Self::Completed | Self::Timeout | Self::Failed)
        )
    }
}

impl fmt::Display for BranchStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BranchStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "created" => Self::Created,
            "active" => Self::Active,
            "completed" => Self::Completed,
            "timeout" => Self::Timeout,
            "failed" => Self::Failed,
            other => return Err(format!("unknown branch status {other:?}")),
        })
    }
}

/// Why a branch ended other than by a successful return. `VARIANTS`
/// lists every reason (metrics start a series for each at zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::VariantArray)]
pub enum EndReason {
    /// The agent returned with `outcome = "failure"`.
    ReportedFailure,
    /// The deadline passed.
    DeadlineExceeded,
    /// The budget ran out.
    BudgetExhausted,
    /// An ancestor returned (or was force-returned) while this was active.
    ParentReturning,
    /// The session ended, explicitly or for being idle.
    SessionEnded,
    /// An operator ended it through the admin API.
    EndedByOperator,
}

impl EndReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ReportedFailure => "reported_failure",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::BudgetExhausted => "budget_exhausted",
            Self::ParentReturning => "parent_returning",
            Self::SessionEnded => "session_ended",
            Self::EndedByOperator => "ended_by_operator",
        }
    }

    /// The terminal status a branch ending for this reason takes.
    pub const fn status(self) -> BranchStatus {
        match self {
            Self::DeadlineExceeded | Self::BudgetExhausted => BranchStatus::Timeout,
            Self::ReportedFailure
            | Self::ParentReturning
            | Self::SessionEnded
            | Self::EndedByOperator => BranchStatus::Failed,
        }
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EndReason {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "reported_failure" => Self::ReportedFailure,
            "deadline_exceeded" => Self::DeadlineExceeded,
            "budget_exhausted" => Self::BudgetExhausted,
            "parent_returning" => Self::ParentReturning,
            "session_ended" => Self::SessionEnded,
            "ended_by_operator" => Self::EndedByOperator,
            other => return Err(format!("unknown end reason {other:?}")),
        })
    }
}

/// How the agent says its branch went (`branch_return`'s `outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outcome {
    #[default]
    Success,
    /// The message is error context for the parent; the branch ends `failed`.
    Failure,
}

impl Outcome {
    pub fn parse(raw: Option<&str>) -> Result<Self, crate::InvalidInput> {
        match raw {
            None | Some("success") => Ok(Self::Success),
            Some("failure") => Ok(Self::Failure),
            Some(_) => {
                Err(crate::InvalidInput::new("outcome", "must be \"success\" or \"failure\""))
            }
        }
    }

    /// The status and reason of a branch the agent returned.
    pub const fn end(self) -> (BranchStatus, Option<EndReason>) {
        match self {
            Self::Success => (BranchStatus::Completed, None),
            Self::Failure => (BranchStatus::Failed, Some(EndReason::ReportedFailure)),
        }
    }
}

/// A branch as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Branch {
    pub id: BranchId,
    pub tenant: TenantId,
    pub session_id: SessionId,
    /// The subject that owns the session; nobody else may see the branch.
    pub owner: Subject,
    /// `None` for a depth-1 branch, whose parent is the session's root pool.
    pub parent: Option<BranchId>,
    pub depth: u32,
    pub description: String,
    pub prompt: String,
    pub ledger: Ledger,
    pub status: BranchStatus,
    pub reason: Option<EndReason>,
    pub created_at: DateTime<Utc>,
    pub deadline_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    /// When spending first crossed 80% of the budget.
    pub warned_at: Option<DateTime<Utc>>,
    /// The scrubbed return message, once the branch was returned.
    pub result: Option<String>,
    /// Who works inside the branch: the agent, or the gateway's runner.
    pub kind: BranchKind,
    /// How long its finding should be.
    pub return_tier: ReturnTier,
    /// Tokens of the return message handed to the parent, once returned.
    pub returned_tokens: Option<Tokens>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [BranchStatus; 5] = [
        BranchStatus::Created,
        BranchStatus::Active,
        BranchStatus::Completed,
        BranchStatus::Timeout,
        BranchStatus::Failed,
    ];

    #[test]
    fn terminal_states_never_change() {
        for from in ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in ALL {
                assert!(!from.can_become(to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn legal_transitions() {
        let legal: Vec<(BranchStatus, BranchStatus)> = ALL
            .into_iter()
            .flat_map(|a| ALL.into_iter().map(move |b| (a, b)))
            .filter(|(a, b)| a.can_become(*b))
            .collect();
        use BranchStatus::*;
        assert_eq!(
            legal,
            vec![
                (Created, Active),
                (Created, Failed),
                (Active, Completed),
                (Active, Timeout),
                (Active, Failed)
            ]
        );
    }

    #[test]
    fn names_round_trip() {
        for s in ALL {
            assert_eq!(s.as_str().parse::<BranchStatus>().unwrap(), s);
        }
        for &r in <EndReason as strum::VariantArray>::VARIANTS {
            assert_eq!(r.as_str().parse::<EndReason>().unwrap(), r);
            assert!(r.status().is_terminal());
        }
        assert!("nope".parse::<BranchStatus>().is_err());
    }

    #[test]
    fn forced_reasons_map_to_the_contracted_statuses() {
        assert_eq!(EndReason::DeadlineExceeded.status(), BranchStatus::Timeout);
        assert_eq!(EndReason::BudgetExhausted.status(), BranchStatus::Timeout);
        assert_eq!(EndReason::ParentReturning.status(), BranchStatus::Failed);
        assert_eq!(EndReason::SessionEnded.status(), BranchStatus::Failed);
        assert_eq!(EndReason::EndedByOperator.status(), BranchStatus::Failed);
        assert_eq!(
            Outcome::Failure.end(),
            (BranchStatus::Failed, Some(EndReason::ReportedFailure))
        );
        assert_eq!(Outcome::parse(Some("maybe")).unwrap_err().field, "outcome");
    }
}
