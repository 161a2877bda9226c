//! The active-branch counters the limits keep, split into stripes (see the
//! third migration).

use chrono::{DateTime, Utc};
use sqlx::{ColumnIndex, Database, Encode, Executor, Type};
use uuid::Uuid;

use crate::{
    StoreError,
    dialect::{Dialect, Param, RowsAffected, Sql, Value, locking},
    ts::Ts,
    tx::Tx,
};

/// How many rows each active-branch counter is split into: creations and
/// ends that run at the same time each lock one stripe, so up to this many
/// proceed without waiting for one another's commits.
pub(crate) const COUNTER_STRIPES: i64 = 16;

impl<D: Dialect> Tx<D>
where
    for<'c> &'c mut <D::DB as Database>::Connection: Executor<'c, Database = D::DB>,
    for<'a> &'a str: Encode<'a, D::DB> + Type<D::DB> + ColumnIndex<<D::DB as Database>::Row>,
    usize: ColumnIndex<<D::DB as Database>::Row>,
    Ts: Param<D::DB>,
    Option<Ts>: Param<D::DB>,
    for<'a> Option<&'a str>: Encode<'a, D::DB> + Type<D::DB>,
    Option<String>: Param<D::DB>,
    Option<i64>: Param<D::DB>,
    Option<Uuid>: Param<D::DB>,
    String: Value<D::DB>,
    i64: Value<D::DB>,
    i32: Value<D::DB>,
    bool: Value<D::DB>,
    Uuid: Value<D::DB>,
    DateTime<Utc>: Value<D::DB>,
{
    /// Takes one slot of a striped counter (see the third migration):
    /// first in any stripe with room that no other transaction holds,
    /// else in each stripe in turn, waiting for its lock. `false`
    /// when every stripe is full, that is when the counter reached
    /// `limit`.
    pub(crate) async fn take_stripe(
        &mut self,
        counter: &CounterSql,
        key: Option<&str>,
        limit: i64,
    ) -> Result<bool, StoreError> {
        let mut free = sqlx::query(D::pick(&counter.take_free));
        if let Some(key) = key {
            free = free.bind(key);
        }
        let taken = free.bind(limit).bind(COUNTER_STRIPES).execute(&mut *self.0).await?;
        if taken.rows_affected() == 1 {
            return Ok(true);
        }
        // Stripes from `limit` on have no room when the limit is
        // below the number of stripes.
        for stripe in 0..COUNTER_STRIPES.min(limit) {
            let mut one = sqlx::query(counter.take_in);
            if let Some(key) = key {
                one = one.bind(key);
            }
            let one = one.bind(limit).bind(COUNTER_STRIPES).bind(stripe);
            if one.execute(&mut *self.0).await?.rows_affected() == 1 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Gives one slot back to a striped counter, in any stripe above
    /// zero.
    pub(crate) async fn give_stripe(
        &mut self,
        counter: &CounterSql,
        key: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut free = sqlx::query(D::pick(&counter.give_free));
        if let Some(key) = key {
            free = free.bind(key);
        }
        if free.execute(&mut *self.0).await?.rows_affected() == 1 {
            return Ok(());
        }
        // Every stripe above zero is held by another transaction
        // that may take or give slots too: wait for each in turn.
        // The slot being given back was counted, so one is found
        // unless others keep moving ahead of the scan.
        for _ in 0..2 {
            for stripe in 0..COUNTER_STRIPES {
                let mut one = sqlx::query(counter.give_in);
                if let Some(key) = key {
                    one = one.bind(key);
                }
                if one.bind(stripe).execute(&mut *self.0).await?.rows_affected() == 1 {
                    return Ok(());
                }
            }
        }
        Err(StoreError::Contended)
    }
}

/// A striped counter's statements. Parameters: the key (the tenant's
/// counter only), then the limit and the number of stripes, then
/// the stripe. A stripe's room is `limit / stripes`, plus one for the
/// first `limit % stripes` stripes, so that the rooms add up to the
/// limit.
pub(crate) struct CounterSql {
    take_free: Sql,
    take_in: &'static str,
    give_free: Sql,
    give_in: &'static str,
}

pub(crate) const TENANT_COUNTER: CounterSql = CounterSql {
    take_free: locking!(
    ["UPDATE tenant_usage SET active_branches = active_branches + 1 \
         WHERE tenant_id = $1 AND stripe = (SELECT stripe FROM tenant_usage \
         WHERE tenant_id = $1 \
         AND active_branches < $2 / $3 + CASE WHEN stripe < $2 % $3 THEN 1 ELSE 0 END \
         ORDER BY random() LIMIT 1"]
        " FOR UPDATE SKIP LOCKED" [")"]
    ),
    take_in: "INSERT INTO tenant_usage (tenant_id, stripe, active_branches) VALUES ($1, $4, 1) \
         ON CONFLICT (tenant_id, stripe) DO UPDATE \
         SET active_branches = tenant_usage.active_branches + 1 \
         WHERE tenant_usage.active_branches \
         < $2 / $3 + CASE WHEN tenant_usage.stripe < $2 % $3 THEN 1 ELSE 0 END",
    give_free: locking!(
    ["UPDATE tenant_usage SET active_branches = active_branches - 1 \
         WHERE tenant_id = $1 AND stripe = (SELECT stripe FROM tenant_usage \
         WHERE tenant_id = $1 AND active_branches > 0 ORDER BY random() LIMIT 1"]
        " FOR UPDATE SKIP LOCKED" [")"]
    ),
    give_in: "UPDATE tenant_usage SET active_branches = active_branches - 1 \
         WHERE tenant_id = $1 AND stripe = $2 AND active_branches > 0",
};

pub(crate) const DEPLOYMENT_COUNTER: CounterSql = CounterSql {
    take_free: locking!(
    ["UPDATE deployment_usage SET active_branches = active_branches + 1 \
         WHERE stripe = (SELECT stripe FROM deployment_usage \
         WHERE active_branches < $1 / $2 + CASE WHEN stripe < $1 % $2 THEN 1 ELSE 0 END \
         ORDER BY random() LIMIT 1"]
        " FOR UPDATE SKIP LOCKED" [")"]
    ),
    take_in: "INSERT INTO deployment_usage (stripe, active_branches) VALUES ($3, 1) \
         ON CONFLICT (stripe) DO UPDATE \
         SET active_branches = deployment_usage.active_branches + 1 \
         WHERE deployment_usage.active_branches \
         < $1 / $2 + CASE WHEN deployment_usage.stripe < $1 % $2 THEN 1 ELSE 0 END",
    give_free: locking!(
    ["UPDATE deployment_usage SET active_branches = active_branches - 1 \
         WHERE stripe = (SELECT stripe FROM deployment_usage \
         WHERE active_branches > 0 ORDER BY random() LIMIT 1"]
        " FOR UPDATE SKIP LOCKED" [")"]
    ),
    give_in: "UPDATE deployment_usage SET active_branches = active_branches - 1 \
         WHERE stripe = $1 AND active_branches > 0",
};
