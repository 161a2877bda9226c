-- The upstream tools each session has called. The same as the Postgres
-- schema, with SQLite types (see the first migration).
CREATE TABLE session_tools (
    tenant_id     TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    tool          TEXT NOT NULL,
    first_used_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, session_id, tool)
);
