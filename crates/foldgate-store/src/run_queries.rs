//! The runs of gateway-run branches, as [`SqlStore`] reads and writes them.

use chrono::{DateTime, Utc};
use foldgate_domain::{BranchId, BranchStatus, TenantId};
use sqlx::{ColumnIndex, Database, Encode, Executor, Type};
use uuid::Uuid;

use crate::{
    ModelBill, ModelUsage, NewStep, Run, RunEnd, RunState, RunStep, StepKind, StepWritten,
    StoreError,
    dialect::{Dialect, Param, RowsAffected, Sql, Value, locking},
    record::{db_tokens, ledger},
    runs::{RunRow, StepRow, run_columns},
    store::SqlStore,
    ts::Ts,
};

/// A run's progress and lease, locked.
const LOCK_RUN: Sql = locking!(
    ["SELECT steps, lease_owner, state FROM branch_runs WHERE tenant_id = $1 AND branch_id = $2"]
    " FOR UPDATE" []
);

/// Takes over runs whose lease lapsed; a replica skips the rows another one holds.
const CLAIM_LAPSED: Sql = locking!(
    ["UPDATE branch_runs SET lease_owner = $1, lease_until = $3, resumes = resumes + 1, \
                 updated_at = $2 WHERE branch_id IN ( \
                    SELECT branch_id FROM branch_runs WHERE state = 'running' \
                    AND (lease_until IS NULL OR lease_until <= $2) \
                    ORDER BY lease_until LIMIT $4"]
    " FOR UPDATE SKIP LOCKED" [") RETURNING tenant_id, branch_id"]
);

impl<D: Dialect> SqlStore<D>
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
    pub(crate) async fn load_run(
        &self,
        tenant: &TenantId,
        id: BranchId,
    ) -> Result<Option<Run>, StoreError> {
        self.timed("run", async {
            let row: Option<RunRow> = sqlx::query_as(concat!(
                "SELECT ",
                run_columns!(),
                " FROM branch_runs WHERE tenant_id = $1 AND branch_id = $2"
            ))
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await?;
            row.map(Run::try_from).transpose()
        })
        .await
    }

    pub(crate) async fn load_steps(
        &self,
        tenant: &TenantId,
        id: BranchId,
    ) -> Result<Vec<RunStep>, StoreError> {
        self.timed("run_steps", async {
            let rows: Vec<StepRow> = sqlx::query_as(
                "SELECT seq, kind, body, input_tokens, output_tokens, duration_ms, repeated, at \
                 FROM run_steps WHERE tenant_id = $1 AND branch_id = $2 ORDER BY seq",
            )
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter().map(RunStep::try_from).collect()
        })
        .await
    }

    pub(crate) async fn write_step(
        &self,
        tenant: &TenantId,
        id: BranchId,
        owner: &str,
        step: &NewStep,
    ) -> Result<StepWritten, StoreError> {
        // Nothing is written unless the step is the holder's next.
        self.in_tx(
            "record_step",
            |w| matches!(w, StepWritten::Written(_)),
            |mut tx| async move {
                let result = async {
                    let held: Option<(i32, Option<String>, String)> =
                        sqlx::query_as(D::pick(&LOCK_RUN))
                            .bind(tenant.as_str())
                            .bind(id.as_uuid())
                            .fetch_optional(&mut *tx.0)
                            .await?;
                    let Some((steps, lease_owner, state)) = held else {
                        return Ok(StepWritten::NotOwner);
                    };
                    let next = u32::try_from(steps).ok() == Some(step.seq);
                    if !next
                        || lease_owner.as_deref() != Some(owner)
                        || state != RunState::Running.as_str()
                    {
                        return Ok(StepWritten::NotOwner);
                    }
                    let model_step = step.kind == StepKind::Model;
                    sqlx::query(
                    "INSERT INTO run_steps (tenant_id, branch_id, seq, kind, body, input_tokens, \
                     output_tokens, duration_ms, repeated, at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(tenant.as_str())
                .bind(id.as_uuid())
                .bind(i64::from(step.seq))
                .bind(step.kind.as_str())
                .bind(&step.body)
                .bind(db_tokens(step.input_tokens))
                .bind(db_tokens(step.output_tokens))
                .bind(i64::try_from(step.duration.as_millis()).unwrap_or(i64::MAX))
                .bind(step.repeated)
                .bind(Ts(step.at))
                .execute(&mut *tx.0)
                .await?;
                    sqlx::query(
                        "UPDATE branch_runs SET steps = steps + 1, model_calls = model_calls + $3, \
                     input_tokens = input_tokens + $4, output_tokens = output_tokens + $5, \
                     updated_at = $6 WHERE tenant_id = $1 AND branch_id = $2",
                    )
                    .bind(tenant.as_str())
                    .bind(id.as_uuid())
                    .bind(i32::from(model_step))
                    .bind(db_tokens(step.input_tokens))
                    .bind(db_tokens(step.output_tokens))
                    .bind(Ts(step.at))
                    .execute(&mut *tx.0)
                    .await?;
                    if !model_step {
                        return Ok(StepWritten::Written(None));
                    }
                    let Some(context) = step.context_tokens else {
                        return Ok(StepWritten::Written(None));
                    };
                    let Some(branch) = tx.lock_branch(tenant, id.as_uuid()).await? else {
                        return Ok(StepWritten::Written(None));
                    };
                    if branch.status != BranchStatus::Active.as_str() {
                        return Ok(StepWritten::Written(None));
                    }
                    let measured = ledger(branch.budget, branch.used, branch.reserved)?
                        .measure(context, branch.warned_at.is_some());
                    tx.record_consumption(
                        tenant,
                        id.as_uuid(),
                        db_tokens(measured.ledger.used),
                        measured.warning.then_some(step.at),
                        measured.exhausted.then_some(step.at),
                    )
                    .await?;
                    Ok(StepWritten::Written(Some(measured)))
                }
                .await;
                (tx, result)
            },
        )
        .await
    }

    pub(crate) async fn renew_lease(
        &self,
        tenant: &TenantId,
        id: BranchId,
        owner: &str,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.timed("renew_run_lease", async {
            let done = sqlx::query(
                "UPDATE branch_runs SET lease_until = $4 WHERE tenant_id = $1 AND branch_id = $2 \
                 AND lease_owner = $3 AND state = 'running'",
            )
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .bind(owner)
            .bind(Ts(until))
            .execute(&self.pool)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    pub(crate) async fn complete_run(
        &self,
        tenant: &TenantId,
        id: BranchId,
        end: &RunEnd<'_>,
    ) -> Result<bool, StoreError> {
        let RunEnd { owner, outcome, returned_tokens, distill, at } = *end;
        self.in_tx("finish_run", |done| *done, |mut tx| async move {
            let result = async {
                let done = sqlx::query(
                    "UPDATE branch_runs SET state = 'done', outcome = $4, lease_owner = NULL, \
                     lease_until = NULL, updated_at = $5, \
                     distill = CASE WHEN $6 THEN 'pending' ELSE NULL END \
                     WHERE tenant_id = $1 AND branch_id = $2 AND lease_owner = $3 AND state = 'running'",
                )
                .bind(tenant.as_str())
                .bind(id.as_uuid())
                .bind(owner)
                .bind(outcome)
                .bind(Ts(at))
                .bind(distill)
                .execute(&mut *tx.0)
                .await?;
                if done.rows_affected() != 1 {
                    return Ok(false);
                }
                // A branch ended from outside kept no return: what
                // the caller gets of the run is what was returned.
                sqlx::query(
                    "UPDATE branches SET returned_tokens = $3 \
                     WHERE tenant_id = $1 AND id = $2 AND returned_tokens IS NULL",
                )
                .bind(tenant.as_str())
                .bind(id.as_uuid())
                .bind(db_tokens(returned_tokens))
                .execute(&mut *tx.0)
                .await?;
                Ok(true)
            }
            .await;
            (tx, result)
        })
        .await
    }

    pub(crate) async fn take_lapsed_runs(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<(TenantId, BranchId)>, StoreError> {
        self.timed("claim_lapsed_runs", async {
            let rows: Vec<(String, Uuid)> = sqlx::query_as(D::pick(&CLAIM_LAPSED))
                .bind(owner)
                .bind(Ts(now))
                .bind(Ts(until))
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
            rows.into_iter()
                .map(|(t, id)| {
                    let tenant =
                        TenantId::parse(&t).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    Ok((tenant, BranchId::from_uuid(id)))
                })
                .collect()
        })
        .await
    }

    pub(crate) async fn runs_ended(&self, owner: &str) -> Result<Vec<BranchId>, StoreError> {
        self.timed("ended_runs", async {
            let ids: Vec<Uuid> = sqlx::query_scalar(
                "SELECT r.branch_id FROM branch_runs r JOIN branches b ON b.id = r.branch_id \
                 WHERE r.lease_owner = $1 AND r.state = 'running' AND b.status <> 'active'",
            )
            .bind(owner)
            .fetch_all(&self.pool)
            .await?;
            Ok(ids.into_iter().map(BranchId::from_uuid).collect())
        })
        .await
    }

    pub(crate) async fn sum_model_usage(
        &self,
        tenant: &TenantId,
    ) -> Result<Vec<ModelBill>, StoreError> {
        self.timed("model_usage", async {
            let rows: Vec<(String, i64, i64, i64, i64, i64, i64)> = sqlx::query_as(
                "SELECT model, CAST(SUM(model_calls) AS BIGINT), CAST(SUM(input_tokens) AS BIGINT), \
                 CAST(SUM(output_tokens) AS BIGINT), CAST(SUM(distill_calls) AS BIGINT), \
                 CAST(SUM(distill_input_tokens) AS BIGINT), \
                 CAST(SUM(distill_output_tokens) AS BIGINT) FROM branch_runs WHERE tenant_id = $1 \
                 GROUP BY model ORDER BY model",
            )
            .bind(tenant.as_str())
            .fetch_all(&self.pool)
            .await?;
            let usage = |calls: i64, input: i64, output: i64| {
                Ok::<_, StoreError>(ModelUsage {
                    calls: u64::try_from(calls).unwrap_or(0),
                    input_tokens: crate::record::tokens(input)?,
                    output_tokens: crate::record::tokens(output)?,
                })
            };
            rows.into_iter()
                .map(|(model, calls, input, output, d_calls, d_input, d_output)| {
                    Ok(ModelBill {
                        model,
                        runs: usage(calls, input, output)?,
                        distillation: usage(d_calls, d_input, d_output)?,
                    })
                })
                .collect()
        })
        .await
    }
}
