-- The reasoning memory: what branches learned, per tenant. An item is a
-- strategy or a pitfall, distilled by the gateway from a branch it saw end
-- or recorded by an agent; its text is scrubbed of secrets before it is
-- written here, and screened for prompt injection (`flagged`).
CREATE TABLE memories (
    tenant_id    TEXT             NOT NULL,
    id           UUID             NOT NULL,
    kind         TEXT             NOT NULL CHECK (kind IN ('strategy', 'pitfall')),
    source       TEXT             NOT NULL CHECK (source IN ('distilled', 'recorded')),
    title        TEXT             NOT NULL,
    description  TEXT             NOT NULL,
    content      TEXT             NOT NULL,
    -- Where feedback moves the confidence from, and the confidence now:
    -- (prior * 4 + helpful) / (4 + helpful + unhelpful).
    prior        DOUBLE PRECISION NOT NULL CHECK (prior >= 0 AND prior <= 1),
    confidence   DOUBLE PRECISION NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
    -- Provenance: who recorded it or whose branch it came from.
    subject      TEXT             NOT NULL,
    session_id   TEXT,
    branch_id    UUID,
    -- Space-separated ids of the injection-screen rules its text set off;
    -- empty when none did.
    flagged      TEXT             NOT NULL DEFAULT '',
    uses         BIGINT           NOT NULL DEFAULT 0 CHECK (uses >= 0),
    helpful      BIGINT           NOT NULL DEFAULT 0 CHECK (helpful >= 0),
    unhelpful    BIGINT           NOT NULL DEFAULT 0 CHECK (unhelpful >= 0),
    created_at   TIMESTAMPTZ      NOT NULL,
    last_used_at TIMESTAMPTZ,
    -- What retrieval ranks: the title weighs most, then the description.
    search       TSVECTOR         GENERATED ALWAYS AS (
        setweight(to_tsvector('english', title), 'A')
        || setweight(to_tsvector('english', description), 'B')
        || setweight(to_tsvector('english', content), 'C')
    ) STORED,
    PRIMARY KEY (tenant_id, id)
);

CREATE INDEX memories_search ON memories USING GIN (search);
-- Feedback on items: one vote per subject and item, its latest; an item's
-- `helpful` and `unhelpful` are counts of these.
CREATE TABLE memory_votes (
    tenant_id TEXT    NOT NULL,
    memory_id UUID    NOT NULL,
    subject   TEXT    NOT NULL,
    helpful   BOOLEAN NOT NULL,
    at        TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant_id, memory_id, subject)
);

-- Retention: the oldest of a tenant's items go first.
CREATE INDEX memories_by_age ON memories (tenant_id, created_at);

-- The lessons a gateway-run branch's model was given in its system text
-- (`inject_memories`), kept so that a replica that resumes the run gives
-- the same.
ALTER TABLE branch_runs ADD COLUMN lessons TEXT;

-- Lessons distilled from a gateway-run branch by its model, queued when its
-- run ends (NULL: not wanted) and taken by one replica at a time, until
-- `distill_until`; another takes it over after that.
ALTER TABLE branch_runs ADD COLUMN distill TEXT CHECK (distill IN ('pending', 'done', 'failed'));
ALTER TABLE branch_runs ADD COLUMN distill_until TIMESTAMPTZ;
ALTER TABLE branch_runs ADD COLUMN distill_attempts INTEGER NOT NULL DEFAULT 0
    CHECK (distill_attempts >= 0);
CREATE INDEX branch_runs_distill ON branch_runs (distill_until) WHERE distill = 'pending';
