//! Who works inside a branch, and how long its finding may be.

use std::{fmt, str::FromStr};

use crate::{InvalidInput, Tokens};

/// Who works inside a branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BranchKind {
    /// The agent works inside it (`branch_create` / `branch_return`); the
    /// gateway keeps the books and meters what passes through it.
    #[default]
    Agent,
    /// The gateway runs it on an operator's model (`branch_run`): nobody
    /// else returns it, nests under it or charges calls to it.
    Gateway,
}

impl BranchKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Gateway => "gateway",
        }
    }
}

impl fmt::Display for BranchKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BranchKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "agent" => Ok(Self::Agent),
            "gateway" => Ok(Self::Gateway),
            other => Err(format!("unknown branch kind {other:?}")),
        }
    }
}

/// How long a branch's finding should be: the smallest tier that serves
/// (the context-budget policy). What a return adds to its parent's context
/// is what folding costs the parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReturnTier {
    /// At most 50 tokens: a yes/no, a name, a number.
    Micro,
    /// At most 300 tokens: the finding of a sub-task.
    #[default]
    Phase,
    /// At most 800 tokens: the finding of a large phase of work.
    Macro,
}

impl ReturnTier {
    pub const ALL: [Self; 3] = [Self::Micro, Self::Phase, Self::Macro];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Micro => "micro",
            Self::Phase => "phase",
            Self::Macro => "macro",
        }
    }

    /// The most tokens a finding of this tier has.
    pub const fn max_tokens(self) -> Tokens {
        match self {
            Self::Micro => 50,
            Self::Phase => 300,
            Self::Macro => 800,
        }
    }

    /// `return_tier` as a client sends it; absent means `phase`.
    pub fn parse(raw: Option<&str>) -> Result<Self, InvalidInput> {
        match raw {
            None => Ok(Self::default()),
            Some(s) => s.parse().map_err(|_| {
                InvalidInput::new("return_tier", "must be \"micro\", \"phase\" or \"macro\"")
            }),
        }
    }
}

impl fmt::Display for ReturnTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ReturnTier {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown return tier {s:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_parse_and_bound() {
        assert_eq!(ReturnTier::parse(None).unwrap(), ReturnTier::Phase, "the default");
        for tier in ReturnTier::ALL {
            assert_eq!(ReturnTier::parse(Some(tier.as_str())).unwrap(), tier);
        }
        assert_eq!(
            ReturnTier::ALL.map(ReturnTier::max_tokens),
            [50, 300, 800],
            "the policy's bounds"
        );
        let err = ReturnTier::parse(Some("huge")).unwrap_err();
        assert_eq!(err.field, "return_tier");
        for kind in [BranchKind::Agent, BranchKind::Gateway] {
            assert_eq!(kind.as_str().parse::<BranchKind>().unwrap(), kind);
        }
        assert!("robot".parse::<BranchKind>().is_err());
    }
}
