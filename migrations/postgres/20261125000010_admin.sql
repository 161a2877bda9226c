-- Operating the gateway through the admin API.
--
-- An operator may end a branch: it ends as `failed` with the reason
-- `ended_by_operator`. The constraint is replaced without a long lock: the
-- new one is added NOT VALID (no scan while it is taken) and then validated,
-- which scans the table under a lock that lets reads and writes go on.
ALTER TABLE branches DROP CONSTRAINT branches_reason_check;
ALTER TABLE branches ADD CONSTRAINT branches_reason_check
    CHECK (reason IN ('reported_failure', 'deadline_exceeded', 'budget_exhausted',
                      'parent_returning', 'session_ended', 'ended_by_operator')) NOT VALID;
ALTER TABLE branches VALIDATE CONSTRAINT branches_reason_check;

-- Every change made through the admin API: who (the token's tenant and
-- subject), what (an action on a target, with its details as JSON) and
-- when. Written before the change is made, so that an attempt that then
-- fails is on record too. Read newest first, for the deployment or for one
-- tenant.
CREATE TABLE audit_log (
    -- UUIDv7: rows sort by time.
    id           UUID        PRIMARY KEY,
    at           TIMESTAMPTZ NOT NULL,
    actor_tenant TEXT        NOT NULL,
    actor_sub    TEXT        NOT NULL,
    -- The tenant whose resource was changed; NULL for a change to the whole
    -- deployment.
    tenant_id    TEXT,
    -- What was done, as `<resource>.<verb>` (`branch.end`, `session.end`).
    action       TEXT        NOT NULL,
    -- What it was done to (a branch or session id, a name).
    target       TEXT        NOT NULL,
    -- The request's details, as a JSON object.
    detail       TEXT        NOT NULL
);

CREATE INDEX audit_log_by_time ON audit_log (at);
CREATE INDEX audit_log_by_tenant ON audit_log (tenant_id, at);

-- Each tenant's overrides of the deployment's folding settings (limits,
-- budgets, allowed models and upstreams, token quotas), as a JSON object
-- whose fields are those of the admin API's `PUT …/limits`; absent fields
-- keep the deployment's setting. Every replica reads the table every few
-- seconds, so a change applies everywhere without a restart.
CREATE TABLE tenant_settings (
    tenant_id         TEXT        PRIMARY KEY,
    settings          TEXT        NOT NULL,
    updated_at        TIMESTAMPTZ NOT NULL,
    updated_by_tenant TEXT        NOT NULL,
    updated_by_sub    TEXT        NOT NULL
);

-- What each tenant used, per UTC day (`YYYY-MM-DD`), kept apart from the
-- detail (branches, call traces, run steps) so that it outlives their
-- retention. Each replica adds what it counted every second or so, so a
-- crash loses at most that much. `kind`: `branch_call` and `outside_call`
-- (upstream calls inside and outside branches, by upstream: calls, tokens of
-- the arguments in, of the results out), `model` (model calls of gateway-run
-- branches, by model: calls, input and output tokens billed), `return`
-- (depth-1 branches that returned, `name` empty: how many, the tokens they
-- spent in, the tokens of their findings out).
CREATE TABLE usage_daily (
    tenant_id  TEXT   NOT NULL,
    day        TEXT   NOT NULL,
    kind       TEXT   NOT NULL CHECK (kind IN ('branch_call', 'outside_call', 'model', 'return')),
    name       TEXT   NOT NULL,
    calls      BIGINT NOT NULL CHECK (calls >= 0),
    tokens_in  BIGINT NOT NULL CHECK (tokens_in >= 0),
    tokens_out BIGINT NOT NULL CHECK (tokens_out >= 0),
    PRIMARY KEY (tenant_id, day, kind, name)
);

-- Retention deletes what ended long ago, oldest first: depth-1 branches by
-- when they ended (each with its tree), and ended sessions.
CREATE INDEX branches_ended_roots ON branches (completed_at) WHERE parent_id IS NULL;
CREATE INDEX sessions_ended ON sessions (ended_at) WHERE status = 'ended';
