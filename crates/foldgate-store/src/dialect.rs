//! What differs between the backends.
//!
//! Postgres and SQLite accept the same SQL here (numbered `$N` parameters,
//! `RETURNING`, `ON CONFLICT`, `FILTER`, recursive CTEs), except for row
//! locks: Postgres takes `FOR UPDATE` locks inside a transaction, while SQLite
//! transactions are `BEGIN IMMEDIATE` and so hold the database's one write
//! lock from the start. A [`Dialect`] says how a backend begins a
//! transaction, which of its errors are worth a retry, which form of a
//! form of a [`Sql`] statement it runs, and how it runs the operations on the
//! folding path: creating a branch, ending a branch with its descendants,
//! ending the supervisor's batch and charging an upstream call (in one
//! statement each on Postgres).

use std::{fmt::Debug, future::Future};

use foldgate_domain::{Branch, BranchId, Consumption, EndReason, TenantId};
use sqlx::{Database, Decode, Encode, IntoArguments, Pool, Transaction, Type, migrate::Migrator};

use crate::{
    BatchFinish, CallRecord, CreateRefusal, Finish, NewBranch, StoreError, TreeEnd, store::SqlStore,
};

/// A statement in its Postgres and its SQLite form: most often the same
/// but for the row-lock clause (built by [`locking!`]).
#[derive(Debug, Clone, Copy)]
pub struct Sql {
    pub postgres: &'static str,
    pub sqlite: &'static str,
}

/// A [`Sql`] statement whose forms differ only by a lock clause, from its
/// text before and after the clause:
/// `locking!([before…] " FOR UPDATE" [after…])`. The parts are literals (or
/// macros giving literals) for `concat!`.
macro_rules! locking {
    ([$($before:tt)*] $clause:literal [$($after:tt)*]) => {
        $crate::dialect::Sql {
            postgres: concat!($($before)*, $clause, $($after)*),
            sqlite: concat!($($before)*, $($after)*),
        }
    };
}
pub(crate) use locking;

/// A Rust type that is bound as a parameter of a statement of `DB`.
pub trait Param<DB: Database>: for<'q> Encode<'q, DB> + Type<DB> + Send {}

impl<DB: Database, T> Param<DB> for T where T: for<'q> Encode<'q, DB> + Type<DB> + Send {}

/// A Rust type that is bound as a parameter and read from a column of `DB`.
pub trait Value<DB: Database>:
    for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB> + Send + Sync
{
}

impl<DB: Database, T> Value<DB> for T where
    T: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB> + Send + Sync
{
}

/// What a statement changed.
pub trait RowsAffected {
    fn rows_affected(&self) -> u64;
}

impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}

impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}

/// A backend: its sqlx database and what it does differently.
///
/// The code over any dialect states once per `impl` block which types its
/// database binds and reads ([`Param`], [`Value`]): Rust does not carry such
/// bounds from a trait to its users.
pub trait Dialect: Debug + Send + Sync + Sized + 'static {
    type DB: Database<Arguments: IntoArguments<Self::DB>, QueryResult: RowsAffected>;

    /// `db.system.name` in metrics.
    const SYSTEM: &'static str;

    fn migrator() -> &'static Migrator;

    /// The form of `statement` this backend runs.
    fn pick(statement: &Sql) -> &'static str;

    /// Opens a transaction.
    fn begin(
        pool: &Pool<Self::DB>,
    ) -> impl Future<Output = Result<Transaction<'static, Self::DB>, sqlx::Error>> + Send;

    /// Whether the database aborted the transaction for a reason that a
    /// run of it again gets past (an aborted run wrote nothing).
    fn is_retryable(error: &StoreError) -> bool;

    /// Creates a branch (see [`crate::Store::create_branch`]), timed as
    /// `create_branch`.
    fn create_branch(
        store: &SqlStore<Self>,
        tenant: &TenantId,
        new: &NewBranch,
    ) -> impl Future<Output = Result<Result<Branch, CreateRefusal>, StoreError>> + Send;

    /// Ends a branch after its active descendants (see
    /// [`crate::Store::end_tree`]), timed as `end_tree`.
    fn end_tree(
        store: &SqlStore<Self>,
        tenant: &TenantId,
        id: BranchId,
        finish: &Finish,
        child_reason: EndReason,
    ) -> impl Future<Output = Result<TreeEnd, StoreError>> + Send;

    /// Ends the supervisor's batch (see [`crate::Store::finish_batch`]),
    /// timed as `finish_batch`.
    fn finish_batch(
        store: &SqlStore<Self>,
        batch: &[BatchFinish],
    ) -> impl Future<Output = Result<Vec<Branch>, StoreError>> + Send;

    /// Charges an upstream call to a branch and records it in its trace
    /// (see [`crate::Store::meter_call`]), timed as `meter_call`.
    fn meter_call(
        store: &SqlStore<Self>,
        tenant: &TenantId,
        id: BranchId,
        call: &CallRecord,
    ) -> impl Future<Output = Result<Option<Consumption>, StoreError>> + Send;
}
