-- Creating a branch, ending one with its descendants, and ending the
-- supervisor's batch of due branches, in one round trip each.
--
-- These functions do on the server what the store's Rust transactions do
-- statement by statement (crates/foldgate-store/src/ops.rs, which SQLite still
-- runs): the same checks in the same order, the same rows locked in the same
-- order (branch rows deepest first, then the session, then the counters), the
-- same writes. Each call is one statement, and so one round trip, where the
-- Rust transaction made about a dozen. The store's tests run against both, so
-- the two are held to the same rules.
--
-- Refusals come back as rows, not errors: an error would be logged by the
-- server on every refused create. A refusal after a write still writes
-- nothing: the work runs in a block that an exception of our own
-- (SQLSTATE 'FGR01') rolls back.

-- Takes one slot of a tenant's and then of the deployment's striped active-
-- branch counter (see the third migration): first in any stripe with room that
-- no other transaction holds, else in each stripe in turn, waiting for its
-- lock. Returns NULL when both were taken, otherwise the limit reached
-- ('tenant_active' or 'deployment_active'); the caller rolls back a tenant
-- slot taken before a deployment refusal.
CREATE FUNCTION foldgate_take_slot(p_tenant TEXT, p_tenant_limit BIGINT, p_total_limit BIGINT,
                                   p_stripes INTEGER)
RETURNS TEXT LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    s INTEGER;
    took BOOLEAN;
BEGIN
    UPDATE tenant_usage SET active_branches = active_branches + 1
    WHERE tenant_id = p_tenant AND stripe = (
        SELECT stripe FROM tenant_usage WHERE tenant_id = p_tenant
        AND active_branches < p_tenant_limit / p_stripes
            + CASE WHEN stripe < p_tenant_limit % p_stripes THEN 1 ELSE 0 END
        ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED);
    took := FOUND;
    -- A tenant's stripes are created as its branches need them: one not
    -- created yet is taken at random before waiting for any (otherwise every
    -- create would queue on the first stripe, the only one that exists).
    -- Stripes from the limit on have no room when it is below their number.
    IF NOT took THEN
        INSERT INTO tenant_usage (tenant_id, stripe, active_branches)
        SELECT p_tenant, n, 1 FROM generate_series(0, LEAST(p_stripes, p_tenant_limit) - 1) AS n
        WHERE NOT EXISTS (SELECT 1 FROM tenant_usage u WHERE u.tenant_id = p_tenant AND u.stripe = n)
        ORDER BY random() LIMIT 1
        ON CONFLICT DO NOTHING;
        took := FOUND;
    END IF;
    IF NOT took THEN
        FOR s IN 0 .. LEAST(p_stripes, p_tenant_limit) - 1 LOOP
            INSERT INTO tenant_usage (tenant_id, stripe, active_branches) VALUES (p_tenant, s, 1)
            ON CONFLICT (tenant_id, stripe) DO UPDATE
            SET active_branches = tenant_usage.active_branches + 1
            WHERE tenant_usage.active_branches < p_tenant_limit / p_stripes
                + CASE WHEN tenant_usage.stripe < p_tenant_limit % p_stripes THEN 1 ELSE 0 END;
            took := FOUND;
            EXIT WHEN took;
        END LOOP;
        IF NOT took THEN
            RETURN 'tenant_active';
        END IF;
    END IF;

    UPDATE deployment_usage SET active_branches = active_branches + 1
    WHERE stripe = (
        SELECT stripe FROM deployment_usage
        WHERE active_branches < p_total_limit / p_stripes
            + CASE WHEN stripe < p_total_limit % p_stripes THEN 1 ELSE 0 END
        ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED);
    took := FOUND;
    IF NOT took THEN
        INSERT INTO deployment_usage (stripe, active_branches)
        SELECT n, 1 FROM generate_series(0, LEAST(p_stripes, p_total_limit) - 1) AS n
        WHERE NOT EXISTS (SELECT 1 FROM deployment_usage u WHERE u.stripe = n)
        ORDER BY random() LIMIT 1
        ON CONFLICT DO NOTHING;
        took := FOUND;
    END IF;
    IF NOT took THEN
        FOR s IN 0 .. LEAST(p_stripes, p_total_limit) - 1 LOOP
            INSERT INTO deployment_usage (stripe, active_branches) VALUES (s, 1)
            ON CONFLICT (stripe) DO UPDATE
            SET active_branches = deployment_usage.active_branches + 1
            WHERE deployment_usage.active_branches < p_total_limit / p_stripes
                + CASE WHEN deployment_usage.stripe < p_total_limit % p_stripes THEN 1 ELSE 0 END;
            took := FOUND;
            EXIT WHEN took;
        END LOOP;
        IF NOT took THEN
            RETURN 'deployment_active';
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- Gives `p_count` slots back to a tenant's counter, or to the deployment's
-- when `p_tenant` is NULL, each in any stripe above zero. A stripe held by
-- another transaction is skipped at first, then waited for in turn.
CREATE FUNCTION foldgate_give_slots(p_tenant TEXT, p_count INTEGER, p_stripes INTEGER)
RETURNS VOID LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    i INTEGER;
    s INTEGER;
    round INTEGER;
    gave BOOLEAN;
BEGIN
    FOR i IN 1 .. p_count LOOP
        IF p_tenant IS NULL THEN
            UPDATE deployment_usage SET active_branches = active_branches - 1
            WHERE stripe = (
                SELECT stripe FROM deployment_usage WHERE active_branches > 0
                ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED);
        ELSE
            UPDATE tenant_usage SET active_branches = active_branches - 1
            WHERE tenant_id = p_tenant AND stripe = (
                SELECT stripe FROM tenant_usage WHERE tenant_id = p_tenant AND active_branches > 0
                ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED);
        END IF;
        gave := FOUND;
        IF NOT gave THEN
            -- Every stripe above zero is held by another transaction: wait
            -- for each in turn. The slot being given back was counted, so
            -- one is found unless others keep moving ahead of the scan.
            <<scan>>
            FOR round IN 1 .. 2 LOOP
                FOR s IN 0 .. p_stripes - 1 LOOP
                    IF p_tenant IS NULL THEN
                        UPDATE deployment_usage SET active_branches = active_branches - 1
                        WHERE stripe = s AND active_branches > 0;
                    ELSE
                        UPDATE tenant_usage SET active_branches = active_branches - 1
                        WHERE tenant_id = p_tenant AND stripe = s AND active_branches > 0;
                    END IF;
                    gave := FOUND;
                    EXIT scan WHEN gave;
                END LOOP;
            END LOOP;
            IF NOT gave THEN
                RAISE EXCEPTION 'active-branch counter contended' USING ERRCODE = 'FGC01';
            END IF;
        END IF;
    END LOOP;
END $$;

-- Creates a branch, as `Tx::create` does. Returns one row: `r_outcome` is
-- 'created' (with the branch in `r_branch`) or the refusal:
-- 'parent_not_found', 'parent_is_gateway_run', 'parent_not_active'
-- (`r_status`: the parent's status), 'session_not_found',
-- 'max_depth_exceeded', 'session_active' and 'session_creation_rate'
-- (`r_until`: when a slot frees), 'budget_exhausted' (`r_amount`: what was
-- available), 'prompt_over_budget' (`r_amount`: the budget granted),
-- 'tenant_active', 'deployment_active'.
CREATE FUNCTION foldgate_create_branch(
    p_tenant TEXT, p_id UUID, p_session TEXT, p_owner TEXT, p_parent UUID,
    p_description TEXT, p_prompt TEXT, p_request BIGINT, p_prompt_tokens BIGINT,
    p_lessons_tokens BIGINT, p_at TIMESTAMPTZ, p_deadline TIMESTAMPTZ,
    p_session_budget BIGINT, p_min_budget BIGINT, p_max_depth BIGINT,
    p_max_session_active BIGINT, p_max_creations BIGINT, p_window_start TIMESTAMPTZ,
    p_tenant_limit BIGINT, p_total_limit BIGINT, p_stripes INTEGER,
    p_kind TEXT, p_return_tier TEXT, p_touch_before TIMESTAMPTZ,
    p_run_model TEXT, p_run_tools TEXT, p_run_scopes TEXT, p_run_owner TEXT,
    p_run_until TIMESTAMPTZ, p_run_lessons TEXT,
    OUT r_outcome TEXT, OUT r_amount BIGINT, OUT r_until TIMESTAMPTZ, OUT r_status TEXT,
    OUT r_branch branches)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    parent branches;
    sess sessions;
    found_id UUID;
    attempt INTEGER;
    v_depth INTEGER;
    v_active BIGINT;
    v_earliest TIMESTAMPTZ;
    v_recent BIGINT;
    v_oldest TIMESTAMPTZ;
    pool_budget BIGINT;
    pool_used BIGINT;
    pool_reserved BIGINT;
    available BIGINT;
    granted BIGINT;
    charge BIGINT;
    v_limit TEXT;
BEGIN
    BEGIN
        -- Checked without a lock first: inserting into an existing, busy
        -- session would wait on its row before the parent is locked.
        PERFORM 1 FROM sessions WHERE tenant_id = p_tenant AND session_id = p_session;
        IF NOT FOUND THEN
            INSERT INTO sessions (tenant_id, session_id, owner_sub, status, budget, created_at,
                                  last_activity_at)
            VALUES (p_tenant, p_session, p_owner, 'open', p_session_budget, p_at, p_at)
            ON CONFLICT DO NOTHING;
        END IF;

        -- The parent branch is locked before the session.
        IF p_parent IS NOT NULL THEN
            SELECT * INTO parent FROM branches WHERE tenant_id = p_tenant AND id = p_parent
            FOR UPDATE;
            IF NOT FOUND OR parent.session_id <> p_session OR parent.owner_sub <> p_owner THEN
                r_outcome := 'parent_not_found';
                RAISE EXCEPTION USING ERRCODE = 'FGR01';
            END IF;
            IF parent.kind <> 'agent' THEN
                r_outcome := 'parent_is_gateway_run';
                RAISE EXCEPTION USING ERRCODE = 'FGR01';
            END IF;
        ELSE
            -- The session's active branch: the most recent active agent-run
            -- branch with no active agent-run child. Between finding it and
            -- locking it, it may end or gain a child; then look again.
            FOR attempt IN 1 .. 8 LOOP
                SELECT id INTO found_id FROM branches b
                WHERE tenant_id = p_tenant AND session_id = p_session
                  AND status = 'active' AND kind = 'agent'
                  AND NOT EXISTS (SELECT 1 FROM branches c WHERE c.parent_id = b.id
                                  AND c.status = 'active' AND c.kind = 'agent')
                ORDER BY created_at DESC, id DESC LIMIT 1;
                EXIT WHEN NOT FOUND;
                SELECT * INTO parent FROM branches WHERE tenant_id = p_tenant AND id = found_id
                FOR UPDATE;
                IF FOUND AND parent.status = 'active' AND found_id = (
                    SELECT id FROM branches b
                    WHERE tenant_id = p_tenant AND session_id = p_session
                      AND status = 'active' AND kind = 'agent'
                      AND NOT EXISTS (SELECT 1 FROM branches c WHERE c.parent_id = b.id
                                      AND c.status = 'active' AND c.kind = 'agent')
                    ORDER BY created_at DESC, id DESC LIMIT 1)
                THEN
                    EXIT;
                END IF;
                parent := NULL;
                IF attempt = 8 THEN
                    RAISE EXCEPTION 'the active branch kept changing' USING ERRCODE = 'FGC01';
                END IF;
            END LOOP;
            IF found_id IS NULL THEN
                parent := NULL;
            END IF;
        END IF;
        IF parent.id IS NOT NULL THEN
            IF parent.status <> 'active' THEN
                r_outcome := 'parent_not_active';
                r_status := parent.status;
                RAISE EXCEPTION USING ERRCODE = 'FGR01';
            END IF;
            -- A parent past its deadline or out of budget is about to be
            -- force-returned; a child would die with it.
            IF parent.deadline_at <= p_at OR parent.exhausted_at IS NOT NULL THEN
                r_outcome := 'parent_not_active';
                r_status := 'timeout';
                RAISE EXCEPTION USING ERRCODE = 'FGR01';
            END IF;
        END IF;

        SELECT * INTO sess FROM sessions WHERE tenant_id = p_tenant AND session_id = p_session
        FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'session row missing after insert' USING ERRCODE = 'FGX01';
        END IF;
        IF sess.owner_sub <> p_owner THEN
            r_outcome := 'session_not_found';
            RAISE EXCEPTION USING ERRCODE = 'FGR01';
        END IF;
        IF sess.status = 'ended' THEN
            UPDATE sessions SET status = 'open', budget = p_session_budget, used = 0,
                reserved = 0, ended_at = NULL, claimed_until = NULL, last_activity_at = p_at
            WHERE tenant_id = p_tenant AND session_id = p_session;
            sess.budget := p_session_budget;
            sess.used := 0;
            sess.reserved := 0;
        ELSE
            UPDATE sessions SET last_activity_at = p_at
            WHERE tenant_id = p_tenant AND session_id = p_session
              AND last_activity_at < p_touch_before;
        END IF;

        v_depth := COALESCE(parent.depth + 1, 1);
        IF v_depth > p_max_depth THEN
            r_outcome := 'max_depth_exceeded';
            RAISE EXCEPTION USING ERRCODE = 'FGR01';
        END IF;

        SELECT count(*) FILTER (WHERE status = 'active'),
               min(deadline_at) FILTER (WHERE status = 'active'),
               count(*) FILTER (WHERE created_at > p_window_start),
               min(created_at) FILTER (WHERE created_at > p_window_start)
        INTO v_active, v_earliest, v_recent, v_oldest
        FROM branches WHERE tenant_id = p_tenant AND session_id = p_session
          AND (status = 'active' OR created_at > p_window_start);
        IF v_active >= p_max_session_active THEN
            r_outcome := 'session_active';
            r_until := COALESCE(v_earliest, p_at);
            RAISE EXCEPTION USING ERRCODE = 'FGR01';
        END IF;
        IF v_recent >= p_max_creations THEN
            r_outcome := 'session_creation_rate';
            r_until := COALESCE(v_oldest, p_at) + (p_at - p_window_start);
            RAISE EXCEPTION USING ERRCODE = 'FGR01';
        END IF;

        IF parent.id IS NOT NULL THEN
            pool_budget := parent.budget;
            pool_used := parent.used;
            pool_reserved := parent.reserved;
        ELSE
            pool_budget := sess.budget;
            pool_used := sess.used;
            pool_reserved := sess.reserved;
        END IF;
        available := GREATEST(pool_budget - pool_used - pool_reserved, 0);
        granted := LEAST(p_request, available);
        IF granted < p_min_budget OR granted = 0 THEN
            r_outcome := 'budget_exhausted';
            r_amount := available;
            RAISE EXCEPTION USING ERRCODE = 'FGR01';
        END IF;
        IF p_prompt_tokens >= granted THEN
            r_outcome := 'prompt_over_budget';
            r_amount := granted;
            RAISE EXCEPTION USING ERRCODE = 'FGR01';
        END IF;

        IF parent.id IS NOT NULL THEN
            UPDATE branches SET reserved = reserved + granted
            WHERE tenant_id = p_tenant AND id = parent.id;
        ELSE
            UPDATE sessions SET reserved = reserved + granted
            WHERE tenant_id = p_tenant AND session_id = p_session;
        END IF;
        -- The lessons are charged with the prompt when the branch got all it
        -- asked for and they fit (`BudgetRequest::fits_lessons`).
        charge := p_prompt_tokens + CASE
            WHEN p_lessons_tokens > 0 AND granted = p_request
                 AND p_prompt_tokens + p_lessons_tokens < granted
            THEN p_lessons_tokens ELSE 0 END;
        INSERT INTO branches (id, tenant_id, session_id, owner_sub, parent_id, depth, description,
            prompt, budget, used, reserved, status, reason, created_at, deadline_at,
            completed_at, warned_at, exhausted_at, result, kind, return_tier, returned_tokens)
        VALUES (p_id, p_tenant, p_session, p_owner, parent.id, v_depth, p_description, p_prompt,
            granted, charge, 0, 'active', NULL, p_at,
            -- A child never outlives its parent.
            CASE WHEN parent.id IS NULL THEN p_deadline ELSE LEAST(p_deadline, parent.deadline_at) END,
            NULL, CASE WHEN charge * 5 >= granted * 4 THEN p_at END, NULL, NULL, p_kind,
            p_return_tier, NULL)
        RETURNING * INTO r_branch;
        IF p_run_model IS NOT NULL THEN
            INSERT INTO branch_runs (branch_id, tenant_id, model, tools, scopes, state,
                lease_owner, lease_until, created_at, updated_at, lessons)
            VALUES (p_id, p_tenant, p_run_model, p_run_tools, p_run_scopes, 'running',
                p_run_owner, p_run_until, p_at, p_at, p_run_lessons);
        END IF;

        -- The counters are hot rows shared by a tenant and by the whole
        -- deployment: they are locked last, for the shortest time.
        v_limit := foldgate_take_slot(p_tenant, p_tenant_limit, p_total_limit, p_stripes);
        IF v_limit IS NOT NULL THEN
            r_outcome := v_limit;
            RAISE EXCEPTION USING ERRCODE = 'FGR01';
        END IF;
        r_outcome := 'created';
    EXCEPTION WHEN SQLSTATE 'FGR01' THEN
        -- A refusal: everything this block wrote is undone.
        r_branch := NULL;
    END;
END $$;

-- Ends one branch, as `Tx::finish` does but for the session's activity and
-- the counters, which the callers write once for all the branches they end,
-- and, unless `p_settle_root`, the settling of a depth-1 branch with its
-- session's pool (the supervisor's batch settles those after all the branch
-- rows). The caller has locked the branch's parent, or takes that lock here
-- before any session's. `r_outcome`: 'done', 'not_found', 'not_active' or
-- 'has_children' (the branch is active and lends to an active child).
CREATE FUNCTION foldgate_end_branch(
    p_tenant TEXT, p_id UUID, p_status TEXT, p_reason TEXT, p_at TIMESTAMPTZ, p_result TEXT,
    p_result_tokens BIGINT, p_returned_tokens BIGINT, p_extract BOOLEAN, p_settle_root BOOLEAN,
    OUT r_outcome TEXT, OUT r_branch branches)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    UPDATE branches SET status = p_status, reason = p_reason, completed_at = p_at,
        result = p_result,
        used = CASE WHEN used + p_result_tokens < budget THEN used + p_result_tokens ELSE budget END,
        claimed_until = NULL, returned_tokens = p_returned_tokens,
        extract = CASE WHEN p_extract THEN 'pending' END
    WHERE tenant_id = p_tenant AND id = p_id AND status = 'active' AND reserved = 0
    RETURNING * INTO r_branch;
    IF NOT FOUND THEN
        SELECT * INTO r_branch FROM branches WHERE tenant_id = p_tenant AND id = p_id;
        r_outcome := CASE WHEN NOT FOUND THEN 'not_found'
                          WHEN r_branch.status = 'active' THEN 'has_children'
                          ELSE 'not_active' END;
        RETURN;
    END IF;
    -- Gives the parent back the loan, keeping what the branch spent, and
    -- records the parent's 80% warning or exhaustion if that crossed them.
    IF r_branch.parent_id IS NOT NULL THEN
        UPDATE branches SET reserved = reserved - r_branch.budget,
            used = used + r_branch.used,
            warned_at = CASE WHEN warned_at IS NULL AND (used + r_branch.used) * 5 >= budget * 4
                THEN p_at ELSE warned_at END,
            exhausted_at = CASE WHEN exhausted_at IS NULL AND used + r_branch.used >= budget
                THEN p_at ELSE exhausted_at END
        WHERE tenant_id = p_tenant AND id = r_branch.parent_id;
    ELSIF p_settle_root THEN
        UPDATE sessions SET reserved = reserved - r_branch.budget, used = used + r_branch.used
        WHERE tenant_id = p_tenant AND session_id = r_branch.session_id;
    END IF;
    r_outcome := 'done';
END $$;

-- Ends a branch after its active descendants (deepest first, with
-- `p_child_reason`), as the engine did with one store call per branch. All
-- the branch rows concerned (the descendants, the branch, its parent) are
-- locked first, deepest first, in one statement; then the session's activity
-- and the counters, once. A child created between the look-up and the locks
-- is found in the next round (at most `p_rounds`).
--
-- Returns a row per descendant ended (`r_outcome` 'child'), then the
-- branch's own row as `foldgate_end_branch` answers it.
CREATE FUNCTION foldgate_end_tree(
    p_tenant TEXT, p_id UUID, p_status TEXT, p_reason TEXT, p_at TIMESTAMPTZ, p_result TEXT,
    p_result_tokens BIGINT, p_returned_tokens BIGINT, p_extract BOOLEAN, p_child_status TEXT,
    p_child_reason TEXT, p_touch_before TIMESTAMPTZ, p_stripes INTEGER, p_rounds INTEGER)
RETURNS TABLE (r_outcome TEXT, r_branch branches)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    round INTEGER;
    child UUID;
    children UUID[];
    locked UUID[];
    ended INTEGER := 0;
    outcome TEXT;
    v_row branches;
    res RECORD;
    v_session TEXT;
BEGIN
    FOR round IN 1 .. p_rounds LOOP
        -- The ids first, then the rows by key: a lock statement that joined
        -- the tree to the table would scan the table as the planner sees fit.
        WITH RECURSIVE tree (id, depth) AS (
            SELECT id, depth FROM branches
            WHERE tenant_id = p_tenant AND parent_id = p_id AND status = 'active'
            UNION ALL
            SELECT b.id, b.depth FROM branches b JOIN tree t ON b.parent_id = t.id
            WHERE b.tenant_id = p_tenant AND b.status = 'active')
        SELECT COALESCE(array_agg(id ORDER BY depth DESC, id DESC), '{}') INTO children
        FROM tree;
        SELECT children || p_id || COALESCE(array_agg(parent_id), '{}') INTO locked
        FROM branches WHERE tenant_id = p_tenant AND id = p_id AND parent_id IS NOT NULL;
        PERFORM 1 FROM branches WHERE id = ANY (locked) AND tenant_id = p_tenant
        ORDER BY depth DESC, id DESC FOR UPDATE;

        FOREACH child IN ARRAY children LOOP
            SELECT * INTO res FROM foldgate_end_branch(p_tenant, child, p_child_status,
                p_child_reason, p_at, NULL, 0, NULL, FALSE, TRUE);
            IF res.r_outcome = 'done' THEN
                ended := ended + 1;
                v_session := (res.r_branch).session_id;
                r_outcome := 'child';
                r_branch := res.r_branch;
                RETURN NEXT;
            END IF;
        END LOOP;

        SELECT * INTO res FROM foldgate_end_branch(p_tenant, p_id, p_status, p_reason,
            p_at, p_result, p_result_tokens, p_returned_tokens, p_extract, TRUE);
        outcome := res.r_outcome;
        v_row := res.r_branch;
        EXIT WHEN outcome <> 'has_children' OR round = p_rounds;
    END LOOP;
    IF outcome = 'done' THEN
        ended := ended + 1;
        v_session := v_row.session_id;
    END IF;
    IF ended > 0 THEN
        -- Ending branches is activity in their session.
        UPDATE sessions SET last_activity_at = p_at
        WHERE tenant_id = p_tenant AND session_id = v_session
          AND last_activity_at < p_touch_before;
        PERFORM foldgate_give_slots(p_tenant, ended, p_stripes);
        PERFORM foldgate_give_slots(NULL, ended, p_stripes);
    END IF;
    r_outcome := outcome;
    r_branch := v_row;
    RETURN NEXT;
END $$;

-- Ends the supervisor's batch, as `Tx::finish_batch` does: each branch that
-- is active and has no active child (the batch lists children before their
-- parents), settled with its parent branch at once; then the sessions, in
-- order, for the depth-1 branches' pools and the activity; then the
-- counters. Each array holds one entry per branch of the batch. Returns the
-- branches it ended.
CREATE FUNCTION foldgate_finish_batch(
    p_tenants TEXT[], p_ids UUID[], p_statuses TEXT[], p_reasons TEXT[], p_at TIMESTAMPTZ[],
    p_results TEXT[], p_result_tokens BIGINT[], p_returned_tokens BIGINT[], p_extract BOOLEAN[],
    p_touch_before TIMESTAMPTZ[], p_stripes INTEGER)
RETURNS SETOF branches LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    i INTEGER;
    res RECORD;
    done branches[] := '{}';
    touch TIMESTAMPTZ[] := '{}';
    b RECORD;
    t RECORD;
BEGIN
    FOR i IN 1 .. COALESCE(array_length(p_ids, 1), 0) LOOP
        SELECT * INTO res FROM foldgate_end_branch(p_tenants[i], p_ids[i], p_statuses[i],
            p_reasons[i], p_at[i], p_results[i], p_result_tokens[i], p_returned_tokens[i],
            p_extract[i], FALSE);
        IF res.r_outcome = 'done' THEN
            done := done || res.r_branch;
            touch := touch || ARRAY[p_at[i], p_touch_before[i]];
        END IF;
    END LOOP;
    FOR b IN
        SELECT e.*, touch[2 * e.ordinality::INTEGER - 1] AS at_,
               touch[2 * e.ordinality::INTEGER] AS before_
        FROM unnest(done) WITH ORDINALITY AS e
        ORDER BY e.tenant_id, e.session_id
    LOOP
        IF b.parent_id IS NULL THEN
            UPDATE sessions SET reserved = reserved - b.budget, used = used + b.used
            WHERE tenant_id = b.tenant_id AND session_id = b.session_id;
        END IF;
        UPDATE sessions SET last_activity_at = b.at_
        WHERE tenant_id = b.tenant_id AND session_id = b.session_id
          AND last_activity_at < b.before_;
    END LOOP;
    FOR t IN SELECT tenant_id, count(*)::INTEGER AS n FROM unnest(done)
             GROUP BY tenant_id ORDER BY tenant_id LOOP
        PERFORM foldgate_give_slots(t.tenant_id, t.n, p_stripes);
    END LOOP;
    PERFORM foldgate_give_slots(NULL, COALESCE(array_length(done, 1), 0), p_stripes);
    RETURN QUERY SELECT * FROM unnest(done);
END $$;
