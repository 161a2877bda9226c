-- The same as the Postgres schema, with SQLite types (see the first migration).
CREATE TABLE registrations (
    kind              TEXT NOT NULL CHECK (kind IN ('upstream', 'model')),
    name              TEXT NOT NULL,
    spec              TEXT NOT NULL,
    created_at        TEXT NOT NULL,
    created_by_tenant TEXT NOT NULL,
    created_by_sub    TEXT NOT NULL,
    PRIMARY KEY (kind, name)
);
