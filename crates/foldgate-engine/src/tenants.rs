//! Each tenant's rules as this replica applies them, and the usage it
//! counts towards the tenants' quotas and reports.
//!
//! Operators set a tenant's overrides through the admin API; they live in
//! the database. [`TenantRules`] keeps them in memory, with what each
//! tenant with overrides spent today and this month, and the background
//! task [`TenantSync`] refreshes both every second or so after writing the
//! usage this replica counted since its last pass ([`UsageBook`]). A change
//! thus applies on every replica within seconds, without a restart, and a
//! quota holds across replicas: a tenant may overshoot it by what it spends
//! in the seconds before every replica has seen the total (and by the
//! calls it had already started).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::Duration,
};

use chrono::{DateTime, Datelike, NaiveDate, Utc};
use foldgate_domain::{BudgetPolicy, Limits, TenantId, TenantSettings, Tokens, ToolListing};
use foldgate_store::{UsageKind, UsageLine};

use crate::{FoldError, FoldingConfig, FoldingService};

/// How often [`FoldingService::sync_tenants`] should run.
pub const TENANT_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// One tenant's rules: the deployment's configuration with its overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    pub settings: TenantSettings,
    pub budget: BudgetPolicy,
    pub limits: Limits,
    pub max_depth: u32,
    pub tool_listing: ToolListing,
}

impl Rules {
    fn new(settings: TenantSettings, base: &FoldingConfig) -> Self {
        Self {
            budget: settings.budget(&base.budget),
            limits: settings.limits(&base.limits),
            max_depth: settings.max_depth.unwrap_or(base.max_depth),
            tool_listing: settings.tool_listing.unwrap_or(base.tool_listing),
            settings,
        }
    }

    /// Whether the tenant may call the tools of upstream `name`.
    pub fn allows_upstream(&self, name: &str) -> bool {
        TenantSettings::allows(self.settings.upstreams.as_deref(), name)
    }

    /// Whether the tenant may run branches on model `name`.
    pub fn allows_model(&self, name: &str) -> bool {
        TenantSettings::allows(self.settings.models.as_deref(), name)
    }
}

/// What one key of the usage book adds up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    calls: u64,
    tokens_in: Tokens,
    tokens_out: Tokens,
}

type UsageKey = (TenantId, NaiveDate, UsageKind, String);

/// Usage counted by this replica and not yet written.
#[derive(Debug, Default)]
pub struct UsageBook {
    pending: Mutex<HashMap<UsageKey, Counts>>,
}

impl UsageBook {
    /// Counts `calls` of `kind` (an upstream's or a model's, by `name`).
    pub fn add(
        &self,
        tenant: &TenantId,
        at: DateTime<Utc>,
        kind: UsageKind,
        name: &str,
        calls: u64,
        tokens: (Tokens, Tokens),
    ) {
        let key = (tenant.clone(), at.date_naive(), kind, name.to_owned());
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let counts = pending.entry(key).or_default();
        counts.calls = counts.calls.saturating_add(calls);
        counts.tokens_in = counts.tokens_in.saturating_add(tokens.0);
        counts.tokens_out = counts.tokens_out.saturating_add(tokens.1);
    }

    /// Takes everything counted so far.
    fn drain(&self) -> Vec<UsageLine> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending
            .drain()
            .map(|((tenant, day, kind, name), c)| UsageLine {
                tenant,
                day,
                kind,
                name,
                calls: c.calls,
                tokens_in: c.tokens_in,
                tokens_out: c.tokens_out,
            })
            .collect()
    }

    /// Puts back lines that could not be written.
    fn restore(&self, lines: Vec<UsageLine>) {
        for line in lines {
            self.add_line(&line);
        }
    }

    fn add_line(&self, line: &UsageLine) {
        let key = (line.tenant.clone(), line.day, line.kind, line.name.clone());
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let counts = pending.entry(key).or_default();
        counts.calls = counts.calls.saturating_add(line.calls);
        counts.tokens_in = counts.tokens_in.saturating_add(line.tokens_in);
        counts.tokens_out = counts.tokens_out.saturating_add(line.tokens_out);
    }

    /// What `tenant` spent towards its quotas on `today` and since
    /// `month_start`, as counted here and not written yet.
    fn unwritten_spend(
        &self,
        tenant: &TenantId,
        today: NaiveDate,
        month_start: NaiveDate,
    ) -> (Tokens, Tokens) {
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let mut spend = (0, 0);
        for ((t, day, kind, _), c) in pending.iter() {
            if t != tenant || *kind == UsageKind::Return || *day < month_start {
                continue;
            }
            let tokens = c.tokens_in.saturating_add(c.tokens_out);
            if *day == today {
                spend.0 += tokens;
            }
            spend.1 += tokens;
        }
        spend
    }
}

/// What the last refresh read: every tenant's overrides and what those
/// tenants spent.
#[derive(Debug, Default)]
struct Snapshot {
    rules: HashMap<TenantId, Arc<Rules>>,
    /// Today's and this month's spending, as written by every replica.
    spend: HashMap<TenantId, (Tokens, Tokens)>,
    /// The day `spend` counts as today.
    day: Option<NaiveDate>,
}

/// The tenants' rules and spending, as this replica last read them.
#[derive(Debug)]
pub struct TenantRules {
    base: Arc<Rules>,
    config: FoldingConfig,
    snapshot: RwLock<Snapshot>,
    usage: UsageBook,
}

impl TenantRules {
    pub fn new(config: &FoldingConfig) -> Self {
        Self {
            base: Arc::new(Rules::new(TenantSettings::default(), config)),
            config: config.clone(),
            snapshot: RwLock::new(Snapshot::default()),
            usage: UsageBook::default(),
        }
    }

    /// The tenant's rules: the deployment's, with its overrides if it has
    /// any.
    pub fn of(&self, tenant: &TenantId) -> Arc<Rules> {
        let snapshot = self.snapshot.read().unwrap_or_else(PoisonError::into_inner);
        snapshot.rules.get(tenant).map_or_else(|| Arc::clone(&self.base), Arc::clone)
    }

    /// The rules `settings` would give a tenant.
    pub fn rules_for(&self, settings: TenantSettings) -> Rules {
        Rules::new(settings, &self.config)
    }

    /// The deployment's budget policy, which overrides must agree with.
    pub fn base_budget(&self) -> &BudgetPolicy {
        &self.config.budget
    }

    /// Where this replica counts usage.
    pub fn usage(&self) -> &UsageBook {
        &self.usage
    }

    /// Refuses when the tenant has spent its quota for the day or the
    /// month, telling when the period ends.
    pub fn check_quota(&self, tenant: &TenantId, now: DateTime<Utc>) -> Result<(), FoldError> {
        let rules = self.of(tenant);
        if rules.settings.tokens_per_day.is_none() && rules.settings.tokens_per_month.is_none() {
            return Ok(());
        }
        let today = now.date_naive();
        let month_start = today.with_day(1).unwrap_or(today);
        let written = {
            let snapshot = self.snapshot.read().unwrap_or_else(PoisonError::into_inner);
            match snapshot.spend.get(tenant) {
                // Read on another day: this month's still counts, unless the
                // month changed too.
                Some(&(day, month)) if snapshot.day == Some(today) => (day, month),
                Some(&(_, month)) if snapshot.day.is_some_and(|d| d >= month_start) => (0, month),
                _ => (0, 0),
            }
        };
        let unwritten = self.usage.unwritten_spend(tenant, today, month_start);
        let spent = (written.0.saturating_add(unwritten.0), written.1.saturating_add(unwritten.1));
        if rules.settings.tokens_per_day.is_some_and(|quota| spent.0 >= quota) {
            let tomorrow = today.succ_opt().unwrap_or(today);
            return Err(quota_exceeded("day", tomorrow, now));
        }
        if rules.settings.tokens_per_month.is_some_and(|quota| spent.1 >= quota) {
            let next_month =
                month_start.checked_add_months(chrono::Months::new(1)).unwrap_or(month_start);
            return Err(quota_exceeded("month", next_month, now));
        }
        Ok(())
    }

    /// Replaces what the last refresh read.
    fn replace(
        &self,
        settings: Vec<(TenantId, TenantSettings)>,
        spend: HashMap<TenantId, (Tokens, Tokens)>,
        day: NaiveDate,
    ) {
        let rules = settings
            .into_iter()
            .map(|(tenant, settings)| (tenant, Arc::new(Rules::new(settings, &self.config))))
            .collect();
        let mut snapshot = self.snapshot.write().unwrap_or_else(PoisonError::into_inner);
        *snapshot = Snapshot { rules, spend, day: Some(day) };
    }
}

fn quota_exceeded(period: &'static str, next: NaiveDate, now: DateTime<Utc>) -> FoldError {
    let starts = next.and_hms_opt(0, 0, 0).map_or(now, |t| t.and_utc());
    let retry_after = (starts - now).to_std().unwrap_or_default().max(Duration::from_secs(1));
    FoldError::QuotaExceeded { period, retry_after }
}

impl FoldingService {
    /// Writes the usage this replica counted, then reads every tenant's
    /// overrides and spending: how rules and quotas reach every replica.
    /// Returns the usage lines written and the tenants with overrides.
    pub async fn sync_tenants(&self) -> Result<(usize, usize), FoldError> {
        let store = self.store();
        let rules = self.tenant_rules();
        let lines = rules.usage.drain();
        let written = lines.len();
        if let Err(e) = store.add_usage(&lines).await {
            rules.usage.restore(lines);
            return Err(e.into());
        }
        let today = self.clock().now().date_naive();
        let month_start = today.with_day(1).unwrap_or(today);
        let settings = store.all_tenant_settings().await?;
        let spend = store
            .spending(today, month_start)
            .await?
            .into_iter()
            .map(|s| (s.tenant, (s.today, s.this_month)))
            .collect();
        let tenants = settings.len();
        rules.replace(settings, spend, today);
        Ok((written, tenants))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    fn acme() -> TenantId {
        TenantId::parse("acme").unwrap()
    }

    fn with_quota(day: Option<Tokens>, month: Option<Tokens>) -> TenantRules {
        let rules = TenantRules::new(&FoldingConfig::default());
        let settings =
            TenantSettings { tokens_per_day: day, tokens_per_month: month, ..Default::default() };
        rules.replace(
            vec![(acme(), settings)],
            HashMap::new(),
            at("2026-11-25T00:00:00Z").date_naive(),
        );
        rules
    }

    #[test]
    fn a_quota_counts_what_was_written_and_what_was_not() {
        let now = at("2026-11-25T22:00:00Z");
        let rules = with_quota(Some(100), None);
        assert!(rules.check_quota(&acme(), now).is_ok(), "nothing spent");
        rules.usage().add(&acme(), now, UsageKind::OutsideCall, "files", 1, (40, 50));
        assert!(rules.check_quota(&acme(), now).is_ok(), "90 of 100");
        // Returns are not spending.
        rules.usage().add(&acme(), now, UsageKind::Return, "", 1, (1000, 10));
        assert!(rules.check_quota(&acme(), now).is_ok(), "a return spends nothing");
        rules.usage().add(&acme(), now, UsageKind::Model, "gpt", 1, (5, 5));
        match rules.check_quota(&acme(), now) {
            Err(FoldError::QuotaExceeded { period: "day", retry_after }) => {
                assert_eq!(retry_after, Duration::from_secs(2 * 3600), "until midnight UTC");
            }
            other => panic!("expected the daily quota: {other:?}"),
        }
        // Written by another replica: the snapshot counts it.
        let rules = with_quota(Some(100), None);
        let spend = HashMap::from([(acme(), (100, 100))]);
        rules.replace(rules_settings(&rules), spend, now.date_naive());
        assert!(rules.check_quota(&acme(), now).is_err(), "written spending counts");
        // The next day, yesterday's spending no longer counts against the day.
        assert!(rules.check_quota(&acme(), at("2026-11-26T00:00:01Z")).is_ok());
        let other = TenantId::parse("globex").unwrap();
        assert!(rules.check_quota(&other, now).is_ok(), "a tenant without a quota");
    }

    fn rules_settings(rules: &TenantRules) -> Vec<(TenantId, TenantSettings)> {
        vec![(acme(), rules.of(&acme()).settings.clone())]
    }

    #[test]
    fn the_monthly_quota_lasts_until_the_month_ends() {
        let now = at("2026-11-25T12:00:00Z");
        let rules = with_quota(None, Some(1000));
        let spend = HashMap::from([(acme(), (0, 1000))]);
        rules.replace(rules_settings(&rules), spend, now.date_naive());
        match rules.check_quota(&acme(), now) {
            Err(FoldError::QuotaExceeded { period: "month", retry_after }) => {
                assert_eq!(retry_after, Duration::from_secs((5 * 24 + 12) * 3600));
            }
            other => panic!("expected the monthly quota: {other:?}"),
        }
        assert!(rules.check_quota(&acme(), at("2026-12-01T00:00:00Z")).is_ok(), "a new month");
    }

    #[test]
    fn overrides_apply_to_their_tenant_alone() {
        let rules = TenantRules::new(&FoldingConfig::default());
        let settings = TenantSettings {
            max_depth: Some(5),
            upstreams: Some(vec!["files".into()]),
            ..Default::default()
        };
        rules.replace(
            vec![(acme(), settings)],
            HashMap::new(),
            at("2026-11-25T00:00:00Z").date_naive(),
        );
        let mine = rules.of(&acme());
        assert_eq!(mine.max_depth, 5);
        assert!(mine.allows_upstream("files") && !mine.allows_upstream("git"));
        let theirs = rules.of(&TenantId::parse("globex").unwrap());
        assert_eq!(theirs.max_depth, FoldingConfig::default().max_depth);
        assert!(theirs.allows_upstream("git"));
    }
}
