-- The folding schema: sessions, their branch trees, and the counters that
-- enforce concurrency limits. The same as the Postgres schema, with SQLite
-- types: timestamps are fixed-width RFC 3339 text in UTC with milliseconds
-- (`2026-01-02T03:04:05.678Z`), so they compare correctly as text; UUIDs are
-- 16-byte blobs.
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
    budget           INTEGER     NOT NULL CHECK (budget >= 0),
    used             INTEGER     NOT NULL DEFAULT 0 CHECK (used >= 0),
    reserved         INTEGER     NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    created_at       TEXT        NOT NULL,
    last_activity_at TEXT        NOT NULL,
    ended_at         TEXT,
    -- Set while a supervisor replica is ending the session for being idle,
    -- so that other replicas leave it alone.
    claimed_until    TEXT,
    PRIMARY KEY (tenant_id, session_id),
    CHECK (used + reserved <= budget)
);

-- The idle-session reconciler scans open sessions by last activity.
CREATE INDEX sessions_open_by_activity ON sessions (last_activity_at) WHERE status = 'open';

CREATE TABLE branches (
    -- UUIDv7, shown to clients as `br_<uuid>`.
    id            BLOB        PRIMARY KEY,
    tenant_id     TEXT        NOT NULL,
    session_id    TEXT        NOT NULL,
    owner_sub     TEXT        NOT NULL,
    -- NULL for depth-1 branches, whose parent is the session's root pool.
    parent_id     BLOB        REFERENCES branches (id),
    depth         INTEGER     NOT NULL CHECK (depth >= 1),
    description   TEXT        NOT NULL,
    prompt        TEXT        NOT NULL,
    budget        INTEGER     NOT NULL CHECK (budget >= 0),
    used          INTEGER     NOT NULL CHECK (used >= 0),
    reserved      INTEGER     NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    status        TEXT        NOT NULL
                  CHECK (status IN ('created', 'active', 'completed', 'timeout', 'failed')),
    reason        TEXT
                  CHECK (reason IN ('reported_failure', 'deadline_exceeded', 'budget_exhausted',
                                    'parent_returning', 'session_ended')),
    created_at    TEXT        NOT NULL,
    deadline_at   TEXT        NOT NULL,
    completed_at  TEXT,
    -- When spending first crossed 80% of the budget (the warning is given once).
    warned_at     TEXT,
    -- When spending reached the budget. The forced return follows at once;
    -- if the process stopped in between, the supervisor finishes the job.
    exhausted_at  TEXT,
    -- Set while a supervisor replica is force-returning the branch.
    claimed_until TEXT,
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
    active_branches INTEGER NOT NULL CHECK (active_branches >= 0)
);

-- The same for the whole deployment: exactly one row.
CREATE TABLE deployment_usage (
    singleton       INTEGER PRIMARY KEY CHECK (singleton = 1),
    active_branches INTEGER NOT NULL CHECK (active_branches >= 0)
);
INSERT INTO deployment_usage (singleton, active_branches) VALUES (1, 0);
