-- An agent's return in one round trip: the checks that the gateway made with a
-- read of the branch before ending it (the branch is the caller's, and not a
-- gateway-run one) are made by the statement that ends it.
--
-- foldgate_return_tree is foldgate_end_tree (the previous migration) behind
-- those checks. With p_owner NULL (the gateway's own ends) it checks nothing.
-- Owner and kind never change, so they are read before anything is locked; a
-- refusal changes nothing and answers 'not_found' (another owner's branch
-- looks exactly like a missing one) or 'gateway_run'. As in
-- crates/foldgate-store/src/ops.rs (Tx::end_tree), which SQLite runs.
CREATE FUNCTION foldgate_return_tree(
    p_tenant TEXT, p_id UUID, p_status TEXT, p_reason TEXT, p_at TIMESTAMPTZ, p_result TEXT,
    p_result_tokens BIGINT, p_returned_tokens BIGINT, p_extract BOOLEAN, p_child_status TEXT,
    p_child_reason TEXT, p_touch_before TIMESTAMPTZ, p_stripes INTEGER, p_rounds INTEGER,
    p_owner TEXT)
RETURNS TABLE (r_outcome TEXT, r_branch branches)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_owner TEXT;
    v_kind TEXT;
BEGIN
    IF p_owner IS NOT NULL THEN
        SELECT owner_sub, kind INTO v_owner, v_kind FROM branches
        WHERE tenant_id = p_tenant AND id = p_id;
        IF NOT FOUND OR v_owner <> p_owner THEN
            r_outcome := 'not_found';
            RETURN NEXT;
            RETURN;
        END IF;
        IF v_kind = 'gateway' THEN
            r_outcome := 'gateway_run';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM foldgate_end_tree(p_tenant, p_id, p_status, p_reason, p_at,
        p_result, p_result_tokens, p_returned_tokens, p_extract, p_child_status, p_child_reason,
        p_touch_before, p_stripes, p_rounds);
END
$$;
