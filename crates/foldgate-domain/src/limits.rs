//! Limits on how many branches may run and how fast they may be created.
//!
//! The store enforces them atomically with the insert of a branch, so they
//! hold under concurrency and across replicas.

use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Most branches active at once in one session.
    pub max_active_per_session: u32,
    /// Most branches active at once across a tenant's sessions.
    pub max_active_per_tenant: u32,
    /// Most branches active at once in the whole deployment (all replicas).
    pub max_active_total: u32,
    /// Most branches a session may create in any sliding 60-second window.
    pub creations_per_minute: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_active_per_session: 10,
            max_active_per_tenant: 100,
            max_active_total: 10_000,
            creations_per_minute: 5,
        }
    }
}

impl Limits {
    /// Checks that the limits themselves make sense (operator input).
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        if self.max_active_per_session == 0
            || self.max_active_per_tenant == 0
            || self.max_active_total == 0
            || self.creations_per_minute == 0
        {
            return Err("branch limits must be at least 1".into());
        }
        Ok(())
    }
}

/// Which limit refused a create. `VARIANTS` lists every limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::VariantArray)]
pub enum LimitKind {
    SessionActive,
    TenantActive,
    DeploymentActive,
    SessionCreationRate,
}

impl LimitKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::SessionActive => "session_active_branches",
            Self::TenantActive => "tenant_active_branches",
            Self::DeploymentActive => "deployment_active_branches",
            Self::SessionCreationRate => "session_creation_rate",
        }
    }
}
