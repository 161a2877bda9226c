//! The engine's settings.

use std::time::Duration;

use foldgate_domain::{BudgetPolicy, Limits, TimeoutPolicy, ToolListing, duration};
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
    /// before failing the rest in one transaction. A bare number counts
    /// seconds.
    #[serde(deserialize_with = "duration::seconds")]
    pub session_end_timeout: Duration,
    /// Sessions with no activity for this long are ended by the supervisor.
    /// A bare number counts seconds.
    #[serde(deserialize_with = "duration::seconds")]
    pub session_idle_timeout: Duration,
    /// The tokenizer used to count every token the gateway meters.
    pub encoding: Encoding,
    /// How `tools/list` shows upstream tools to a tenant without its own
    /// setting: `full` (every tool it may call) or `search` (`tool_search`
    /// and the tools its open sessions have used).
    pub tool_listing: ToolListing,
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
            tool_listing: ToolListing::default(),
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
        duration::check_range(
            "session_end_timeout",
            self.session_end_timeout,
            Duration::from_secs(1),
            Duration::from_secs(3600),
        )?;
        duration::check_range(
            "session_idle_timeout",
            self.session_idle_timeout,
            Duration::from_secs(1),
            Duration::from_secs(365 * 24 * 3600),
        )?;
        Ok(())
    }
}

/// How the background reconcilers run.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SupervisorConfig {
    /// Longest sleep between two deadline passes. The reconciler also wakes
    /// at the earliest known deadline, so this bounds the lateness of
    /// deadlines set by other replicas. A bare number counts milliseconds.
    #[serde(deserialize_with = "duration::millis")]
    pub deadline_poll_interval: Duration,
    /// Interval between two idle-session passes. A bare number counts
    /// milliseconds.
    #[serde(deserialize_with = "duration::millis")]
    pub idle_poll_interval: Duration,
    /// How long a claim keeps other replicas off a branch or session. A
    /// bare number counts milliseconds.
    #[serde(deserialize_with = "duration::millis")]
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
            duration::check_range(
                &format!("supervisor {name}"),
                value,
                Duration::from_millis(1),
                MAX_SUPERVISOR_INTERVAL,
            )?;
        }
        if self.batch_size == 0 {
            return Err("supervisor batch_size must be at least 1".into());
        }
        Ok(())
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

    #[test]
    fn ranges_are_reported_with_units() {
        let idle = FoldingConfig { session_idle_timeout: Duration::ZERO, ..Default::default() };
        assert_eq!(
            idle.validate().unwrap_err().to_string(),
            "session_idle_timeout must be from 1s to 365d, got 0s"
        );
        let lease =
            SupervisorConfig { claim_lease: Duration::from_secs(2 * 86_400), ..Default::default() };
        assert_eq!(
            lease.validate().unwrap_err().to_string(),
            "supervisor claim_lease must be from 1ms to 1d, got 2d"
        );
    }
}
