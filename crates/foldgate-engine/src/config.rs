//! The engine's settings.

use std::time::Duration;

use foldgate_domain::{BudgetPolicy, Limits, TimeoutPolicy};
use serde::Deserialize;

use crate::Encoding;

/// The folding contract's tunables. Defaults are the documented contract.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FoldingConfig {
    /// Branch budgets and the session root pool.
    pub budget: BudgetPolicy,
    /// Branch timeouts.
    pub timeout: TimeoutPolicy,
    /// Concurrency and creation-rate limits.
    pub limits: Limits,
    /// Deepest allowed branch; the first branch of a session is depth 1.
    pub max_depth: u32,
    /// How long `session_end` spends force-returning branches one by one
    /// before failing the rest in one transaction.
    #[serde(with = "seconds")]
    pub session_end_timeout: Duration,
    /// Sessions with no activity for this long are ended by the supervisor.
    #[serde(with = "seconds")]
    pub session_idle_timeout: Duration,
    /// The tokenizer used to count every token the gateway meters.
    pub encoding: Encoding,
}

impl Default for FoldingConfig {
    fn default() -> Self {
        Self {
            budget: BudgetPolicy::default(),
            timeout: TimeoutPolicy::default(),
            limits: Limits::default(),
            max_depth: 3,
            session_end_timeout: Duration::from_secs(30),
            session_idle_timeout: Duration::from_secs(3600),
            encoding: Encoding::default(),
        }
    }
}

impl FoldingConfig {
    /// Checks the settings, naming the first one that is wrong.
    pub fn validate(&self) -> Result<(), foldgate_domain::ConfigError> {
        self.budget.validate()?;
        self.timeout.validate()?;
        self.limits.validate()?;
        if self.max_depth == 0 {
            return Err("max_depth must be at least 1".into());
        }
        if self.session_end_timeout.is_zero()
            || self.session_end_timeout > Duration::from_secs(3600)
        {
            return Err("session_end_timeout must be between 1 s and 1 h".into());
        }
        if self.session_idle_timeout.is_zero()
            || self.session_idle_timeout > Duration::from_secs(365 * 24 * 3600)
        {
            return Err("session_idle_timeout must be between 1 s and a year".into());
        }
        Ok(())
    }
}

/// How the background reconcilers run.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SupervisorConfig {
    /// Longest sleep between two deadline passes. The reconciler also wakes
    /// at the earliest known deadline, so this bounds the lateness of
    /// deadlines set by other replicas.
    #[serde(with = "millis")]
    pub deadline_poll_interval: Duration,
    /// Interval between two idle-session passes.
    #[serde(with = "millis")]
    pub idle_poll_interval: Duration,
    /// How long a claim keeps other replicas off a branch or session.
    #[serde(with = "millis")]
    pub claim_lease: Duration,
    /// Most branches or sessions claimed per query.
    pub batch_size: u32,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        Self {
            deadline_poll_interval: Duration::from_millis(500),
            idle_poll_interval: Duration::from_secs(30),
            claim_lease: Duration::from_secs(30),
            batch_size: 100,
        }
    }
}

/// Longest interval or lease the supervisor accepts: longer is surely a
/// mistake in units.
const MAX_SUPERVISOR_INTERVAL: Duration = Duration::from_secs(24 * 3600);

impl SupervisorConfig {
    pub fn validate(&self) -> Result<(), foldgate_domain::ConfigError> {
        for (name, value) in [
            ("deadline_poll_interval", self.deadline_poll_interval),
            ("idle_poll_interval", self.idle_poll_interval),
            ("claim_lease", self.claim_lease),
        ] {
            if value.is_zero() || value > MAX_SUPERVISOR_INTERVAL {
                return Err(format!("supervisor {name} must be between 1 ms and 24 h").into());
            }
        }
        if self.batch_size == 0 {
            return Err("supervisor batch_size must be at least 1".into());
        }
        Ok(())
    }
}

mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_contract_and_valid() {
        let c = FoldingConfig::default();
        assert_eq!(c.max_depth, 3);
        assert_eq!(c.budget.default_budget, 8_192);
        assert_eq!(c.limits.max_active_per_tenant, 100);
        assert_eq!(c.session_end_timeout, Duration::from_secs(30));
        assert!(c.validate().is_ok());
        assert!(SupervisorConfig::default().validate().is_ok());
        let bad = FoldingConfig { max_depth: 0, ..FoldingConfig::default() };
        assert!(bad.validate().is_err());
    }
}
