//! The reasoning memory: what branches learned, kept per tenant and offered
//! to later branches.
//!
//! An item is a strategy (what worked) or a pitfall (what failed, and why),
//! with its provenance: distilled by the gateway from a branch it saw end, or
//! recorded by an agent. Its confidence starts from a prior (the distiller's
//! own, or a lower one for recorded items) and moves with feedback, as a mean
//! weighted by [`PRIOR_WEIGHT`]: an agent's item needs successful uses before
//! it clears the injection threshold, and an item that keeps failing falls
//! below it.

use std::{fmt, str::FromStr};

use chrono::{DateTime, Utc};

use crate::{
    BranchId, InvalidInput, SessionId, Subject, TenantId, ids::uuid_id, text::bounded_text,
};

/// Strategy or pitfall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// An approach that worked.
    Strategy,
    /// An approach that failed, and why: what not to do again.
    Pitfall,
}

impl MemoryKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Strategy => "strategy",
            Self::Pitfall => "pitfall",
        }
    }
}

impl FromStr for MemoryKind {
    type Err = InvalidInput;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        match raw {
            "strategy" => Ok(Self::Strategy),
            "pitfall" => Ok(Self::Pitfall),
            _ => Err(InvalidInput::new("kind", "must be `strategy` or `pitfall`")),
        }
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who wrote an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemorySource {
    /// The gateway, from a branch it saw end.
    Distilled,
    /// An agent, through `memory_record` or `extract_memory`.
    Recorded,
}

impl MemorySource {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Distilled => "distilled",
            Self::Recorded => "recorded",
        }
    }
}

impl FromStr for MemorySource {
    type Err = InvalidInput;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        match raw {
            "distilled" => Ok(Self::Distilled),
            "recorded" => Ok(Self::Recorded),
            _ => Err(InvalidInput::new("source", "must be `distilled` or `recorded`")),
        }
    }
}

uuid_id!(
    /// A memory item's id, `mem_<uuid>`.
    MemoryId,
    "mem_",
    "id"
);

/// A confidence between 0 and 1.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Confidence(f64);

impl Confidence {
    /// Checks that `value` is a number from 0 to 1.
    pub fn new(value: f64) -> Result<Self, InvalidInput> {
        if (0.0..=1.0).contains(&value) {
            Ok(Self(value))
        } else {
            Err(InvalidInput::new("confidence", "must be a number from 0 to 1"))
        }
    }

    /// `value` brought into 0..=1 (`NaN` is 0).
    pub fn clamped(value: f64) -> Self {
        if value.is_nan() { Self(0.0) } else { Self(value.clamp(0.0, 1.0)) }
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

/// How many uses the prior counts for when feedback moves a confidence.
pub const PRIOR_WEIGHT: f64 = 4.0;

/// An item's confidence after feedback: its prior counted as
/// [`PRIOR_WEIGHT`] uses, then each helpful use as 1 and each unhelpful
/// one as 0. (The store computes the same in SQL; a test holds them
/// together.)
pub fn confidence_after(prior: Confidence, helpful: u64, unhelpful: u64) -> Confidence {
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let (helpful, unhelpful) = (helpful as f64, unhelpful as f64);
    Confidence::clamped(
        (prior.get() * PRIOR_WEIGHT + helpful) / (PRIOR_WEIGHT + helpful + unhelpful),
    )
}

bounded_text!(
    /// An item's title: required, at most 120 characters.
    MemoryTitle,
    "title",
    120,
    true
);

bounded_text!(
    /// An item's description, in a sentence: at most 300 characters.
    MemoryDescription,
    "description",
    300,
    false
);

bounded_text!(
    /// What an item teaches: required, at most 2,000 characters.
    MemoryContent,
    "content",
    2_000,
    true
);

/// Where an item came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Provenance {
    pub tenant: TenantId,
    /// Who recorded it, or whose branch it was distilled from.
    pub subject: Subject,
    pub session: Option<SessionId>,
    pub branch: Option<BranchId>,
    pub source: MemorySource,
}

/// An item of a tenant's memory bank, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryItem {
    pub id: MemoryId,
    pub kind: MemoryKind,
    pub title: String,
    pub description: String,
    pub content: String,
    /// Where feedback moves from.
    pub prior: Confidence,
    pub confidence: Confidence,
    pub provenance: Provenance,
    /// The injection-screen rules the item's text set off (empty: none).
    /// Flagged items are kept for review but not injected by default.
    pub flagged: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    /// How often it was injected into a branch.
    pub uses: u64,
    /// Feedback: uses that helped, and uses that did not.
    pub helpful: u64,
    pub unhelpful: u64,
}

impl MemoryItem {
    /// Whether it may be injected at the given threshold.
    pub fn injectable(&self, min_confidence: f64) -> bool {
        self.flagged.is_empty() && self.confidence.get() >= min_confidence
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_refuse_other_forms() {
        let id = MemoryId::generate();
        assert_eq!(MemoryId::parse(&id.to_string()).unwrap(), id);
        for bad in ["", "mem_", "br_0190c2f1-7f3a-7c4e-9a55-0a1b2c3d4e5f", "mem_not-a-uuid"] {
            assert_eq!(MemoryId::parse(bad).unwrap_err().field, "id", "{bad}");
        }
        let braced = format!("mem_{{{}}}", id.as_uuid());
        assert!(MemoryId::parse(&braced).is_err());
    }

    #[test]
    fn kinds_and_sources_parse_their_names_only() {
        for kind in [MemoryKind::Strategy, MemoryKind::Pitfall] {
            assert_eq!(kind.as_str().parse::<MemoryKind>().unwrap(), kind);
        }
        assert!("Strategy".parse::<MemoryKind>().is_err());
        for source in [MemorySource::Distilled, MemorySource::Recorded] {
            assert_eq!(source.as_str().parse::<MemorySource>().unwrap(), source);
        }
    }

    #[test]
    fn confidence_is_checked_and_clamped() {
        assert!(Confidence::new(0.0).is_ok() && Confidence::new(1.0).is_ok());
        assert!(Confidence::new(1.01).is_err() && Confidence::new(-0.1).is_err());
        assert!(Confidence::new(f64::NAN).is_err());
        assert_eq!(Confidence::clamped(f64::NAN).get(), 0.0);
        assert_eq!(Confidence::clamped(7.0).get(), 1.0);
    }

    #[test]
    fn feedback_moves_confidence_from_the_prior() {
        let recorded = Confidence::new(0.5).unwrap();
        assert_eq!(confidence_after(recorded, 0, 0), recorded);
        // An agent's item clears 0.7 after three helpful uses, not before.
        assert!(confidence_after(recorded, 2, 0).get() < 0.7);
        assert!(confidence_after(recorded, 3, 0).get() >= 0.7);
        // A distilled item that keeps failing falls below it.
        let distilled = Confidence::new(0.8).unwrap();
        assert!(confidence_after(distilled, 0, 1).get() < 0.7);
        assert!(confidence_after(distilled, 2, 1).get() >= 0.7);
        assert!(confidence_after(distilled, 2, 3).get() < 0.7);
        assert!(confidence_after(distilled, 1_000_000, 0).get() <= 1.0);
    }
}
