-- The folding schema: sessions, their branch trees, and the counters that
-- enforce concurrency limits across replicas.
--
-- Token pools: every pool (a session's root pool, or a branch) has a `budget`,
-- what it has `used` (its own spending plus what its ended children spent),
-- and what it has `reserved` (lent to children still active). A branch's
-- budget is lent from its parent at creation; when the branch ends the loan
-- is released and its `used` is added to the parent's, which refunds the
-- unspent part. `reserved = 0` exactly when a pool has no active child.

CREATE TABLE sessions (
    tenant_id        TEXT        NOT NULL,
    -- Chosen by the client; unique within a tenant.
    session_id       TEXT        NOT NULL,
    -- The `sub` of the principal that opened the session; nobody else sees it.
    owner_sub        TEXT        NOT NULL,
    status           TEXT        NOT NULL CHECK (status IN ('open', 'ended')),
    budget           BIGINT      NOT NULL CHECK (budget >= 0),
    used             BIGINT      NOT NULL DEFAULT 0 CHECK (used >= 0),
    reserved         BIGINT      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    created_at       TIMESTAMPTZ NOT NULL,
    last_activity_at TIMESTAMPTZ NOT NULL,
    ended_at         TIMESTAMPTZ,
    -- Set while a supervisor replica is ending the session for being idle,
    -- so that other replicas leave it alone.
    claimed_until    TIMESTAMPTZ,
    PRIMARY KEY (tenant_id, session_id),
    CHECK (used + reserved <= budget)
);

-- The idle-session reconciler scans open sessions by last activity.
CREATE INDEX sessions_open_by_activity ON sessions (last_activity_at) WHERE status = 'open';

CREATE TABLE branches (
    -- UUIDv7, shown to clients as `br_<uuid>`.
    id            UUID        PRIMARY KEY,
    tenant_id     TEXT        NOT NULL,
    session_id    TEXT        NOT NULL,
    owner_sub     TEXT        NOT NULL,
    -- NULL for depth-1 branches, whose parent is the session's root pool.
    parent_id     UUID        REFERENCES branches (id),
    depth         INTEGER     NOT NULL CHECK (depth >= 1),
    description   TEXT        NOT NULL,
    prompt        TEXT        NOT NULL,
    budget        BIGINT      NOT NULL CHECK (budget >= 0),
    used          BIGINT      NOT NULL CHECK (used >= 0),
    reserved      BIGINT      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    status        TEXT        NOT NULL
                  CHECK (status IN ('created', 'active', 'completed', 'timeout', 'failed')),
    reason        TEXT
                  CHECK (reason IN ('reported_failure', 'deadline_exceeded', 'budget_exhausted',
                                    'parent_returning', 'session_ended')),
    created_at    TIMESTAMPTZ NOT NULL,
    deadline_at   TIMESTAMPTZ NOT NULL,
    completed_at  TIMESTAMPTZ,
    -- When spending first crossed 80% of the budget (the warning is given once).
    warned_at     TIMESTAMPTZ,
    -- When spending reached the budget. The forced return follows at once;
    -- if the process stopped in between, the supervisor finishes the job.
    exhausted_at  TIMESTAMPTZ,
    -- Set while a supervisor replica is force-returning the branch.
    claimed_until TIMESTAMPTZ,
    -- The scrubbed return message. Never holds unscrubbed text.
    result        TEXT,
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, session_id),
    CHECK (used + reserved <= budget),
    CHECK ((status IN ('created', 'active')) = (completed_at IS NULL))
);

-- A session's branches by creation time: the active branch, the creation-rate
-- window, and listing.
CREATE INDEX branches_by_session ON branches (tenant_id, session_id, created_at);
-- Children of a branch, for cleanup before a return.
CREATE INDEX branches_by_parent ON branches (parent_id) WHERE status = 'active';
-- Deadlines still to fire, for the supervisor.
CREATE INDEX branches_due ON branches (deadline_at) WHERE status = 'active';
CREATE INDEX branches_exhausted ON branches (exhausted_at) WHERE status = 'active' AND exhausted_at IS NOT NULL;

-- Active branches per tenant, maintained in the same transaction as every
-- branch that becomes or stops being active, so that the per-tenant limit
-- holds across replicas.
CREATE TABLE tenant_usage (
    tenant_id       TEXT   PRIMARY KEY,
    active_branches BIGINT NOT NULL CHECK (active_branches >= 0)
);

-- The same for the whole deployment: exactly one row.
CREATE TABLE deployment_usage (
    singleton       BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    active_branches BIGINT  NOT NULL CHECK (active_branches >= 0)
);
INSERT INTO deployment_usage (singleton, active_branches) VALUES (TRUE, 0);
