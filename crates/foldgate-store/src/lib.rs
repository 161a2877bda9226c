//! Persistence for context folding.
//!
//! The database is the source of truth: branch trees, token pools, limits and
//! deadlines all live here, so a crashed or restarted process loses nothing
//! and several replicas can share one Postgres. [`Store`] is the one
//! interface; [`PgStore`] (production, several replicas) and [`SqliteStore`]
//! (the zero-configuration default, one process) implement it.
//!
//! Every method takes the tenant first and every query filters by it, so one
//! tenant's ids are simply not found from another tenant. Every state change
//! is a single transaction whose transition is conditional on the branch
//! still being `active`: when a return, a deadline and a budget exhaustion
//! race, exactly one of them changes the row.

mod admin;
mod api;
mod calls;
mod connect;
mod counters;
pub mod dialect;
mod error;
pub mod inspect;
mod memory;
mod metrics;
mod ops;
mod pg_fold;
mod postgres;
mod prune;
mod record;
mod registrations;
mod requests;
mod run_queries;
mod runs;
mod sql_store;
mod sqlite;
mod store;
mod ts;
mod tx;

pub use admin::{
    AdminStore, AuditEntry, AuditPage, BranchTrace, MAX_PAGE, SessionListing, SessionPage,
    StoredSettings, TenantOverview, TenantSpend, TracePage, TracedCall, TreeBranch, UsageKind,
    UsageLine,
};
pub use api::{PoolUsage, Store};
pub use calls::{CallOutcome, CallRecord, CallSummary, OutsideUsage, ToolCalls};
pub use connect::{
    ACTIVITY_RESOLUTION, Backend, ConnectOptions, DatabaseUrl, connect, connect_with_meter,
    migrate, redact_url,
};
pub(crate) use connect::{activity_stale_before, check_migrated, pool_options};
pub use error::{ErrorKind, StoreError};
pub use memory::{
    DistillOutcome, Distillation, DistillationEnd, Extraction, MemoryQuery, MemoryStore,
    MemoryVectors, NewMemory, Ranked, TenantScope, VectorsVersion,
};
pub use postgres::{PgStore, Postgres};
pub use prune::{Prune, PrunedTrees};
pub use registrations::{Registration, RegistrationKind, Registrations};
pub use requests::{
    BatchFinish, CreateRefusal, CreateRefusalKind, CreateRules, DueBranch, Finish, Finished,
    IdleSession, NewBranch, ParentChoice, TreeEnd,
};
pub(crate) use requests::{CLEANUP_ROUNDS, due_branch, idle_session, retry_after};
pub use runs::{
    ModelBill, ModelUsage, NewRun, NewStep, Run, RunEnd, RunState, RunStep, StepKind, StepWritten,
};
pub use sqlite::{Sqlite, SqliteStore};
pub use store::SqlStore;
