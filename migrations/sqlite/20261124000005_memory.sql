-- The same as the Postgres schema, with SQLite types (see the first migration).
--
-- The reasoning memory: what branches learned, per tenant. An item is a
-- strategy or a pitfall, distilled by the gateway from a branch it saw end
-- or recorded by an agent; its text is scrubbed of secrets before it is
-- written here, and screened for prompt injection (`flagged`).
CREATE TABLE memories (
    -- The row's stable rowid, which the full-text index refers to.
    seq          INTEGER PRIMARY KEY,
    tenant_id    TEXT    NOT NULL,
    id           BLOB    NOT NULL,
    kind         TEXT    NOT NULL CHECK (kind IN ('strategy', 'pitfall')),
    source       TEXT    NOT NULL CHECK (source IN ('distilled', 'recorded')),
    title        TEXT    NOT NULL,
    description  TEXT    NOT NULL,
    content      TEXT    NOT NULL,
    -- Where feedback moves the confidence from, and the confidence now:
    -- (prior * 4 + helpful) / (4 + helpful + unhelpful).
    prior        REAL    NOT NULL CHECK (prior >= 0 AND prior <= 1),
    confidence   REAL    NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
    -- Provenance: who recorded it or whose branch it came from.
    subject      TEXT    NOT NULL,
    session_id   TEXT,
    branch_id    BLOB,
    -- Space-separated ids of the injection-screen rules its text set off;
    -- empty when none did.
    flagged      TEXT    NOT NULL DEFAULT '',
    uses         INTEGER NOT NULL DEFAULT 0 CHECK (uses >= 0),
    helpful      INTEGER NOT NULL DEFAULT 0 CHECK (helpful >= 0),
    unhelpful    INTEGER NOT NULL DEFAULT 0 CHECK (unhelpful >= 0),
    created_at   TEXT    NOT NULL,
    last_used_at TEXT,
    UNIQUE (tenant_id, id)
);

-- Feedback on items: one vote per subject and item, its latest; an item's
-- `helpful` and `unhelpful` are counts of these.
CREATE TABLE memory_votes (
    tenant_id TEXT    NOT NULL,
    memory_id BLOB    NOT NULL,
    subject   TEXT    NOT NULL,
    helpful   INTEGER NOT NULL,
    at        TEXT    NOT NULL,
    PRIMARY KEY (tenant_id, memory_id, subject)
);

-- Retention: the oldest of a tenant's items go first.
CREATE INDEX memories_by_age ON memories (tenant_id, created_at);

-- What retrieval ranks (bm25), kept in step with `memories` by triggers.
-- Porter stemming, as Postgres' `english` configuration stems.
CREATE VIRTUAL TABLE memories_fts USING fts5(
    title, description, content,
    content = 'memories', content_rowid = 'seq',
    tokenize = 'porter unicode61'
);

CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts (rowid, title, description, content)
    VALUES (new.seq, new.title, new.description, new.content);
END;

CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, title, description, content)
    VALUES ('delete', old.seq, old.title, old.description, old.content);
END;

CREATE TRIGGER memories_fts_update AFTER UPDATE OF title, description, content ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, title, description, content)
    VALUES ('delete', old.seq, old.title, old.description, old.content);
    INSERT INTO memories_fts (rowid, title, description, content)
    VALUES (new.seq, new.title, new.description, new.content);
END;

-- The lessons a gateway-run branch's model was given in its system text
-- (`inject_memories`), kept so that a replica that resumes the run gives
-- the same.
ALTER TABLE branch_runs ADD COLUMN lessons TEXT;

-- Lessons distilled from a gateway-run branch by its model, queued when its
-- run ends (NULL: not wanted) and taken by one replica at a time, until
-- `distill_until`; another takes it over after that.
ALTER TABLE branch_runs ADD COLUMN distill TEXT CHECK (distill IN ('pending', 'done', 'failed'));
ALTER TABLE branch_runs ADD COLUMN distill_until TEXT;
ALTER TABLE branch_runs ADD COLUMN distill_attempts INTEGER NOT NULL DEFAULT 0
    CHECK (distill_attempts >= 0);
CREATE INDEX branch_runs_distill ON branch_runs (distill_until) WHERE distill = 'pending';
