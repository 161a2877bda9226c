-- The active-branch counters, split into stripes.
--
-- With one row per tenant and one for the deployment, every branch creation
-- and every branch end in the deployment locked the same row and held it
-- until its commit reached the disk, so they all ran one after another. Now
-- each counter is the sum of its stripes' rows, and a transaction takes one
-- slot in any stripe that is not locked and has room. A stripe's room is
-- its share of the limit (limit / stripes, the remainder spread over the
-- first stripes), so the shares add up to the limit exactly: a creation is
-- refused only when every stripe is full, that is when the sum reached the
-- limit. Ending a branch gives a slot back in any stripe above zero.
--
-- The existing counts move to stripe 0; stripes are created as needed. The
-- same as the Postgres schema, with SQLite types.

CREATE TABLE tenant_usage_striped (
    tenant_id       TEXT    NOT NULL,
    stripe          INTEGER NOT NULL CHECK (stripe >= 0),
    active_branches INTEGER NOT NULL CHECK (active_branches >= 0),
    PRIMARY KEY (tenant_id, stripe)
);
INSERT INTO tenant_usage_striped (tenant_id, stripe, active_branches)
    SELECT tenant_id, 0, active_branches FROM tenant_usage;
DROP TABLE tenant_usage;
ALTER TABLE tenant_usage_striped RENAME TO tenant_usage;

CREATE TABLE deployment_usage_striped (
    stripe          INTEGER PRIMARY KEY CHECK (stripe >= 0),
    active_branches INTEGER NOT NULL CHECK (active_branches >= 0)
);
INSERT INTO deployment_usage_striped (stripe, active_branches)
    SELECT 0, active_branches FROM deployment_usage;
DROP TABLE deployment_usage;
ALTER TABLE deployment_usage_striped RENAME TO deployment_usage;
