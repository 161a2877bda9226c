//! A folding session: the root of a tree of branches, and its token pool.

use std::{fmt, str::FromStr};

use chrono::{DateTime, Utc};

use crate::{Ledger, SessionId, Subject, TenantId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionStatus {
    /// Has had activity since it was (re)opened.
    Open,
    /// Ended by `session_end` or for being idle; every branch was
    /// force-returned. A later `branch_create` with the same id reopens it
    /// with a fresh root pool.
    Ended,
}

impl SessionStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Ended => "ended",
        }
    }
}

impl fmt::Display for SessionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SessionStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "open" => Ok(Self::Open),
            "ended" => Ok(Self::Ended),
            other => Err(format!("unknown session status {other:?}")),
        }
    }
}

/// A session as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub tenant: TenantId,
    pub id: SessionId,
    /// The subject whose first `branch_create` opened it.
    pub owner: Subject,
    pub status: SessionStatus,
    /// The root pool that depth-1 branches draw from.
    pub ledger: Ledger,
    pub created_at: DateTime<Utc>,
    pub last_activity_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
}
