-- Upstream tool calls, metered by the gateway. The same as the Postgres
-- schema, with SQLite types (see the first migration).
--
-- Every call made inside a branch is one row of the branch's trace: which
-- upstream tool, how many tokens went in (arguments) and came out (the
-- result as the agent received it, after any truncation), how many of those
-- were charged to the branch, how long it took and how it ended. The row is
-- written in the same transaction as the charge.

CREATE TABLE branch_calls (
    -- UUIDv7: rows sort by time.
    id             BLOB        PRIMARY KEY,
    tenant_id      TEXT        NOT NULL,
    branch_id      BLOB        NOT NULL REFERENCES branches (id),
    upstream       TEXT        NOT NULL,
    tool           TEXT        NOT NULL,
    tokens_in      INTEGER     NOT NULL CHECK (tokens_in >= 0),
    tokens_out     INTEGER     NOT NULL CHECK (tokens_out >= 0),
    -- What the branch was actually charged: less than in + out only when
    -- the branch had run out, or had already ended when the call finished.
    tokens_charged INTEGER     NOT NULL CHECK (tokens_charged >= 0),
    duration_ms    INTEGER     NOT NULL CHECK (duration_ms >= 0),
    outcome        TEXT        NOT NULL
                   CHECK (outcome IN ('ok', 'tool_error', 'upstream_error', 'truncated', 'refused')),
    called_at      TEXT        NOT NULL
);

CREATE INDEX branch_calls_by_branch ON branch_calls (tenant_id, branch_id, called_at);

-- Calls that belonged to no branch, added up per tenant and session (an
-- empty session id when the caller had no single open session), for
-- reporting. Written in batches, so a crash may lose the last few seconds.
CREATE TABLE usage_outside_branches (
    tenant_id  TEXT        NOT NULL,
    session_id TEXT        NOT NULL,
    calls      INTEGER     NOT NULL CHECK (calls >= 0),
    tokens_in  INTEGER     NOT NULL CHECK (tokens_in >= 0),
    tokens_out INTEGER     NOT NULL CHECK (tokens_out >= 0),
    updated_at TEXT        NOT NULL,
    PRIMARY KEY (tenant_id, session_id)
);

-- A call that names no branch is metered against the active branch of the
-- caller's only open session: find a principal's open sessions.
CREATE INDEX sessions_open_by_owner ON sessions (tenant_id, owner_sub) WHERE status = 'open';
