-- Gateway-run branches (`branch_run`): the gateway itself works inside the
-- branch, on a model the operator configured, and hands back only the
-- finding. The branch is an ordinary branch (same pools, limits, deadline);
-- the run's own state is kept beside it, one step at a time, so that another
-- replica can resume a run whose replica died.

-- Who works inside a branch. Gateway-run branches are never the session's
-- active branch: an agent's own branches and calls do not land in them.
ALTER TABLE branches ADD COLUMN kind TEXT NOT NULL DEFAULT 'agent'
    CHECK (kind IN ('agent', 'gateway'));
-- How long the branch's finding should be (the context-budget policy).
ALTER TABLE branches ADD COLUMN return_tier TEXT NOT NULL DEFAULT 'phase'
    CHECK (return_tier IN ('micro', 'phase', 'macro'));
-- Tokens of the return message handed to the parent, once returned: what
-- folding added to the parent's context.
ALTER TABLE branches ADD COLUMN returned_tokens BIGINT CHECK (returned_tokens >= 0);

CREATE TABLE branch_runs (
    branch_id     UUID        PRIMARY KEY REFERENCES branches (id),
    tenant_id     TEXT        NOT NULL,
    -- The `[[models]]` entry the run uses, by name.
    model         TEXT        NOT NULL,
    -- JSON array of the `<upstream>__<tool>` names the model may call.
    tools         TEXT        NOT NULL,
    -- The caller's scopes when the run started (space-separated): a replica
    -- that resumes the run has no token to read them from.
    scopes        TEXT        NOT NULL,
    state         TEXT        NOT NULL CHECK (state IN ('running', 'done')),
    -- JSON: the result `branch_run` answers with, once done. Scrubbed.
    outcome       TEXT,
    -- The replica working on the run, and until when; another may take the
    -- run over once the lease has lapsed.
    lease_owner   TEXT,
    lease_until   TIMESTAMPTZ,
    -- Steps written so far (model calls and tool calls).
    steps         INTEGER     NOT NULL DEFAULT 0 CHECK (steps >= 0),
    -- What the provider billed, summed over the run's model calls.
    model_calls   INTEGER     NOT NULL DEFAULT 0 CHECK (model_calls >= 0),
    input_tokens  BIGINT      NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    output_tokens BIGINT      NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    -- How often another replica (or a restarted one) took the run over.
    resumes       INTEGER     NOT NULL DEFAULT 0 CHECK (resumes >= 0),
    created_at    TIMESTAMPTZ NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL
);

-- What a tenant was billed, per model: summed over its runs when asked
-- (rarely), rather than kept in a row per tenant and model that every model
-- call of the tenant would have to lock.
CREATE INDEX branch_runs_by_tenant ON branch_runs (tenant_id, model);

-- The runs a replica holds, whose branches it checks are still active.
CREATE INDEX branch_runs_by_owner ON branch_runs (lease_owner) WHERE state = 'running';

-- Runs whose lease may lapse, for the reconciler that takes them over.
CREATE INDEX branch_runs_running ON branch_runs (lease_until) WHERE state = 'running';

-- The steps of a run, in order, each written once as it completes (with the
-- ledger change it made, in the same transaction). A run is resumed by
-- replaying them into the model's context.
CREATE TABLE run_steps (
    tenant_id     TEXT        NOT NULL,
    branch_id     UUID        NOT NULL REFERENCES branch_runs (branch_id),
    seq           INTEGER     NOT NULL CHECK (seq >= 0),
    kind          TEXT        NOT NULL CHECK (kind IN ('model', 'tool')),
    -- JSON. A model step: the assistant's text and tool calls. A tool step:
    -- the call it answers and the result as the model received it (scrubbed).
    body          TEXT        NOT NULL,
    -- A model step: the provider's usage for the call.
    input_tokens  BIGINT      NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    output_tokens BIGINT      NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    duration_ms   BIGINT      NOT NULL CHECK (duration_ms >= 0),
    -- The step was in flight when its replica died and was made again.
    repeated      BOOLEAN     NOT NULL DEFAULT FALSE,
    at            TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (branch_id, seq)
);
