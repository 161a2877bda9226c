//! What an operator may set for one tenant over the deployment's
//! configuration: its folding limits, its budgets, which models and
//! upstreams it may use, and how many tokens it may spend a day and a
//! month.

use serde::{Deserialize, Serialize};

use crate::{BudgetPolicy, InvalidInput, Limits, Tokens};

/// One tenant's overrides; every field left out keeps the deployment's
/// setting.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct TenantSettings {
    /// Most branches active at once in one of its sessions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_active_per_session: Option<u32>,
    /// Most branches active at once across its sessions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_active_per_tenant: Option<u32>,
    /// Most branches one of its sessions may create in a minute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub creations_per_minute: Option<u32>,
    /// Deepest branch (the first branch of a session is depth 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
    /// Budget of a branch whose create names none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_budget: Option<Tokens>,
    /// Larger requests are capped to this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_budget: Option<Tokens>,
    /// The root pool of each of its sessions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_budget: Option<Tokens>,
    /// The `[[models]]` entries it may run branches on (by name), among
    /// those configured for it; absent: all of those.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// The upstreams whose tools it sees and calls (by name), among those
    /// configured for it; absent: all of those.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstreams: Option<Vec<String>>,
    /// Tokens it may spend in a day (UTC): upstream calls' arguments and
    /// results, inside branches and outside them, and what model providers
    /// billed for its gateway-run branches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<Tokens>,
    /// The same for a calendar month (UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_month: Option<Tokens>,
    /// How its agents' `tools/list` shows upstream tools: every one
    /// (`full`), or only those its sessions have used, beside `tool_search`
    /// (`search`). Absent: the deployment's `api.tool_listing`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_listing: Option<ToolListing>,
}

/// How `tools/list` shows the upstream tools a caller may call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ToolListing {
    /// Every upstream tool the caller may call.
    #[default]
    Full,
    /// `tool_search` instead, and the upstream tools the caller's open
    /// sessions have called. Any permitted tool can still be called by name.
    Search,
}

impl ToolListing {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Search => "search",
        }
    }
}

/// The most names an allow-list may hold.
const MAX_NAMES: usize = 256;

impl TenantSettings {
    /// Checks the overrides on their own and against `base`, the
    /// deployment's budget policy; the error names the field.
    pub fn validate(&self, base: &BudgetPolicy) -> Result<(), InvalidInput> {
        let positive = [
            ("max_active_per_session", self.max_active_per_session.map(u64::from)),
            ("max_active_per_tenant", self.max_active_per_tenant.map(u64::from)),
            ("creations_per_minute", self.creations_per_minute.map(u64::from)),
            ("max_depth", self.max_depth.map(u64::from)),
            ("tokens_per_day", self.tokens_per_day),
            ("tokens_per_month", self.tokens_per_month),
        ];
        for (field, value) in positive {
            if value == Some(0) {
                return Err(InvalidInput::new(field, "must be at least 1"));
            }
        }
        self.budget(base).validate().map_err(|e| InvalidInput::new("budget", e.to_string()))?;
        for (field, names) in [("models", &self.models), ("upstreams", &self.upstreams)] {
            let Some(names) = names else { continue };
            if names.len() > MAX_NAMES {
                return Err(InvalidInput::new(field, format!("lists at most {MAX_NAMES} names")));
            }
            if names.iter().any(|n| n.is_empty() || n.len() > 128) {
                return Err(InvalidInput::new(field, "names are 1 to 128 characters"));
            }
        }
        Ok(())
    }

    /// The deployment's budget policy with these overrides.
    pub fn budget(&self, base: &BudgetPolicy) -> BudgetPolicy {
        BudgetPolicy {
            default_budget: self.default_budget.unwrap_or(base.default_budget),
            max_budget: self.max_budget.unwrap_or(base.max_budget),
            min_branch_budget: base.min_branch_budget,
            session_budget: self.session_budget.unwrap_or(base.session_budget),
        }
    }

    /// The deployment's limits with these overrides (the deployment-wide
    /// cap stays the deployment's).
    pub fn limits(&self, base: &Limits) -> Limits {
        Limits {
            max_active_per_session: self
                .max_active_per_session
                .unwrap_or(base.max_active_per_session),
            max_active_per_tenant: self.max_active_per_tenant.unwrap_or(base.max_active_per_tenant),
            max_active_total: base.max_active_total,
            creations_per_minute: self.creations_per_minute.unwrap_or(base.creations_per_minute),
        }
    }

    /// Whether `name` is in `list`, or there is no list.
    pub fn allows(list: Option<&[String]>, name: &str) -> bool {
        list.is_none_or(|list| list.iter().any(|n| n == name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_replace_only_what_they_name() {
        let base = BudgetPolicy::default();
        let settings = TenantSettings { max_budget: Some(64_000), ..TenantSettings::default() };
        let budget = settings.budget(&base);
        assert_eq!(budget.max_budget, 64_000);
        assert_eq!(budget.default_budget, base.default_budget);
        let limits = TenantSettings { creations_per_minute: Some(50), ..settings }
            .limits(&Limits::default());
        assert_eq!(limits.creations_per_minute, 50);
        assert_eq!(limits.max_active_per_tenant, Limits::default().max_active_per_tenant);
    }

    #[test]
    fn bad_overrides_name_their_field() {
        let base = BudgetPolicy::default();
        let cases = [
            (TenantSettings { max_depth: Some(0), ..Default::default() }, "max_depth"),
            (TenantSettings { tokens_per_day: Some(0), ..Default::default() }, "tokens_per_day"),
            (TenantSettings { default_budget: Some(1_000_000), ..Default::default() }, "budget"),
            (
                TenantSettings { upstreams: Some(vec![String::new()]), ..Default::default() },
                "upstreams",
            ),
        ];
        for (settings, field) in cases {
            assert_eq!(settings.validate(&base).unwrap_err().field, field, "{settings:?}");
        }
        assert!(TenantSettings::default().validate(&base).is_ok());
        let json = serde_json::json!({"max_budget": 64000, "colour": "blue"});
        assert!(serde_json::from_value::<TenantSettings>(json).is_err(), "unknown fields refused");
    }

    #[test]
    fn allow_lists() {
        let list = vec!["files".to_owned()];
        assert!(TenantSettings::allows(Some(&list), "files"));
        assert!(!TenantSettings::allows(Some(&list), "git"));
        assert!(TenantSettings::allows(None, "git"));
    }
}
