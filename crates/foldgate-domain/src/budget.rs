//! Token budgets.
//!
//! Every branch draws its budget from its parent's pool (the session's root
//! pool for depth-1 branches) when it is created, and gives back what it did
//! not spend when it ends. A [`Ledger`] is that pool: what was granted, what
//! was spent, and what is lent out to children that are still running. There
//! is no per-token propagation to ancestors: a child's spending reaches its
//! parent once, when the child ends.

use serde::Deserialize;

use crate::InvalidInput;

/// A number of tokens as counted by the gateway's tokenizer.
pub type Tokens = u64;

/// Operator-tunable budget rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetPolicy {
    /// Budget of a branch whose create names none.
    pub default_budget: Tokens,
    /// Larger requests are silently capped to this (visible in
    /// `budget_allocated`).
    pub max_budget: Tokens,
    /// A branch is not worth creating with less; a parent that cannot give
    /// this much refuses with `budget_exhausted`.
    pub min_branch_budget: Tokens,
    /// The root pool of a session, shared by its depth-1 branches.
    pub session_budget: Tokens,
}

impl Default for BudgetPolicy {
    fn default() -> Self {
        Self {
            default_budget: 8_192,
            max_budget: 32_768,
            min_branch_budget: 256,
            session_budget: 1_000_000,
        }
    }
}

impl BudgetPolicy {
    /// Checks that the policy itself makes sense (operator input).
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        if self.min_branch_budget == 0 {
            return Err("min_branch_budget must be at least 1".into());
        }
        if !(self.min_branch_budget <= self.default_budget
            && self.default_budget <= self.max_budget)
        {
            return Err(format!(
                "budgets must satisfy min_branch_budget ({}) <= default_budget ({}) <= max_budget ({})",
                self.min_branch_budget, self.default_budget, self.max_budget
            ).into());
        }
        if self.session_budget < self.min_branch_budget {
            return Err(format!(
                "session_budget ({}) is below min_branch_budget ({})",
                self.session_budget, self.min_branch_budget
            )
            .into());
        }
        // Budgets are stored as signed 64-bit integers.
        if i64::try_from(self.session_budget.max(self.max_budget)).is_err() {
            return Err("budgets must fit in a signed 64-bit integer".into());
        }
        Ok(())
    }
}

/// A requested branch budget, already defaulted and capped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetRequest(Tokens);

impl BudgetRequest {
    /// `None` means the policy default; above `max_budget` is capped; below
    /// `min_branch_budget` is refused, since no parent could satisfy it.
    pub fn parse(requested: Option<i64>, policy: &BudgetPolicy) -> Result<Self, InvalidInput> {
        let Some(requested) = requested else {
            return Ok(Self(policy.default_budget));
        };
        let requested = Tokens::try_from(requested).unwrap_or(0);
        if requested < policy.min_branch_budget {
            return Err(InvalidInput::new(
                "budget",
                format!("must be at least {} tokens", policy.min_branch_budget),
            ));
        }
        Ok(Self(requested.min(policy.max_budget)))
    }

    pub fn tokens(&self) -> Tokens {
        self.0
    }

    /// Whether lessons of `lessons` tokens, chosen against this budget
    /// before the branch existed, start it together with its prompt: the
    /// branch got the whole budget asked for (its parent could lend it)
    /// and they leave it a token. Otherwise it starts with its prompt
    /// alone, and its lessons are chosen again against what it got.
    pub fn fits_lessons(&self, granted: Tokens, prompt: Tokens, lessons: Tokens) -> bool {
        lessons > 0 && granted == self.0 && prompt.saturating_add(lessons) < granted
    }
}

/// A token pool: a branch's, or a session's root pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    /// Tokens granted to this pool.
    pub budget: Tokens,
    /// Tokens spent: by the pool's owner directly, plus what its ended
    /// children spent.
    pub used: Tokens,
    /// Tokens lent to children that are still running.
    pub reserved: Tokens,
}

/// What a parent grants a new child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// The child's budget: the request, or what the parent has left if less.
    pub granted: Tokens,
    /// The parent's ledger after lending it.
    pub parent: Ledger,
}

/// The outcome of charging tokens to a ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Consumption {
    /// Tokens actually charged: never more than what remained.
    pub granted: Tokens,
    /// The ledger after the charge.
    pub ledger: Ledger,
    /// This charge crossed 80% of the budget (for the first time, if the
    /// caller passed `already_warned` correctly).
    pub warning: bool,
    /// Nothing remains: the branch must be force-returned.
    pub exhausted: bool,
}

impl Ledger {
    pub fn new(budget: Tokens) -> Self {
        Self { budget, used: 0, reserved: 0 }
    }

    /// What can still be spent or lent.
    pub fn remaining(&self) -> Tokens {
        self.budget.saturating_sub(self.used).saturating_sub(self.reserved)
    }

    /// Lends a new child its budget, or refuses with what is available when
    /// that is below `min`.
    pub fn allocate(&self, request: BudgetRequest, min: Tokens) -> Result<Allocation, Tokens> {
        let available = self.remaining();
        let granted = request.tokens().min(available);
        if granted < min || granted == 0 {
            return Err(available);
        }
        let parent = Self { reserved: self.reserved + granted, ..*self };
        Ok(Allocation { granted, parent })
    }

    /// Charges `tokens`, capped at what remains, so a pool is never
    /// overspent however many callers charge it at once.
    pub fn consume(&self, tokens: Tokens, already_warned: bool) -> Consumption {
        let granted = tokens.min(self.remaining());
        let ledger = Self { used: self.used + granted, ..*self };
        let warning = !already_warned && ledger.past_warning_threshold();
        // Exhausted when the pool's own spending reaches its budget. Tokens
        // lent to active children are not spent: a charge capped by them is
        // only cut short, and what the children leave comes back to it.
        let exhausted = tokens > 0 && ledger.used >= ledger.budget;
        Consumption { granted, ledger, warning, exhausted }
    }

    /// Sets what a gateway-run branch has spent to the size of its context
    /// as its model provider counted it (`context`: the last call's input
    /// plus its output), capped at what the pool may hold. The provider's
    /// count replaces the gateway's estimates of the tool results since the
    /// previous call, up or down. `granted` is the change, when it is an
    /// increase.
    pub fn measure(&self, context: Tokens, already_warned: bool) -> Consumption {
        let ceiling = self.budget.saturating_sub(self.reserved);
        let used = context.min(ceiling);
        let ledger = Self { used, ..*self };
        let warning = !already_warned && ledger.past_warning_threshold();
        let exhausted = context >= self.budget;
        Consumption { granted: used.saturating_sub(self.used), ledger, warning, exhausted }
    }

    /// 80% of the budget has been spent.
    pub fn past_warning_threshold(&self) -> bool {
        // used / budget >= 0.8, in integers.
        self.used.saturating_mul(5) >= self.budget.saturating_mul(4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(n: i64) -> BudgetRequest {
        BudgetRequest::parse(Some(n), &BudgetPolicy::default()).unwrap()
    }

    #[test]
    fn a_measured_context_replaces_the_estimate_within_the_budget() {
        let pool = Ledger { budget: 1_000, used: 600, reserved: 0 };
        let up = pool.measure(700, false);
        assert_eq!(
            (up.ledger.used, up.granted, up.warning, up.exhausted),
            (700, 100, false, false)
        );
        let down = pool.measure(550, false);
        assert_eq!((down.ledger.used, down.granted), (550, 0), "the provider counted less");
        let warned = pool.measure(800, false);
        assert!(warned.warning && !warned.exhausted);
        assert!(!pool.measure(800, true).warning, "warned once");
        let over = pool.measure(1_300, true);
        assert_eq!((over.ledger.used, over.exhausted), (1_000, true), "never past the budget");
        let lent = Ledger { budget: 1_000, used: 100, reserved: 300 };
        assert_eq!(lent.measure(900, false).ledger.used, 700, "what is lent stays lent");
    }

    #[test]
    fn lessons_start_a_branch_only_when_it_got_what_it_asked_for_and_a_token_is_left() {
        let asked = req(1_000);
        assert!(asked.fits_lessons(1_000, 100, 899));
        assert!(!asked.fits_lessons(1_000, 100, 900), "they would leave nothing");
        assert!(!asked.fits_lessons(999, 100, 10), "its parent lent it less");
        assert!(!asked.fits_lessons(1_000, 100, 0), "none chosen");
        assert!(!asked.fits_lessons(1_000, Tokens::MAX, 1), "no overflow");
    }

    #[test]
    fn requests_are_defaulted_capped_or_refused() {
        let p = BudgetPolicy::default();
        let cases: &[(Option<i64>, Option<Tokens>, &str)] = &[
            (None, Some(8_192), "default"),
            (Some(256), Some(256), "minimum"),
            (Some(32_768), Some(32_768), "at cap"),
            (Some(100_000), Some(32_768), "capped silently"),
            (Some(255), None, "below minimum"),
            (Some(0), None, "zero"),
            (Some(-1), None, "negative"),
        ];
        for (raw, want, why) in cases {
            let got = BudgetRequest::parse(*raw, &p).ok().map(|r| r.tokens());
            assert_eq!(got, *want, "{why}");
        }
    }

    #[test]
    fn allocation_lends_from_what_remains() {
        let parent = Ledger::new(10_000);
        let a = parent.allocate(req(4_000), 256).unwrap();
        assert_eq!(a.granted, 4_000);
        assert_eq!((a.parent.used, a.parent.reserved), (0, 4_000));
        assert_eq!(a.parent.remaining(), 6_000);
    }

    #[test]
    fn a_short_parent_gives_what_it_has_or_refuses() {
        let parent = Ledger { budget: 10_000, used: 9_000, reserved: 500 };
        let a = parent.allocate(req(4_000), 256).unwrap();
        assert_eq!(a.granted, 500, "what remains");
        assert_eq!(a.parent.remaining(), 0);

        let poorer = Ledger { budget: 10_000, used: 9_900, reserved: 0 };
        assert_eq!(poorer.allocate(req(4_000), 256), Err(100), "100 < min 256");
    }

    #[test]
    fn consumption_is_capped_warns_at_80_percent_and_exhausts() {
        let l = Ledger::new(1_000);
        let c = l.consume(799, false);
        assert_eq!((c.granted, c.warning, c.exhausted), (799, false, false));
        let c = c.ledger.consume(1, false);
        assert_eq!((c.granted, c.warning, c.exhausted), (1, true, false), "800 = 80%");
        let c = c.ledger.consume(10, true);
        assert!(!c.warning, "warned once only");
        let c = c.ledger.consume(500, true);
        assert_eq!(c.granted, 190, "capped at what remained");
        assert!(c.exhausted);
        assert_eq!(c.ledger.used, 1_000);
        let c = c.ledger.consume(5, true);
        assert_eq!(c.granted, 0, "nothing more once exhausted");
    }

    #[test]
    fn lent_tokens_cannot_be_spent_but_do_not_exhaust() {
        let l = Ledger { budget: 1_000, used: 0, reserved: 900 };
        let c = l.consume(200, false);
        assert_eq!(c.granted, 100, "cut short at what is not lent");
        assert!(!c.exhausted, "the 900 lent tokens may still come back");
    }

    #[test]
    fn policy_validation() {
        assert!(BudgetPolicy::default().validate().is_ok());
        let bad = BudgetPolicy { default_budget: 40_000, ..BudgetPolicy::default() };
        assert!(bad.validate().is_err());
        let bad = BudgetPolicy { session_budget: 10, ..BudgetPolicy::default() };
        assert!(bad.validate().is_err());
    }
}
