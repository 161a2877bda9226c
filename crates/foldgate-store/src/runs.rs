//! Gateway-run branches: the run beside the branch, its steps, and who
//! works on it.
//!
//! A run is owned by one replica at a time under a lease that the replica
//! renews while it works. Each step is written as it completes, in one
//! transaction with what it did to the books, and only by the lease holder
//! and only once (the step numbers are the key). When a replica dies its
//! leases lapse, and another replica takes the run over and replays the
//! written steps into the model's context; a step that was in flight at the
//! crash is made again (and marked `repeated`).

use std::{fmt, str::FromStr, time::Duration};

use chrono::{DateTime, Utc};
use foldgate_domain::{BranchId, Consumption, TenantId, Tokens};

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Being worked on (or waiting for a replica to take it over).
    Running,
    /// Finished: its outcome is final.
    Done,
}

impl RunState {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Done => "done",
        }
    }
}

impl FromStr for RunState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "running" => Ok(Self::Running),
            "done" => Ok(Self::Done),
            other => Err(format!("unknown run state {other:?}")),
        }
    }
}

/// What a model provider billed, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelUsage {
    pub calls: u64,
    pub input_tokens: Tokens,
    pub output_tokens: Tokens,
}

impl ModelUsage {
    pub fn add(&mut self, input_tokens: Tokens, output_tokens: Tokens) {
        self.calls = self.calls.saturating_add(1);
        self.input_tokens = self.input_tokens.saturating_add(input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(output_tokens);
    }

    /// Both summed.
    #[must_use]
    pub fn plus(self, other: Self) -> Self {
        Self {
            calls: self.calls.saturating_add(other.calls),
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
        }
    }
}

/// What a tenant was billed for one model (a `[[models]]` entry), over
/// every gateway-run branch: by the runs themselves, and by distilling
/// their lessons afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelBill {
    pub model: String,
    /// The runs' own model calls.
    pub runs: ModelUsage,
    /// The calls that distilled lessons from the runs once they ended.
    pub distillation: ModelUsage,
}

impl ModelBill {
    /// Everything the tenant was billed for the model.
    pub fn total(&self) -> ModelUsage {
        self.runs.plus(self.distillation)
    }
}

/// A run to insert with its branch.
#[derive(Clone)]
pub struct NewRun {
    /// The `[[models]]` entry, by name.
    pub model: String,
    /// The `<upstream>__<tool>` names the model may call.
    pub tools: Vec<String>,
    /// The caller's scopes, for a replica that resumes the run.
    pub scopes: Vec<String>,
    /// The replica that starts the run, and until when it holds it.
    pub lease_owner: String,
    pub lease_until: DateTime<Utc>,
    /// Lessons from the tenant's memory for the model's system text.
    pub lessons: Option<String>,
}

impl fmt::Debug for NewRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewRun")
            .field("model", &self.model)
            .field("tools", &self.tools.len())
            .field("lessons", &self.lessons.as_ref().map(String::len))
            .field("lease_owner", &self.lease_owner)
            .finish_non_exhaustive()
    }
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub tenant: TenantId,
    pub branch_id: BranchId,
    pub model: String,
    pub tools: Vec<String>,
    pub scopes: Vec<String>,
    pub state: RunState,
    /// The result its caller gets (JSON), once done.
    pub outcome: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
    /// Steps written.
    pub steps: u32,
    pub usage: ModelUsage,
    /// How often the run was taken over after its replica stopped renewing
    /// its lease.
    pub resumes: u32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Lessons from the tenant's memory the model is given.
    pub lessons: Option<String>,
}

/// How a run ended, as its owner records it ([`crate::Store::finish_run`]).
#[derive(Debug, Clone, Copy)]
pub struct RunEnd<'a> {
    /// The replica that must hold the run's lease.
    pub owner: &'a str,
    /// The result its caller gets (JSON).
    pub outcome: &'a str,
    /// Tokens of its finding, recorded as returned unless its branch's end
    /// recorded them already.
    pub returned_tokens: Tokens,
    /// Whether its lessons are distilled (queued for the distiller).
    pub distill: bool,
    pub at: DateTime<Utc>,
}

/// What a step was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// A call of the model.
    Model,
    /// A call of an upstream tool the model asked for.
    Tool,
}

impl StepKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::Tool => "tool",
        }
    }
}

impl FromStr for StepKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "model" => Ok(Self::Model),
            "tool" => Ok(Self::Tool),
            other => Err(format!("unknown step kind {other:?}")),
        }
    }
}

/// A step to write.
#[derive(Debug, Clone)]
pub struct NewStep {
    /// Its number: the run's steps so far.
    pub seq: u32,
    pub kind: StepKind,
    /// JSON: what the runner needs to replay it.
    pub body: String,
    /// A model step: what the provider billed for the call.
    pub input_tokens: Tokens,
    pub output_tokens: Tokens,
    /// A model step: the size of the branch's context after it, as the
    /// provider counted it; the branch's spending is set to it.
    pub context_tokens: Option<Tokens>,
    pub duration: Duration,
    /// Made again after a takeover: it was in flight when the replica died.
    pub repeated: bool,
    pub at: DateTime<Utc>,
}

/// A step as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStep {
    pub seq: u32,
    pub kind: StepKind,
    pub body: String,
    pub input_tokens: Tokens,
    pub output_tokens: Tokens,
    pub duration: Duration,
    pub repeated: bool,
    pub at: DateTime<Utc>,
}

/// What [`Store::record_step`](crate::Store::record_step) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepWritten {
    /// Written. For a model step of a branch still active, what it did to
    /// the branch's books.
    Written(Option<Consumption>),
    /// Nothing was written: the caller no longer holds the run (its lease
    /// lapsed and another replica took it over, or the run is done), or the
    /// step was written already.
    NotOwner,
}

/// The columns of `branch_runs`, as a literal for `concat!`.
macro_rules! run_columns {
    () => {
        "tenant_id, branch_id, model, tools, scopes, state, outcome, lease_owner, lease_until, \
         steps, model_calls, input_tokens, output_tokens, resumes, created_at, updated_at, lessons"
    };
}
pub(crate) use run_columns;

/// A `branch_runs` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RunRow {
    pub tenant_id: String,
    pub branch_id: uuid::Uuid,
    pub model: String,
    pub tools: String,
    pub scopes: String,
    pub state: String,
    pub outcome: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
    pub steps: i32,
    pub model_calls: i32,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub resumes: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub lessons: Option<String>,
}

/// A `run_steps` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct StepRow {
    pub seq: i32,
    pub kind: String,
    pub body: String,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub duration_ms: i64,
    pub repeated: bool,
    pub at: DateTime<Utc>,
}

fn corrupt(what: impl fmt::Display) -> crate::StoreError {
    crate::StoreError::Corrupt(what.to_string())
}

fn count(v: i32) -> Result<u32, crate::StoreError> {
    u32::try_from(v).map_err(|_| corrupt(format!("negative count {v}")))
}

impl TryFrom<RunRow> for Run {
    type Error = crate::StoreError;

    fn try_from(r: RunRow) -> Result<Self, Self::Error> {
        let tools: Vec<String> = serde_json::from_str(&r.tools).map_err(corrupt)?;
        Ok(Run {
            tenant: TenantId::parse(&r.tenant_id).map_err(corrupt)?,
            branch_id: BranchId::from_uuid(r.branch_id),
            model: r.model,
            tools,
            scopes: r.scopes.split_whitespace().map(str::to_owned).collect(),
            state: r.state.parse().map_err(corrupt)?,
            outcome: r.outcome,
            lease_owner: r.lease_owner,
            lease_until: r.lease_until,
            steps: count(r.steps)?,
            usage: ModelUsage {
                calls: u64::from(count(r.model_calls)?),
                input_tokens: crate::record::tokens(r.input_tokens)?,
                output_tokens: crate::record::tokens(r.output_tokens)?,
            },
            resumes: count(r.resumes)?,
            created_at: r.created_at,
            updated_at: r.updated_at,
            lessons: r.lessons,
        })
    }
}

impl TryFrom<StepRow> for RunStep {
    type Error = crate::StoreError;

    fn try_from(r: StepRow) -> Result<Self, Self::Error> {
        Ok(RunStep {
            seq: count(r.seq)?,
            kind: r.kind.parse().map_err(corrupt)?,
            body: r.body,
            input_tokens: crate::record::tokens(r.input_tokens)?,
            output_tokens: crate::record::tokens(r.output_tokens)?,
            duration: Duration::from_millis(u64::try_from(r.duration_ms).unwrap_or(0)),
            repeated: r.repeated,
            at: r.at,
        })
    }
}

pub(crate) fn tools_json(tools: &[String]) -> String {
    serde_json::to_string(tools).unwrap_or_else(|_| "[]".to_owned())
}
