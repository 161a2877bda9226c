//! The statements and the [`Store`] implementation shared by both backends.
//!
//! Postgres and SQLite accept the same SQL here (numbered `$N` parameters,
//! `RETURNING`, `ON CONFLICT`, `FILTER`, recursive CTEs), except for row
//! locks: Postgres takes `FOR UPDATE` locks inside a transaction, while SQLite
//! transactions are `BEGIN IMMEDIATE` and so hold the database's one write
//! lock from the start. [`sql_backend!`] therefore writes everything once and
//! is instantiated per backend with its locking clauses.

/// How many rows each active-branch counter is split into: creations and
/// ends that run at the same time each lock one stripe, so up to this many
/// proceed without waiting for one another's commits.
pub(crate) const COUNTER_STRIPES: i64 = 16;

/// Implements [`Tx`] and [`Store`] for a backend. The backend module provides
/// `$Store` with a `pool` field, `in_tx`, `MIGRATOR`, and the imports used
/// here.
macro_rules! sql_backend {
    (
        store = $Store:ident,
        tx = $Tx:ident,
        db = $DB:ty,
        lock = $lock:literal,
        skip_locked = $skip_locked:literal $(,)?
    ) => {
        impl $Store {
            /// Runs `op` in a transaction and commits it if `op` succeeded
            /// and `keep` approves of the result (a refusal rolls back,
            /// writing nothing). A transaction the database aborted for a
            /// retryable reason (see the backend's `is_retryable`) is run
            /// again, up to `CONFLICT_RETRIES` times.
            async fn in_tx<R, F, Fut>(
                &self,
                keep: fn(&R) -> bool,
                mut op: F,
            ) -> Result<R, StoreError>
            where
                F: FnMut($Tx) -> Fut + Send,
                Fut: Future<Output = ($Tx, Result<R, StoreError>)> + Send,
                R: Send,
            {
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    let result = match self.begin().await {
                        Ok(tx) => {
                            let (tx, result) = op($Tx(tx)).await;
                            match result {
                                Ok(value) if keep(&value) => {
                                    tx.0.commit().await.map(|()| value).map_err(StoreError::from)
                                }
                                Ok(value) => {
                                    tx.0.rollback().await.map(|()| value).map_err(StoreError::from)
                                }
                                // Dropping the transaction rolls it back.
                                Err(e) => Err(e),
                            }
                        }
                        Err(e) => Err(StoreError::from(e)),
                    };
                    if !retry_after_conflict(attempt, &result) {
                        return result;
                    }
                }
            }
        }

        /// A transaction, with the statements of [`Tx`].
                pub(crate) struct $Tx(sqlx::Transaction<'static, $DB>);

        #[async_trait]
        impl Tx for $Tx {
            async fn insert_session_if_absent(
                &mut self,
                tenant: &TenantId,
                session: &SessionId,
                owner: &Subject,
                budget: Tokens,
                at: DateTime<Utc>,
            ) -> Result<(), StoreError> {
                sqlx::query(
                    "INSERT INTO sessions (tenant_id, session_id, owner_sub, status, budget, created_at, \
                     last_activity_at) VALUES ($1, $2, $3, 'open', $4, $5, $5) ON CONFLICT DO NOTHING",
                )
                .bind(tenant.as_str())
                .bind(session.as_str())
                .bind(owner.as_str())
                .bind(db_tokens(budget))
                .bind(Ts(at))
                .execute(&mut *self.0)
                .await?;
                Ok(())
            }

            async fn lock_session(
                &mut self,
                tenant: &TenantId,
                session: &SessionId,
            ) -> Result<Option<SessionRow>, StoreError> {
                Ok(sqlx::query_as(concat!(
                    "SELECT ",
                    session_columns!(),
                    " FROM sessions WHERE tenant_id = $1 AND session_id = $2",
                    $lock
                ))
                .bind(tenant.as_str())
                .bind(session.as_str())
                .fetch_optional(&mut *self.0)
                .await?)
            }

            async fn open_session(
                &mut self,
                tenant: &TenantId,
                session: &SessionId,
                budget: Tokens,
                at: DateTime<Utc>,
            ) -> Result<(), StoreError> {
                sqlx::query(
                    "UPDATE sessions SET status = 'open', budget = $3, used = 0, reserved = 0, \
                     ended_at = NULL, claimed_until = NULL, last_activity_at = $4 \
                     WHERE tenant_id = $1 AND session_id = $2",
                )
                .bind(tenant.as_str())
                .bind(session.as_str())
                .bind(db_tokens(budget))
                .bind(Ts(at))
                .execute(&mut *self.0)
                .await?;
                Ok(())
            }

            async fn lock_branch(
                &mut self,
                tenant: &TenantId,
                id: Uuid,
            ) -> Result<Option<BranchRow>, StoreError> {
                Ok(sqlx::query_as(concat!(
                    "SELECT ",
                    branch_columns!(),
                    " FROM branches WHERE tenant_id = $1 AND id = $2",
                    $lock
                ))
                .bind(tenant.as_str())
                .bind(id)
                .fetch_optional(&mut *self.0)
                .await?)
            }

            async fn active_branch_id(
                &mut self,
                tenant: &TenantId,
                session: &SessionId,
            ) -> Result<Option<Uuid>, StoreError> {
                Ok(sqlx::query_scalar(
                    "SELECT id FROM branches WHERE tenant_id = $1 AND session_id = $2 \
                     AND status = 'active' AND kind = 'agent' AND NOT EXISTS (SELECT 1 FROM branches c \
                     WHERE c.parent_id = branches.id AND c.status = 'active' AND c.kind = 'agent') ORDER BY created_at DESC, id DESC LIMIT 1",
                )
                .bind(tenant.as_str())
                .bind(session.as_str())
                .fetch_optional(&mut *self.0)
                .await?)
            }

            async fn session_load(
                &mut self,
                tenant: &TenantId,
                session: &SessionId,
                window_start: DateTime<Utc>,
            ) -> Result<SessionLoad, StoreError> {
                let (active, earliest_deadline, recent, oldest_recent): (
                    i64,
                    Option<DateTime<Utc>>,
                    i64,
                    Option<DateTime<Utc>>,
                ) = sqlx::query_as(
                    "SELECT count(*) FILTER (WHERE status = 'active'), \
                            min(deadline_at) FILTER (WHERE status = 'active'), \
                            count(*) FILTER (WHERE created_at > $3), \
                            min(created_at) FILTER (WHERE created_at > $3) \
                     FROM branches WHERE tenant_id = $1 AND session_id = $2 \
                     AND (status = 'active' OR created_at > $3)",
                )
                .bind(tenant.as_str())
                .bind(session.as_str())
                .bind(Ts(window_start))
                .fetch_one(&mut *self.0)
                .await?;
                Ok(SessionLoad { active, earliest_deadline, recent, oldest_recent })
            }

            async fn take_slot(
                &mut self,
                tenant: &TenantId,
                limits: &Limits,
            ) -> Result<Option<LimitKind>, StoreError> {
                let tenant_limit = i64::from(limits.max_active_per_tenant);
                if !self.take_stripe(&TENANT_COUNTER, Some(tenant.as_str()), tenant_limit).await? {
                    return Ok(Some(LimitKind::TenantActive));
                }
                let total_limit = i64::from(limits.max_active_total);
                if !self.take_stripe(&DEPLOYMENT_COUNTER, None, total_limit).await? {
                    return Ok(Some(LimitKind::DeploymentActive));
                }
                Ok(None)
            }

            async fn release_slots(&mut self, tenants: &[&TenantId]) -> Result<(), StoreError> {
                for tenant in tenants {
                    self.give_stripe(&TENANT_COUNTER, Some(tenant.as_str())).await?;
                }
                for _ in tenants {
                    self.give_stripe(&DEPLOYMENT_COUNTER, None).await?;
                }
                Ok(())
            }

            async fn lend(
                &mut self,
                tenant: &TenantId,
                session: &str,
                parent: Option<Uuid>,
                amount: i64,
            ) -> Result<(), StoreError> {
                let query = match parent {
                    Some(id) => sqlx::query(
                        "UPDATE branches SET reserved = reserved + $2 WHERE tenant_id = $1 AND id = $3",
                    )
                    .bind(tenant.as_str())
                    .bind(amount)
                    .bind(id),
                    None => sqlx::query(
                        "UPDATE sessions SET reserved = reserved + $2 \
                         WHERE tenant_id = $1 AND session_id = $3",
                    )
                    .bind(tenant.as_str())
                    .bind(amount)
                    .bind(session),
                };
                query.execute(&mut *self.0).await?;
                Ok(())
            }

            async fn settle(
                &mut self,
                tenant: &TenantId,
                session: &str,
                parent: Option<Uuid>,
                child_budget: i64,
                child_used: i64,
                at: DateTime<Utc>,
            ) -> Result<(), StoreError> {
                // What the child spent may carry the parent past 80% or to
                // its whole budget: record it as a charge would.
                let query = match parent {
                    Some(id) => sqlx::query(
                        "UPDATE branches SET reserved = reserved - $2, used = used + $3, \
                         warned_at = CASE WHEN warned_at IS NULL AND (used + $3) * 5 >= budget * 4 \
                             THEN $5 ELSE warned_at END, \
                         exhausted_at = CASE WHEN exhausted_at IS NULL AND used + $3 >= budget \
                             THEN $5 ELSE exhausted_at END \
                         WHERE tenant_id = $1 AND id = $4",
                    )
                    .bind(tenant.as_str())
                    .bind(child_budget)
                    .bind(child_used)
                    .bind(id)
                    .bind(Ts(at)),
                    None => sqlx::query(
                        "UPDATE sessions SET reserved = reserved - $2, used = used + $3 \
                         WHERE tenant_id = $1 AND session_id = $4",
                    )
                    .bind(tenant.as_str())
                    .bind(child_budget)
                    .bind(child_used)
                    .bind(session),
                };
                query.execute(&mut *self.0).await?;
                Ok(())
            }

            async fn insert_branch(&mut self, r: &BranchRow) -> Result<(), StoreError> {
                sqlx::query(concat!(
                    "INSERT INTO branches (",
                    branch_columns!(),
                    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
                     $17, $18, $19, $20, $21, $22)"
                ))
                .bind(r.id)
                .bind(&r.tenant_id)
                .bind(&r.session_id)
                .bind(&r.owner_sub)
                .bind(r.parent_id)
                .bind(r.depth)
                .bind(&r.description)
                .bind(&r.prompt)
                .bind(r.budget)
                .bind(r.used)
                .bind(r.reserved)
                .bind(&r.status)
                .bind(&r.reason)
                .bind(Ts(r.created_at))
                .bind(Ts(r.deadline_at))
                .bind(Ts::opt(r.completed_at))
                .bind(Ts::opt(r.warned_at))
                .bind(Ts::opt(r.exhausted_at))
                .bind(&r.result)
                .bind(&r.kind)
                .bind(&r.return_tier)
                .bind(r.returned_tokens)
                .execute(&mut *self.0)
                .await?;
                Ok(())
            }

            async fn insert_run(
                &mut self,
                tenant: &TenantId,
                branch: Uuid,
                run: &NewRun,
                at: DateTime<Utc>,
            ) -> Result<(), StoreError> {
                sqlx::query(
                    "INSERT INTO branch_runs (branch_id, tenant_id, model, tools, scopes, state, \
                     lease_owner, lease_until, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, $5, 'running', $6, $7, $8, $8)",
                )
                .bind(branch)
                .bind(tenant.as_str())
                .bind(&run.model)
                .bind(crate::runs::tools_json(&run.tools))
                .bind(run.scopes.join(" "))
                .bind(&run.lease_owner)
                .bind(Ts(run.lease_until))
                .bind(Ts(at))
                .execute(&mut *self.0)
                .await?;
                Ok(())
            }

            async fn end_branch(
                &mut self,
                tenant: &TenantId,
                id: Uuid,
                f: &Finish,
            ) -> Result<Option<BranchRow>, StoreError> {
                Ok(sqlx::query_as(concat!(
                    "UPDATE branches SET status = $3, reason = $4, completed_at = $5, result = $6, \
                     used = CASE WHEN used + $7 < budget THEN used + $7 ELSE budget END, claimed_until = NULL, \
                     returned_tokens = $8 \
                     WHERE tenant_id = $1 AND id = $2 AND status = 'active' AND reserved = 0 RETURNING ",
                    branch_columns!()
                ))
                .bind(tenant.as_str())
                .bind(id)
                .bind(f.status.as_str())
                .bind(f.reason.map(EndReason::as_str))
                .bind(Ts(f.at))
                .bind(&f.result)
                .bind(db_tokens(f.result_tokens))
                .bind(f.returned_tokens.map(db_tokens))
                .fetch_optional(&mut *self.0)
                .await?)
            }

            async fn record_consumption(
                &mut self,
                tenant: &TenantId,
                id: Uuid,
                used: i64,
                warned_at: Option<DateTime<Utc>>,
                exhausted_at: Option<DateTime<Utc>>,
            ) -> Result<(), StoreError> {
                sqlx::query(
                    "UPDATE branches SET used = $3, warned_at = COALESCE(warned_at, $4), \
                     exhausted_at = COALESCE(exhausted_at, $5) WHERE tenant_id = $1 AND id = $2",
                )
                .bind(tenant.as_str())
                .bind(id)
                .bind(used)
                .bind(Ts::opt(warned_at))
                .bind(Ts::opt(exhausted_at))
                .execute(&mut *self.0)
                .await?;
                Ok(())
            }

            async fn insert_call(
                &mut self,
                tenant: &TenantId,
                branch: Uuid,
                call: &CallRecord,
                charged: Tokens,
            ) -> Result<(), StoreError> {
                let query = sqlx::query(
                    "INSERT INTO branch_calls (id, tenant_id, branch_id, tokens_charged, upstream, \
                     tool, tokens_in, tokens_out, duration_ms, outcome, called_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                )
                .bind(Uuid::now_v7())
                .bind(tenant.as_str())
                .bind(branch)
                .bind(db_tokens(charged));
                bind_call(query, call)
                .execute(&mut *self.0)
                .await?;
                Ok(())
            }

            async fn touch_session(
                &mut self,
                tenant: &TenantId,
                session: &str,
                at: DateTime<Utc>,
            ) -> Result<(), StoreError> {
                touch_session(&mut *self.0, tenant, session, at).await
            }

            async fn lock_active_in_session(
                &mut self,
                tenant: &TenantId,
                session: &SessionId,
            ) -> Result<Vec<Uuid>, StoreError> {
                Ok(sqlx::query_scalar(concat!(
                    "SELECT id FROM branches WHERE tenant_id = $1 AND session_id = $2 \
                     AND status = 'active' ORDER BY depth DESC, id DESC",
                    $lock
                ))
                .bind(tenant.as_str())
                .bind(session.as_str())
                .fetch_all(&mut *self.0)
                .await?)
            }

            async fn session_exists(
                &mut self,
                tenant: &TenantId,
                session: &SessionId,
            ) -> Result<bool, StoreError> {
                let found: Option<i32> = sqlx::query_scalar(
                    "SELECT 1 FROM sessions WHERE tenant_id = $1 AND session_id = $2",
                )
                .bind(tenant.as_str())
                .bind(session.as_str())
                .fetch_optional(&mut *self.0)
                .await?;
                Ok(found.is_some())
            }
        }

        impl $Tx {
            /// Takes one slot of a striped counter (see the third migration):
            /// first in any stripe with room that no other transaction holds,
            /// else in each stripe in turn, waiting for its lock. `false`
            /// when every stripe is full, that is when the counter reached
            /// `limit`.
            async fn take_stripe(
                &mut self,
                counter: &CounterSql,
                key: Option<&str>,
                limit: i64,
            ) -> Result<bool, StoreError> {
                let mut free = sqlx::query(counter.take_free);
                if let Some(key) = key {
                    free = free.bind(key);
                }
                let taken = free.bind(limit).bind($crate::sql::COUNTER_STRIPES).execute(&mut *self.0).await?;
                if taken.rows_affected() == 1 {
                    return Ok(true);
                }
                // Stripes from `limit` on have no room when the limit is
                // below the number of stripes.
                for stripe in 0..$crate::sql::COUNTER_STRIPES.min(limit) {
                    let mut one = sqlx::query(counter.take_in);
                    if let Some(key) = key {
                        one = one.bind(key);
                    }
                    let one = one.bind(limit).bind($crate::sql::COUNTER_STRIPES).bind(stripe);
                    if one.execute(&mut *self.0).await?.rows_affected() == 1 {
                        return Ok(true);
                    }
                }
                Ok(false)
            }

            /// Gives one slot back to a striped counter, in any stripe above
            /// zero.
            async fn give_stripe(
                &mut self,
                counter: &CounterSql,
                key: Option<&str>,
            ) -> Result<(), StoreError> {
                let mut free = sqlx::query(counter.give_free);
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
                    for stripe in 0..$crate::sql::COUNTER_STRIPES {
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
        struct CounterSql {
            take_free: &'static str,
            take_in: &'static str,
            give_free: &'static str,
            give_in: &'static str,
        }

        const TENANT_COUNTER: CounterSql = CounterSql {
            take_free: concat!(
                "UPDATE tenant_usage SET active_branches = active_branches + 1 \
                 WHERE tenant_id = $1 AND stripe = (SELECT stripe FROM tenant_usage \
                 WHERE tenant_id = $1 \
                 AND active_branches < $2 / $3 + CASE WHEN stripe < $2 % $3 THEN 1 ELSE 0 END \
                 ORDER BY random() LIMIT 1",
                $skip_locked,
                ")"
            ),
            take_in: "INSERT INTO tenant_usage (tenant_id, stripe, active_branches) VALUES ($1, $4, 1) \
                 ON CONFLICT (tenant_id, stripe) DO UPDATE \
                 SET active_branches = tenant_usage.active_branches + 1 \
                 WHERE tenant_usage.active_branches \
                 < $2 / $3 + CASE WHEN tenant_usage.stripe < $2 % $3 THEN 1 ELSE 0 END",
            give_free: concat!(
                "UPDATE tenant_usage SET active_branches = active_branches - 1 \
                 WHERE tenant_id = $1 AND stripe = (SELECT stripe FROM tenant_usage \
                 WHERE tenant_id = $1 AND active_branches > 0 ORDER BY random() LIMIT 1",
                $skip_locked,
                ")"
            ),
            give_in: "UPDATE tenant_usage SET active_branches = active_branches - 1 \
                 WHERE tenant_id = $1 AND stripe = $2 AND active_branches > 0",
        };

        const DEPLOYMENT_COUNTER: CounterSql = CounterSql {
            take_free: concat!(
                "UPDATE deployment_usage SET active_branches = active_branches + 1 \
                 WHERE stripe = (SELECT stripe FROM deployment_usage \
                 WHERE active_branches < $1 / $2 + CASE WHEN stripe < $1 % $2 THEN 1 ELSE 0 END \
                 ORDER BY random() LIMIT 1",
                $skip_locked,
                ")"
            ),
            take_in: "INSERT INTO deployment_usage (stripe, active_branches) VALUES ($3, 1) \
                 ON CONFLICT (stripe) DO UPDATE \
                 SET active_branches = deployment_usage.active_branches + 1 \
                 WHERE deployment_usage.active_branches \
                 < $1 / $2 + CASE WHEN deployment_usage.stripe < $1 % $2 THEN 1 ELSE 0 END",
            give_free: concat!(
                "UPDATE deployment_usage SET active_branches = active_branches - 1 \
                 WHERE stripe = (SELECT stripe FROM deployment_usage \
                 WHERE active_branches > 0 ORDER BY random() LIMIT 1",
                $skip_locked,
                ")"
            ),
            give_in: "UPDATE deployment_usage SET active_branches = active_branches - 1 \
                 WHERE stripe = $1 AND active_branches > 0",
        };

        /// Whether the `attempt`th run of a transaction (or of a statement
        /// that is one) should be followed by another: the database aborted
        /// it for a retryable reason (see the backend's `is_retryable`), and
        /// it has run fewer than `CONFLICT_RETRIES` times. An aborted run
        /// wrote nothing.
        fn retry_after_conflict<R>(attempt: usize, result: &Result<R, StoreError>) -> bool {
            let retry = attempt < CONFLICT_RETRIES
                && matches!(result, Err(StoreError::Database(e)) if is_retryable(e));
            if retry {
                tracing::debug!(attempt, "retrying after a conflict");
            }
            retry
        }

        /// Binds a trace line's columns from `upstream` to `called_at` (all
        /// but its id, tenant, branch and charge), in the order of the
        /// `branch_calls` inserts.
        fn bind_call<'q>(
            query: sqlx::query::Query<'q, $DB, <$DB as sqlx::Database>::Arguments>,
            call: &'q CallRecord,
        ) -> sqlx::query::Query<'q, $DB, <$DB as sqlx::Database>::Arguments> {
            query
                .bind(&call.upstream)
                .bind(&call.tool)
                .bind(db_tokens(call.tokens_in))
                .bind(db_tokens(call.tokens_out))
                .bind(i64::try_from(call.duration.as_millis()).unwrap_or(i64::MAX))
                .bind(call.outcome.as_str())
                .bind(Ts(call.at))
        }

        async fn touch_session<'c>(
            ex: impl sqlx::Executor<'c, Database = $DB>,
            tenant: &TenantId,
            session: &str,
            at: DateTime<Utc>,
        ) -> Result<(), StoreError> {
            sqlx::query(
                "UPDATE sessions SET last_activity_at = $3 \
                 WHERE tenant_id = $1 AND session_id = $2 AND last_activity_at < $4",
            )
            .bind(tenant.as_str())
            .bind(session)
            .bind(Ts(at))
            .bind(Ts(crate::activity_stale_before(at)))
            .execute(ex)
            .await?;
            Ok(())
        }

        async fn active_in_session<'c>(
            ex: impl sqlx::Executor<'c, Database = $DB>,
            tenant: &TenantId,
            session: &SessionId,
        ) -> Result<Vec<Uuid>, StoreError> {
            Ok(sqlx::query_scalar(
                "SELECT id FROM branches WHERE tenant_id = $1 AND session_id = $2 AND status = 'active' \
                 ORDER BY depth DESC, id DESC",
            )
            .bind(tenant.as_str())
            .bind(session.as_str())
            .fetch_all(ex)
            .await?)
        }

        fn lease_end(now: DateTime<Utc>, lease: Duration) -> DateTime<Utc> {
            chrono::Duration::from_std(lease)
                .ok()
                .and_then(|lease| now.checked_add_signed(lease))
                .unwrap_or(DateTime::<Utc>::MAX_UTC)
        }

        #[async_trait]
        impl Store for $Store {
            async fn create_branch(
                &self,
                tenant: &TenantId,
                new: NewBranch,
            ) -> Result<Result<Branch, CreateRefusal>, StoreError> {
                // A refusal writes nothing: even the session insert is rolled back.
                self.in_tx(Result::is_ok, |mut tx| {
                    let new = &new;
                    async move {
                        let result = ops::create(&mut tx, tenant, new).await;
                        (tx, result)
                    }
                })
                .await
            }

            async fn branch(&self, tenant: &TenantId, id: BranchId) -> Result<Option<Branch>, StoreError> {
                let row: Option<BranchRow> = sqlx::query_as(concat!(
                    "SELECT ",
                    branch_columns!(),
                    " FROM branches WHERE tenant_id = $1 AND id = $2"
                ))
                .bind(tenant.as_str())
                .bind(id.as_uuid())
                .fetch_optional(&self.pool)
                .await?;
                row.map(Branch::try_from).transpose()
            }

            async fn session(
                &self,
                tenant: &TenantId,
                id: &SessionId,
            ) -> Result<Option<Session>, StoreError> {
                let row: Option<SessionRow> = sqlx::query_as(concat!(
                    "SELECT ",
                    session_columns!(),
                    " FROM sessions WHERE tenant_id = $1 AND session_id = $2"
                ))
                .bind(tenant.as_str())
                .bind(id.as_str())
                .fetch_optional(&self.pool)
                .await?;
                row.map(Session::try_from).transpose()
            }

            async fn active_branch(
                &self,
                tenant: &TenantId,
                session: &SessionId,
            ) -> Result<Option<Branch>, StoreError> {
                let row: Option<BranchRow> = sqlx::query_as(concat!(
                    "SELECT ",
                    branch_columns!(),
                    " FROM branches WHERE tenant_id = $1 AND session_id = $2 \
                      AND status = 'active' AND kind = 'agent' AND NOT EXISTS (SELECT 1 FROM branches c \
                     WHERE c.parent_id = branches.id AND c.status = 'active' AND c.kind = 'agent') ORDER BY created_at DESC, id DESC LIMIT 1"
                ))
                .bind(tenant.as_str())
                .bind(session.as_str())
                .fetch_optional(&self.pool)
                .await?;
                row.map(Branch::try_from).transpose()
            }

            async fn active_descendants(
                &self,
                tenant: &TenantId,
                id: BranchId,
            ) -> Result<Vec<BranchId>, StoreError> {
                let ids: Vec<Uuid> = sqlx::query_scalar(
                    "WITH RECURSIVE tree (id, depth) AS ( \
                        SELECT id, depth FROM branches \
                        WHERE tenant_id = $1 AND parent_id = $2 AND status = 'active' \
                        UNION ALL \
                        SELECT b.id, b.depth FROM branches b JOIN tree t ON b.parent_id = t.id \
                        WHERE b.tenant_id = $1 AND b.status = 'active' \
                     ) SELECT id FROM tree ORDER BY depth DESC, id DESC",
                )
                .bind(tenant.as_str())
                .bind(id.as_uuid())
                .fetch_all(&self.pool)
                .await?;
                Ok(ids.into_iter().map(BranchId::from_uuid).collect())
            }

            async fn active_in_session(
                &self,
                tenant: &TenantId,
                session: &SessionId,
            ) -> Result<Vec<BranchId>, StoreError> {
                let ids = active_in_session(&self.pool, tenant, session).await?;
                Ok(ids.into_iter().map(BranchId::from_uuid).collect())
            }

            async fn consume(
                &self,
                tenant: &TenantId,
                id: BranchId,
                tokens: Tokens,
                at: DateTime<Utc>,
            ) -> Result<Option<Consumption>, StoreError> {
                self.in_tx(|_| true, |mut tx| async move {
                    let result = ops::consume(&mut tx, tenant, id, tokens, at).await;
                    (tx, result)
                })
                .await
            }

            async fn meter_call(
                &self,
                tenant: &TenantId,
                id: BranchId,
                call: &CallRecord,
            ) -> Result<Option<Consumption>, StoreError> {
                self.meter(tenant, id, call).await
            }

            async fn call_summary(
                &self,
                tenant: &TenantId,
                id: BranchId,
            ) -> Result<CallSummary, StoreError> {
                let rows: Vec<(String, String, i64, i64, i64, i64, i64, i64, Option<DateTime<Utc>>)> =
                    sqlx::query_as(
                        "SELECT upstream, tool, count(*), CAST(sum(tokens_in) AS BIGINT), CAST(sum(tokens_out) AS BIGINT), \
                         CAST(sum(tokens_charged) AS BIGINT), \
                         count(*) FILTER (WHERE outcome IN ('tool_error', 'upstream_error', 'refused')), \
                         count(*) FILTER (WHERE outcome = 'truncated'), max(called_at) \
                         FROM branch_calls WHERE tenant_id = $1 AND branch_id = $2 \
                         GROUP BY upstream, tool ORDER BY sum(tokens_charged) DESC, upstream, tool",
                    )
                    .bind(tenant.as_str())
                    .bind(id.as_uuid())
                    .fetch_all(&self.pool)
                    .await?;
                let mut summary = CallSummary::default();
                for (upstream, tool, calls, tin, tout, charged, errors, truncated, last) in rows {
                    let n = |v: i64| u64::try_from(v).unwrap_or(0);
                    summary.calls += n(calls);
                    summary.tokens_in += n(tin);
                    summary.tokens_out += n(tout);
                    summary.tokens_charged += n(charged);
                    summary.errors += n(errors);
                    summary.truncated += n(truncated);
                    summary.last_call_at = summary.last_call_at.max(last);
                    summary.by_tool.push(ToolCalls { upstream, tool, calls: n(calls), tokens: n(charged) });
                }
                Ok(summary)
            }

            async fn open_sessions_of(
                &self,
                tenant: &TenantId,
                owner: &Subject,
                limit: u32,
            ) -> Result<Vec<SessionId>, StoreError> {
                let ids: Vec<String> = sqlx::query_scalar(
                    "SELECT session_id FROM sessions \
                     WHERE tenant_id = $1 AND owner_sub = $2 AND status = 'open' \
                     ORDER BY last_activity_at DESC LIMIT $3",
                )
                .bind(tenant.as_str())
                .bind(owner.as_str())
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
                ids.iter()
                    .map(|id| SessionId::parse(id).map_err(|e| StoreError::Corrupt(e.to_string())))
                    .collect()
            }

            async fn add_outside_usage(
                &self,
                tenant: &TenantId,
                session: Option<&SessionId>,
                usage: OutsideUsage,
                at: DateTime<Utc>,
            ) -> Result<(), StoreError> {
                sqlx::query(
                    "INSERT INTO usage_outside_branches \
                     (tenant_id, session_id, calls, tokens_in, tokens_out, updated_at) \
                     VALUES ($1, $2, $3, $4, $5, $6) \
                     ON CONFLICT (tenant_id, session_id) DO UPDATE SET \
                     calls = usage_outside_branches.calls + excluded.calls, \
                     tokens_in = usage_outside_branches.tokens_in + excluded.tokens_in, \
                     tokens_out = usage_outside_branches.tokens_out + excluded.tokens_out, \
                     updated_at = excluded.updated_at",
                )
                .bind(tenant.as_str())
                .bind(session.map_or("", SessionId::as_str))
                .bind(db_tokens(usage.calls))
                .bind(db_tokens(usage.tokens_in))
                .bind(db_tokens(usage.tokens_out))
                .bind(Ts(at))
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn outside_usage(
                &self,
                tenant: &TenantId,
                session: Option<&SessionId>,
            ) -> Result<OutsideUsage, StoreError> {
                let row: Option<(i64, i64, i64)> = sqlx::query_as(
                    "SELECT calls, tokens_in, tokens_out FROM usage_outside_branches \
                     WHERE tenant_id = $1 AND session_id = $2",
                )
                .bind(tenant.as_str())
                .bind(session.map_or("", SessionId::as_str))
                .fetch_optional(&self.pool)
                .await?;
                let n = |v: i64| u64::try_from(v).unwrap_or(0);
                Ok(row.map_or_else(OutsideUsage::default, |(calls, tin, tout)| OutsideUsage {
                    calls: n(calls),
                    tokens_in: n(tin),
                    tokens_out: n(tout),
                }))
            }

            async fn finish(
                &self,
                tenant: &TenantId,
                id: BranchId,
                finish: Finish,
            ) -> Result<Finished, StoreError> {
                self.in_tx(|_| true, |mut tx| {
                    let finish = &finish;
                    async move {
                        let result = ops::finish(&mut tx, tenant, id, finish).await;
                        (tx, result)
                    }
                })
                .await
            }

            async fn finish_batch(&self, batch: &[BatchFinish]) -> Result<Vec<Branch>, StoreError> {
                self.in_tx(|_| true, |mut tx| async move {
                    let result = ops::finish_batch(&mut tx, batch).await;
                    (tx, result)
                })
                .await
            }

            async fn end_session(
                &self,
                tenant: &TenantId,
                id: &SessionId,
                at: DateTime<Utc>,
                idle_since: Option<DateTime<Utc>>,
            ) -> Result<bool, StoreError> {
                let done = sqlx::query(
                    "UPDATE sessions SET status = 'ended', ended_at = $3, claimed_until = NULL \
                     WHERE tenant_id = $1 AND session_id = $2 AND status = 'open' AND reserved = 0 \
                     AND ($4 IS NULL OR last_activity_at <= $4)",
                )
                .bind(tenant.as_str())
                .bind(id.as_str())
                .bind(Ts(at))
                .bind(Ts::opt(idle_since.map(crate::activity_stale_before)))
                .execute(&self.pool)
                .await?
                .rows_affected();
                Ok(done == 1)
            }

            async fn fail_session_branches(
                &self,
                tenant: &TenantId,
                id: &SessionId,
                at: DateTime<Utc>,
            ) -> Result<u64, StoreError> {
                self.in_tx(|_| true, |mut tx| async move {
                    let result = ops::fail_session_branches(&mut tx, tenant, id, at).await;
                    (tx, result)
                })
                .await
            }

            async fn touch_session(
                &self,
                tenant: &TenantId,
                id: &SessionId,
                at: DateTime<Utc>,
            ) -> Result<(), StoreError> {
                touch_session(&self.pool, tenant, id.as_str(), at).await
            }

            async fn claim_due_branches(
                &self,
                now: DateTime<Utc>,
                lease: Duration,
                limit: u32,
            ) -> Result<Vec<DueBranch>, StoreError> {
                let rows: Vec<(String, Uuid, i32, bool)> = sqlx::query_as(concat!(
                    "UPDATE branches SET claimed_until = $2 WHERE id IN ( \
                        SELECT id FROM branches WHERE status = 'active' \
                        AND (deadline_at <= $1 OR exhausted_at IS NOT NULL) \
                        AND (claimed_until IS NULL OR claimed_until <= $1) \
                        ORDER BY depth DESC, deadline_at LIMIT $3",
                    $skip_locked,
                    ") RETURNING tenant_id, id, depth, exhausted_at IS NOT NULL"
                ))
                .bind(Ts(now))
                .bind(Ts(lease_end(now, lease)))
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
                rows.into_iter().map(|(t, id, depth, exhausted)| due_branch(t, id, depth, exhausted)).collect()
            }

            async fn claim_idle_sessions(
                &self,
                idle_since: DateTime<Utc>,
                now: DateTime<Utc>,
                lease: Duration,
                limit: u32,
            ) -> Result<Vec<IdleSession>, StoreError> {
                let rows: Vec<(String, String)> = sqlx::query_as(concat!(
                    "UPDATE sessions SET claimed_until = $3 WHERE (tenant_id, session_id) IN ( \
                        SELECT tenant_id, session_id FROM sessions WHERE status = 'open' \
                        AND reserved = 0 AND last_activity_at <= $1 AND (claimed_until IS NULL OR claimed_until <= $2) \
                        ORDER BY last_activity_at LIMIT $4",
                    $skip_locked,
                    ") RETURNING tenant_id, session_id"
                ))
                .bind(Ts(crate::activity_stale_before(idle_since)))
                .bind(Ts(now))
                .bind(Ts(lease_end(now, lease)))
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
                rows.into_iter().map(|(t, id)| idle_session(&t, &id)).collect()
            }

            async fn next_deadline(
                &self,
                now: DateTime<Utc>,
            ) -> Result<Option<DateTime<Utc>>, StoreError> {
                // Branches claimed by a replica are its business until the
                // lease runs out.
                Ok(sqlx::query_scalar(
                    "SELECT min(deadline_at) FROM branches WHERE status = 'active' \
                     AND (claimed_until IS NULL OR claimed_until <= $1)",
                )
                .bind(Ts(now))
                .fetch_one(&self.pool)
                .await?)
            }

            async fn run(&self, tenant: &TenantId, id: BranchId) -> Result<Option<Run>, StoreError> {
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
            }

            async fn run_steps(
                &self,
                tenant: &TenantId,
                id: BranchId,
            ) -> Result<Vec<RunStep>, StoreError> {
                let rows: Vec<StepRow> = sqlx::query_as(
                    "SELECT seq, kind, body, input_tokens, output_tokens, duration_ms, repeated, at \
                     FROM run_steps WHERE tenant_id = $1 AND branch_id = $2 ORDER BY seq",
                )
                .bind(tenant.as_str())
                .bind(id.as_uuid())
                .fetch_all(&self.pool)
                .await?;
                rows.into_iter().map(RunStep::try_from).collect()
            }

            async fn record_step(
                &self,
                tenant: &TenantId,
                id: BranchId,
                owner: &str,
                step: &NewStep,
            ) -> Result<StepWritten, StoreError> {
                // Nothing is written unless the step is the holder's next.
                self.in_tx(|w| matches!(w, StepWritten::Written(_)), |mut tx| async move {
                    let result = async {
                        let held: Option<(i32, Option<String>, String)> = sqlx::query_as(concat!(
                            "SELECT steps, lease_owner, state FROM branch_runs \
                             WHERE tenant_id = $1 AND branch_id = $2",
                            $lock
                        ))
                        .bind(tenant.as_str())
                        .bind(id.as_uuid())
                        .fetch_optional(&mut *tx.0)
                        .await?;
                        let Some((steps, lease_owner, state)) = held else {
                            return Ok(StepWritten::NotOwner);
                        };
                        let next = u32::try_from(steps).ok() == Some(step.seq);
                        if !next || lease_owner.as_deref() != Some(owner) || state != RunState::Running.as_str() {
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
                })
                .await
            }

            async fn renew_run_lease(
                &self,
                tenant: &TenantId,
                id: BranchId,
                owner: &str,
                until: DateTime<Utc>,
            ) -> Result<bool, StoreError> {
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
            }

            async fn finish_run(
                &self,
                tenant: &TenantId,
                id: BranchId,
                owner: &str,
                outcome: &str,
                returned_tokens: Tokens,
                at: DateTime<Utc>,
            ) -> Result<bool, StoreError> {
                self.in_tx(|done| *done, |mut tx| async move {
                    let result = async {
                        let done = sqlx::query(
                            "UPDATE branch_runs SET state = 'done', outcome = $4, lease_owner = NULL, \
                             lease_until = NULL, updated_at = $5 \
                             WHERE tenant_id = $1 AND branch_id = $2 AND lease_owner = $3 AND state = 'running'",
                        )
                        .bind(tenant.as_str())
                        .bind(id.as_uuid())
                        .bind(owner)
                        .bind(outcome)
                        .bind(Ts(at))
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

            async fn claim_lapsed_runs(
                &self,
                owner: &str,
                now: DateTime<Utc>,
                until: DateTime<Utc>,
                limit: u32,
            ) -> Result<Vec<(TenantId, BranchId)>, StoreError> {
                let rows: Vec<(String, Uuid)> = sqlx::query_as(concat!(
                    "UPDATE branch_runs SET lease_owner = $1, lease_until = $3, resumes = resumes + 1, \
                     updated_at = $2 WHERE branch_id IN ( \
                        SELECT branch_id FROM branch_runs WHERE state = 'running' \
                        AND (lease_until IS NULL OR lease_until <= $2) \
                        ORDER BY lease_until LIMIT $4",
                    $skip_locked,
                    ") RETURNING tenant_id, branch_id"
                ))
                .bind(owner)
                .bind(Ts(now))
                .bind(Ts(until))
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
                rows.into_iter()
                    .map(|(t, id)| {
                        let tenant = TenantId::parse(&t).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                        Ok((tenant, BranchId::from_uuid(id)))
                    })
                    .collect()
            }

            async fn ended_runs(&self, owner: &str) -> Result<Vec<BranchId>, StoreError> {
                let ids: Vec<Uuid> = sqlx::query_scalar(
                    "SELECT r.branch_id FROM branch_runs r JOIN branches b ON b.id = r.branch_id \
                     WHERE r.lease_owner = $1 AND r.state = 'running' AND b.status <> 'active'",
                )
                .bind(owner)
                .fetch_all(&self.pool)
                .await?;
                Ok(ids.into_iter().map(BranchId::from_uuid).collect())
            }

            async fn model_usage(
                &self,
                tenant: &TenantId,
            ) -> Result<Vec<(String, ModelUsage)>, StoreError> {
                let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
                    "SELECT model, CAST(SUM(model_calls) AS BIGINT), CAST(SUM(input_tokens) AS BIGINT), \
                     CAST(SUM(output_tokens) AS BIGINT) FROM branch_runs WHERE tenant_id = $1 \
                     GROUP BY model ORDER BY model",
                )
                .bind(tenant.as_str())
                .fetch_all(&self.pool)
                .await?;
                rows.into_iter()
                    .map(|(model, calls, input, output)| {
                        Ok((model, ModelUsage {
                            calls: u64::try_from(calls).unwrap_or(0),
                            input_tokens: crate::record::tokens(input)?,
                            output_tokens: crate::record::tokens(output)?,
                        }))
                    })
                    .collect()
            }

            async fn session_returned_tokens(
                &self,
                tenant: &TenantId,
                session: &SessionId,
            ) -> Result<Tokens, StoreError> {
                let total: Option<i64> = sqlx::query_scalar(
                    "SELECT CAST(SUM(returned_tokens) AS BIGINT) FROM branches \
                     WHERE tenant_id = $1 AND session_id = $2 AND depth = 1",
                )
                .bind(tenant.as_str())
                .bind(session.as_str())
                .fetch_one(&self.pool)
                .await?;
                crate::record::tokens(total.unwrap_or(0))
            }

            async fn active_branches(&self) -> Result<Vec<(TenantId, u64)>, StoreError> {
                let rows: Vec<(String, i64)> = sqlx::query_as(
                    "SELECT tenant_id, CAST(SUM(active_branches) AS BIGINT) FROM tenant_usage \
                     GROUP BY tenant_id ORDER BY tenant_id",
                )
                .fetch_all(&self.pool)
                .await?;
                rows.into_iter()
                    .map(|(tenant, active)| {
                        let tenant = TenantId::parse(&tenant)
                            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                        Ok((tenant, u64::try_from(active).unwrap_or(0)))
                    })
                    .collect()
            }

            fn pool_usage(&self) -> $crate::PoolUsage {
                $crate::PoolUsage {
                    size: self.pool.size(),
                    idle: u32::try_from(self.pool.num_idle()).unwrap_or(u32::MAX),
                    max: self.pool.options().get_max_connections(),
                }
            }

            async fn ready(&self) -> Result<(), StoreError> {
                let applied: Option<i64> = sqlx::query_scalar(
                    "SELECT max(version) FROM _sqlx_migrations WHERE success",
                )
                .fetch_one(&self.pool)
                .await?;
                check_migrated(&MIGRATOR, applied)
            }

            async fn close(&self) {
                self.pool.close().await;
            }
        }
    };
}

pub(crate) use sql_backend;
