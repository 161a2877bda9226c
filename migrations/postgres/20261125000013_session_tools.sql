-- The upstream tools each session has called, by the names agents see
-- (`<upstream>__<tool>`): what `tools/list` shows beside the folding tools
-- and `tool_search` to a tenant whose tools are listed by search. Written
-- in batches, so a crash may lose the last few seconds; deleted with the
-- session.
CREATE TABLE session_tools (
    tenant_id     TEXT        NOT NULL,
    session_id    TEXT        NOT NULL,
    tool          TEXT        NOT NULL,
    first_used_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant_id, session_id, tool)
);
