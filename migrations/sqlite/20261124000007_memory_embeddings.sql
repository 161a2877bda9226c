-- The same as the Postgres schema, with SQLite types (see the first migration).
--
-- The reasoning memory's vectors, for ranking by embeddings as well as by
-- full text: one per item and embeddings model (the `[[models]]` entry's
-- provider model id), written after the item by the replica that recorded
-- it or by the backfill. A vector is `dims` little-endian 32-bit floats.
-- It goes with its item (the foreign key; the store turns foreign keys on
-- for every connection), whichever way the item goes: `foldgate memory
-- delete`, retention, or a tenant's data deletion.
CREATE TABLE memory_embeddings (
    tenant_id   TEXT    NOT NULL,
    memory_id   BLOB    NOT NULL,
    model       TEXT    NOT NULL,
    dims        INTEGER NOT NULL CHECK (dims > 0),
    vector      BLOB    NOT NULL CHECK (length(vector) = dims * 4),
    embedded_at TEXT    NOT NULL,
    PRIMARY KEY (tenant_id, model, memory_id),
    FOREIGN KEY (tenant_id, memory_id) REFERENCES memories (tenant_id, id) ON DELETE CASCADE
);

-- The cascade finds an item's vectors by it.
CREATE INDEX memory_embeddings_by_item ON memory_embeddings (tenant_id, memory_id);
