//! The folding operations on Postgres in one round trip each: a create, the
//! end of a branch with its descendants and the supervisor's batch call the
//! server-side functions of the migration `20261124000008_one_round_trip`,
//! which do what [`Tx::create`], [`Tx::end_tree`] and [`Tx::finish_batch`] do
//! statement by statement (SQLite still runs those). The rules are the same,
//! and the store's and the engine's tests hold both to them.
//!
//! [`Tx::create`]: crate::tx::Tx::create
//! [`Tx::end_tree`]: crate::tx::Tx::end_tree
//! [`Tx::finish_batch`]: crate::tx::Tx::finish_batch

use chrono::{DateTime, Utc};
use foldgate_domain::{Branch, BranchId, BranchStatus, EndReason, LimitKind, Subject, TenantId};
use sqlx::{FromRow, Row, postgres::PgRow};

use crate::{
    BatchFinish, CLEANUP_ROUNDS, CreateRefusal, Finish, Finished, NewBranch, ParentChoice,
    StoreError, TreeEnd, activity_stale_before,
    counters::COUNTER_STRIPES,
    ops::{RATE_WINDOW, SLOT_RETRY_AFTER},
    postgres::Postgres,
    record::{BranchRow, db_tokens},
    retry_after,
    store::{SqlStore, retry_after_conflict},
    ts::Ts,
};

/// The functions raise this when rows they must change stay locked by others
/// past their retries (as [`StoreError::Contended`]).
const CONTENDED: &str = "FGC01";
/// The functions raise this when a row they rely on is missing.
const CORRUPT: &str = "FGX01";

const CREATE: &str = "SELECT r_outcome, r_amount, r_until, r_status, (r_branch).* \
    FROM foldgate_create_branch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
    $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30)";

const FINISH_BATCH: &str = "SELECT * \
    FROM foldgate_finish_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";

const END_TREE: &str = "SELECT r_outcome, (r_branch).* \
    FROM foldgate_return_tree($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";

/// Runs a statement that is a whole transaction, again after a deadlock or
/// a serialisation failure, and names the functions' own errors.
pub(crate) async fn run<T, F, Fut>(mut statement: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = statement().await.map_err(StoreError::from);
        if !retry_after_conflict::<Postgres, _>(attempt, &result) {
            return result.map_err(|e| match e.database_code().as_deref() {
                Some(CONTENDED) => StoreError::Contended,
                Some(CORRUPT) => StoreError::Corrupt(e.to_string()),
                _ => e,
            });
        }
    }
}

pub(crate) async fn create_branch(
    store: &SqlStore<Postgres>,
    tenant: &TenantId,
    new: &NewBranch,
) -> Result<Result<Branch, CreateRefusal>, StoreError> {
    store
        .timed("create_branch", async {
            let rules = &new.rules;
            let at = new.created_at;
            let parent = match new.parent {
                ParentChoice::Explicit(id) => Some(id.as_uuid()),
                ParentChoice::Active => None,
            };
            let run_ = new.run.as_ref();
            let row = run(|| {
                sqlx::query(CREATE)
                    .bind(tenant.as_str())
                    .bind(new.id.as_uuid())
                    .bind(new.session_id.as_str())
                    .bind(new.owner.as_str())
                    .bind(parent)
                    .bind(&new.description)
                    .bind(&new.prompt)
                    .bind(db_tokens(new.budget.tokens()))
                    .bind(db_tokens(new.prompt_tokens))
                    .bind(db_tokens(new.lessons_tokens))
                    .bind(Ts(at))
                    .bind(Ts(new.deadline_at))
                    .bind(db_tokens(rules.budget.session_budget))
                    .bind(db_tokens(rules.budget.min_branch_budget))
                    .bind(i64::from(rules.max_depth))
                    .bind(i64::from(rules.limits.max_active_per_session))
                    .bind(i64::from(rules.limits.creations_per_minute))
                    .bind(Ts(at - RATE_WINDOW))
                    .bind(i64::from(rules.limits.max_active_per_tenant))
                    .bind(i64::from(rules.limits.max_active_total))
                    .bind(i32::try_from(COUNTER_STRIPES).unwrap_or(i32::MAX))
                    .bind(new.kind.as_str())
                    .bind(new.return_tier.as_str())
                    .bind(Ts(activity_stale_before(at)))
                    .bind(run_.map(|r| r.model.as_str()))
                    .bind(run_.map(|r| crate::runs::tools_json(&r.tools)))
                    .bind(run_.map(|r| r.scopes.join(" ")))
                    .bind(run_.map(|r| r.lease_owner.as_str()))
                    .bind(Ts::opt(run_.map(|r| r.lease_until)))
                    .bind(run_.and_then(|r| r.lessons.as_deref()))
                    .fetch_one(&store.pool)
            })
            .await?;
            let outcome: String = row.try_get("r_outcome")?;
            let amount = || -> Result<u64, StoreError> {
                crate::record::tokens(row.try_get::<Option<i64>, _>("r_amount")?.unwrap_or(0))
            };
            let limited = |limit, until: Option<DateTime<Utc>>| {
                let retry_after = until.map_or(SLOT_RETRY_AFTER, |until| retry_after(at, until));
                Ok(Err(CreateRefusal::Limited { limit, retry_after }))
            };
            match outcome.as_str() {
                "created" => Ok(Ok(BranchRow::from_row(&row)?.try_into()?)),
                "parent_not_found" => Ok(Err(CreateRefusal::ParentNotFound)),
                "parent_is_gateway_run" => Ok(Err(CreateRefusal::ParentIsGatewayRun)),
                "parent_not_active" => {
                    let status: String = row.try_get("r_status")?;
                    let status = status.parse().map_err(StoreError::Corrupt)?;
                    Ok(Err(CreateRefusal::ParentNotActive { status }))
                }
                "session_not_found" => Ok(Err(CreateRefusal::SessionNotFound)),
                "max_depth_exceeded" => {
                    Ok(Err(CreateRefusal::MaxDepthExceeded { max_depth: rules.max_depth }))
                }
                "session_active" => limited(LimitKind::SessionActive, row.try_get("r_until")?),
                "session_creation_rate" => {
                    limited(LimitKind::SessionCreationRate, row.try_get("r_until")?)
                }
                "tenant_active" => limited(LimitKind::TenantActive, None),
                "deployment_active" => limited(LimitKind::DeploymentActive, None),
                "budget_exhausted" => {
                    Ok(Err(CreateRefusal::BudgetExhausted { available: amount()? }))
                }
                "prompt_over_budget" => Ok(Err(CreateRefusal::PromptOverBudget {
                    prompt_tokens: new.prompt_tokens,
                    budget: amount()?,
                })),
                other => Err(StoreError::Corrupt(format!("unknown create outcome {other:?}"))),
            }
        })
        .await
}

pub(crate) async fn end_tree(
    store: &SqlStore<Postgres>,
    tenant: &TenantId,
    id: BranchId,
    finish: &Finish,
    child_reason: EndReason,
) -> Result<TreeEnd, StoreError> {
    store
        .timed("end_tree", async {
            let rows = run(|| {
                sqlx::query(END_TREE)
                    .bind(tenant.as_str())
                    .bind(id.as_uuid())
                    .bind(finish.status.as_str())
                    .bind(finish.reason.map(EndReason::as_str))
                    .bind(Ts(finish.at))
                    .bind(finish.result.as_deref())
                    .bind(db_tokens(finish.result_tokens))
                    .bind(finish.returned_tokens.map(db_tokens))
                    .bind(finish.extract)
                    .bind(child_reason.status().as_str())
                    .bind(child_reason.as_str())
                    .bind(Ts(activity_stale_before(finish.at)))
                    .bind(i32::try_from(COUNTER_STRIPES).unwrap_or(i32::MAX))
                    .bind(i32::from(CLEANUP_ROUNDS))
                    .bind(finish.by.as_ref().map(Subject::as_str))
                    .fetch_all(&store.pool)
            })
            .await?;
            let Some((last, children)) = rows.split_last() else {
                return Err(StoreError::Corrupt("end_tree answered nothing".into()));
            };
            let children = children.iter().map(branch).collect::<Result<Vec<_>, _>>()?;
            let outcome: String = last.try_get("r_outcome")?;
            let outcome = match outcome.as_str() {
                "done" => Finished::Done(Box::new(branch(last)?)),
                "not_found" => Finished::NotFound,
                "gateway_run" => Finished::GatewayRun,
                "has_children" => Finished::HasActiveChildren,
                "not_active" => {
                    let status: String = last.try_get("status")?;
                    Finished::NotActive(
                        status.parse::<BranchStatus>().map_err(StoreError::Corrupt)?,
                    )
                }
                other => {
                    return Err(StoreError::Corrupt(format!("unknown end outcome {other:?}")));
                }
            };
            Ok(TreeEnd { outcome, children })
        })
        .await
}

pub(crate) async fn finish_batch(
    store: &SqlStore<Postgres>,
    batch: &[BatchFinish],
) -> Result<Vec<Branch>, StoreError> {
    store
        .timed("finish_batch", async {
            let tenants: Vec<&str> = batch.iter().map(|b| b.tenant.as_str()).collect();
            let ids: Vec<uuid::Uuid> = batch.iter().map(|b| b.id.as_uuid()).collect();
            let statuses: Vec<&str> = batch.iter().map(|b| b.finish.status.as_str()).collect();
            let reasons: Vec<Option<&str>> =
                batch.iter().map(|b| b.finish.reason.map(EndReason::as_str)).collect();
            let at: Vec<DateTime<Utc>> = batch.iter().map(|b| b.finish.at).collect();
            let results: Vec<Option<&str>> =
                batch.iter().map(|b| b.finish.result.as_deref()).collect();
            let result_tokens: Vec<i64> =
                batch.iter().map(|b| db_tokens(b.finish.result_tokens)).collect();
            let returned: Vec<Option<i64>> =
                batch.iter().map(|b| b.finish.returned_tokens.map(db_tokens)).collect();
            let extract: Vec<bool> = batch.iter().map(|b| b.finish.extract).collect();
            let touch_before: Vec<DateTime<Utc>> =
                batch.iter().map(|b| activity_stale_before(b.finish.at)).collect();
            let rows = run(|| {
                sqlx::query(FINISH_BATCH)
                    .bind(&tenants)
                    .bind(&ids)
                    .bind(&statuses)
                    .bind(&reasons)
                    .bind(&at)
                    .bind(&results)
                    .bind(&result_tokens)
                    .bind(&returned)
                    .bind(&extract)
                    .bind(&touch_before)
                    .bind(i32::try_from(COUNTER_STRIPES).unwrap_or(i32::MAX))
                    .fetch_all(&store.pool)
            })
            .await?;
            rows.iter().map(branch).collect()
        })
        .await
}

fn branch(row: &PgRow) -> Result<Branch, StoreError> {
    BranchRow::from_row(row)?.try_into()
}
