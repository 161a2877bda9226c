-- Upstream MCP servers and model providers registered through the admin API
-- (those of the configuration file are not here). `spec` is the
-- declaration as a JSON object, with the fields of an `[[upstreams]]` or
-- `[[models]]` entry; its credentials are only ever `${VAR}` references to
-- the replicas' environment, never the secrets themselves. Every replica
-- reads the table every few seconds and builds or drops its clients.
CREATE TABLE registrations (
    kind              TEXT        NOT NULL CHECK (kind IN ('upstream', 'model')),
    name              TEXT        NOT NULL,
    spec              TEXT        NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL,
    created_by_tenant TEXT        NOT NULL,
    created_by_sub    TEXT        NOT NULL,
    PRIMARY KEY (kind, name)
);
