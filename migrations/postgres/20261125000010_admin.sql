-- Operating the gateway through the admin API.
--
-- An operator may end a branch: it ends as `failed` with the reason
-- `ended_by_operator`. The constraint is replaced without a long lock: the
-- new one is added NOT VALID (no scan while it is taken) and then validated,
-- which scans the table under a lock that lets reads and writes go on.
ALTER TABLE branches DROP CONSTRAINT branches_reason_check;
ALTER TABLE branches ADD CONSTRAINT branches_reason_check
    CHECK (reason IN ('reported_failure', 'deadline_exceeded', 'budget_exhausted',
                      'parent_returning', 'session_ended', 'ended_by_operator')) NOT VALID;
ALTER TABLE branches VALIDATE CONSTRAINT branches_reason_check;

-- Every change made through the admin API: who (the token's tenant and
-- subject), what (an action on a target, with its details as JSON) and
-- when. Written before the change is made, so that an attempt that then
-- fails is on record too. Read newest first, for the deployment or for one
-- tenant.
CREATE TABLE audit_log (
    -- UUIDv7: rows sort by time.
    id           UUID        PRIMARY KEY,
    at           TIMESTAMPTZ NOT NULL,
    actor_tenant TEXT        NOT NULL,
    actor_sub    TEXT        NOT NULL,
    -- The tenant whose resource was changed; NULL for a change to the whole
    -- deployment.
    tenant_id    TEXT,
    -- What was done, as `<resource>.<verb>` (`branch.end`, `session.end`).
    action       TEXT        NOT NULL,
    -- What it was done to (a branch or session id, a name).
    target       TEXT        NOT NULL,
    -- The request's details, as a JSON object.
    detail       TEXT        NOT NULL
);

CREATE INDEX audit_log_by_time ON audit_log (at);
CREATE INDEX audit_log_by_tenant ON audit_log (tenant_id, at);
