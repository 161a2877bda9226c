-- no-transaction
-- The same as the Postgres schema, with SQLite types (see the first migration).
--
-- An operator may end a branch: it ends as `failed` with the reason
-- `ended_by_operator`. SQLite cannot change a CHECK constraint in place, so
-- `branches` is rebuilt as SQLite's documentation prescribes: foreign keys
-- off (which only works outside a transaction, hence `no-transaction`
-- above), one transaction that copies the table, replaces it and recreates
-- its indexes, a check that no reference broke, foreign keys back on.
PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

CREATE TABLE branches_rebuilt (
    id               BLOB    PRIMARY KEY,
    tenant_id        TEXT    NOT NULL,
    session_id       TEXT    NOT NULL,
    owner_sub        TEXT    NOT NULL,
    parent_id        BLOB    REFERENCES branches (id),
    depth            INTEGER NOT NULL CHECK (depth >= 1),
    description      TEXT    NOT NULL,
    prompt           TEXT    NOT NULL,
    budget           INTEGER NOT NULL CHECK (budget >= 0),
    used             INTEGER NOT NULL CHECK (used >= 0),
    reserved         INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    status           TEXT    NOT NULL
                     CHECK (status IN ('created', 'active', 'completed', 'timeout', 'failed')),
    reason           TEXT
                     CHECK (reason IN ('reported_failure', 'deadline_exceeded', 'budget_exhausted',
                                       'parent_returning', 'session_ended', 'ended_by_operator')),
    created_at       TEXT    NOT NULL,
    deadline_at      TEXT    NOT NULL,
    completed_at     TEXT,
    warned_at        TEXT,
    exhausted_at     TEXT,
    claimed_until    TEXT,
    result           TEXT,
    kind             TEXT    NOT NULL DEFAULT 'agent' CHECK (kind IN ('agent', 'gateway')),
    return_tier      TEXT    NOT NULL DEFAULT 'phase'
                     CHECK (return_tier IN ('micro', 'phase', 'macro')),
    returned_tokens  INTEGER CHECK (returned_tokens >= 0),
    extract          TEXT    CHECK (extract IN ('pending', 'done', 'failed')),
    extract_until    TEXT,
    extract_attempts INTEGER NOT NULL DEFAULT 0 CHECK (extract_attempts >= 0),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, session_id),
    CHECK (used + reserved <= budget),
    CHECK ((status IN ('created', 'active')) = (completed_at IS NULL))
);

INSERT INTO branches_rebuilt (
    id, tenant_id, session_id, owner_sub, parent_id, depth, description, prompt, budget, used,
    reserved, status, reason, created_at, deadline_at, completed_at, warned_at, exhausted_at,
    claimed_until, result, kind, return_tier, returned_tokens, extract, extract_until,
    extract_attempts)
SELECT
    id, tenant_id, session_id, owner_sub, parent_id, depth, description, prompt, budget, used,
    reserved, status, reason, created_at, deadline_at, completed_at, warned_at, exhausted_at,
    claimed_until, result, kind, return_tier, returned_tokens, extract, extract_until,
    extract_attempts
FROM branches;

DROP TABLE branches;
ALTER TABLE branches_rebuilt RENAME TO branches;

CREATE INDEX branches_by_session ON branches (tenant_id, session_id, created_at);
-- Deleting a branch checks that no branch has it as its parent, and no
-- call row refers to it: both checks need indexes led by the referring
-- column (the Postgres migration 11 does the same).
CREATE INDEX branches_by_parent_id ON branches (parent_id);
CREATE INDEX branches_due ON branches (deadline_at) WHERE status = 'active';
CREATE INDEX branches_exhausted ON branches (exhausted_at) WHERE status = 'active' AND exhausted_at IS NOT NULL;
CREATE INDEX branches_extract ON branches (completed_at) WHERE extract = 'pending';
CREATE INDEX branches_ended_roots ON branches (completed_at) WHERE parent_id IS NULL;
CREATE INDEX sessions_ended ON sessions (ended_at) WHERE status = 'ended';

DROP INDEX branch_calls_by_branch;
CREATE INDEX branch_calls_by_branch_id ON branch_calls (branch_id, called_at);

CREATE TABLE audit_log (
    id           BLOB PRIMARY KEY,
    at           TEXT NOT NULL,
    actor_tenant TEXT NOT NULL,
    actor_sub    TEXT NOT NULL,
    tenant_id    TEXT,
    action       TEXT NOT NULL,
    target       TEXT NOT NULL,
    detail       TEXT NOT NULL
);

CREATE INDEX audit_log_by_time ON audit_log (at);
CREATE INDEX audit_log_by_tenant ON audit_log (tenant_id, at);

CREATE TABLE tenant_settings (
    tenant_id         TEXT PRIMARY KEY,
    settings          TEXT NOT NULL,
    updated_at        TEXT NOT NULL,
    updated_by_tenant TEXT NOT NULL,
    updated_by_sub    TEXT NOT NULL
);

CREATE TABLE usage_daily (
    tenant_id  TEXT    NOT NULL,
    day        TEXT    NOT NULL,
    kind       TEXT    NOT NULL CHECK (kind IN ('branch_call', 'outside_call', 'model', 'return')),
    name       TEXT    NOT NULL,
    calls      INTEGER NOT NULL CHECK (calls >= 0),
    tokens_in  INTEGER NOT NULL CHECK (tokens_in >= 0),
    tokens_out INTEGER NOT NULL CHECK (tokens_out >= 0),
    PRIMARY KEY (tenant_id, day, kind, name)
);

COMMIT;

PRAGMA foreign_key_check;
PRAGMA foreign_keys = ON;
