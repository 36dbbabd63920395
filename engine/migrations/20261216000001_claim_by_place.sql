-- The claim, as in 20261214000001 (an applied migration never changes, so its text repeats
-- here), cheaper a job (issue 38): the claim is the drain's one serial step (a worker pool
-- waits on it for most of a drain of short jobs), so what it costs a job bounds the drain.
--   * Locked rows are updated by their place in the table (a TID scan), not looked up by id in
--     the primary key a second time.
--   * Without a provider budget the window (a sort, a row count and a running sum over the
--     locked rows) is not taken: every locked job fits. Under one, the sum is in float8, as the
--     levels it is compared with (a bigint sum is numeric, slow to add and to compare).
--   * The claimed jobs come back in line order, as the nested loop over the window gave them.
--   * Each comes with its row's new place (`place`), where the completion writes its result
--     unless the row has moved meanwhile (a heartbeat, a stage): no lookup by id for a short job.
-- A new name, because what it returns has a new column: processes of the previous release keep
-- calling `sluice_claim`, left as it was (their prepared statements would fail on a changed
-- result type until their connections were recycled); both take the settings row's lock, so
-- the two claim side by side during a rollout. A later release drops the old one.
CREATE FUNCTION sluice_claim_with_places(p_max bigint, p_worker text, p_lease_secs float8,
                                         p_busy bigint DEFAULT NULL, p_prefetch bigint DEFAULT 0)
RETURNS TABLE (id uuid, owner_id bigint, kind text, payload jsonb, attempts integer, max_attempts integer,
               lease_token uuid, est_input_tokens bigint, gate_allowance integer, place text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_s queue_settings;
    v_free bigint;
    v_req float8 := 'Infinity';
    v_in float8 := 'Infinity';
    v_out float8 := 'Infinity';
    v_req_full boolean := true;
    v_in_full boolean := true;
    v_out_full boolean := true;
    v_budgeted boolean;
    v_allowance bigint;
BEGIN
    SELECT * INTO v_s FROM queue_settings q WHERE q.id = 1 FOR UPDATE;
    IF NOT v_s.processing_enabled THEN
        RETURN QUERY SELECT NULL::uuid, NULL::bigint, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                            NULL::uuid, NULL::bigint, 0, NULL::text WHERE p_busy IS NOT NULL;
        RETURN;
    END IF;
    -- A running job holds one slot, and one more for each call beyond its first (parts side by
    -- side). The claimer's own rows are counted by the claimer itself (`p_busy`): those whose
    -- result is being written hold no slot any more.
    SELECT sluice_effective_gate(v_s) - count(*) FILTER (WHERE p_busy IS NULL OR j.lease_owner IS DISTINCT FROM p_worker)
           - coalesce(sum(j.extra_calls), 0)
    INTO v_allowance
    FROM jobs j WHERE j.state = 'running';
    v_free := CASE WHEN p_busy IS NULL THEN least(p_max, v_allowance)
                   WHEN v_allowance > p_busy THEN least(p_max, v_allowance - p_busy + greatest(p_prefetch, 0))
                   ELSE 0 END;
    IF v_free <= 0 THEN
        RETURN QUERY SELECT NULL::uuid, NULL::bigint, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                            NULL::uuid, NULL::bigint, greatest(v_allowance, 0)::integer, NULL::text WHERE p_busy IS NOT NULL;
        RETURN;
    END IF;
    v_budgeted := coalesce(v_s.limit_requests_per_min, v_s.limit_input_tokens_per_min, v_s.limit_output_tokens_per_min) IS NOT NULL;
    IF v_budgeted THEN
        UPDATE queue_settings q SET
            level_requests = sluice_refill(q.level_requests, q.limit_requests_per_min * q.limit_share, q.limit_burst_secs, q.levels_at),
            level_input = sluice_refill(q.level_input, q.limit_input_tokens_per_min * q.limit_share, q.limit_burst_secs, q.levels_at),
            level_output = sluice_refill(q.level_output, q.limit_output_tokens_per_min * q.limit_share, q.limit_burst_secs, q.levels_at),
            levels_at = greatest(q.levels_at, clock_timestamp())
        WHERE q.id = 1
        RETURNING q.level_requests, q.level_input, q.level_output,
                  q.level_requests >= coalesce(q.limit_requests_per_min * q.limit_share / 60.0 * q.limit_burst_secs, 0),
                  q.level_input >= coalesce(q.limit_input_tokens_per_min * q.limit_share / 60.0 * q.limit_burst_secs, 0),
                  q.level_output >= coalesce(q.limit_output_tokens_per_min * q.limit_share / 60.0 * q.limit_burst_secs, 0)
        INTO v_req, v_in, v_out, v_req_full, v_in_full, v_out_full;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    -- The due jobs with the lowest tags, in one walk of the tags' index; a job another claim
    -- holds is passed over. Locked rows that the budget leaves out stay waiting. Each is kept
    -- by its place in the table (`ctid`): the row is locked, so it stays there until the update
    -- below, which reads it there instead of looking its id up in the primary key again. A row
    -- another transaction changed after this statement began (and before the lock reached it)
    -- is locked at its new place, which this statement cannot see: it is left waiting, for the
    -- next claim (nothing is lost; it was claimed at once when the update went by id).
    WITH locked AS (
        SELECT j.ctid AS at, j.est_input_tokens, j.fair_tag, j.run_at, j.id FROM jobs j
        WHERE j.state IN ('queued', 'retrying') AND j.run_at <= now()
        ORDER BY j.fair_tag, j.run_at, j.id
        LIMIT v_free
        FOR UPDATE SKIP LOCKED
    ),
    -- Running sums only under a provider budget (in float8, as the levels are kept): without
    -- one every locked job fits, and the window's sort and sums are not taken.
    in_order AS (
        SELECT l.at,
               row_number() OVER w AS n,
               sum(l.est_input_tokens::float8) OVER w AS input_upto
        FROM locked l
        WINDOW w AS (ORDER BY l.fair_tag, l.run_at, l.id)
    ),
    fitting AS (
        SELECT l.at FROM locked l WHERE NOT v_budgeted
        UNION ALL
        SELECT o.at FROM in_order o
        WHERE v_budgeted
          AND (o.n <= v_req OR (o.n = 1 AND v_req_full))
          AND (o.input_upto <= v_in OR (o.n = 1 AND v_in_full))
          AND (o.n * v_s.output_reserve <= v_out OR (o.n = 1 AND v_out_full))
    ),
    -- By place (a TID scan), whatever the planner guesses of how many fit: joined to `fitting`,
    -- a guess of thousands read the whole table into a hash.
    claimed AS (
        UPDATE jobs j
        SET state = 'running', attempts = j.attempts + 1, lease_owner = p_worker, extra_calls = 0, extra_tokens = 0,
            lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => p_lease_secs),
            started_at = coalesce(j.started_at, now()), claimed_at = now(), updated_at = now()
        WHERE j.ctid = ANY (ARRAY(SELECT f.at FROM fitting f))
        RETURNING j.id, j.owner_id, j.kind, j.payload, j.attempts, j.max_attempts, j.lease_token, j.est_input_tokens,
                  j.fair_tag, j.run_at, j.ctid AS place
    ),
    -- The virtual time moves to the highest tag served; the budget pays for what was claimed.
    -- One update: two of the same row in one statement would see only one.
    settled AS (
        UPDATE queue_settings q
        SET virtual_time = greatest(q.virtual_time, (SELECT max(c.fair_tag) FROM claimed c)),
            level_requests = CASE WHEN v_budgeted THEN q.level_requests - (SELECT count(*) FROM claimed) ELSE q.level_requests END,
            level_input = CASE WHEN v_budgeted THEN q.level_input - (SELECT coalesce(sum(c.est_input_tokens), 0) FROM claimed c)
                               ELSE q.level_input END,
            level_output = CASE WHEN v_budgeted THEN q.level_output - (SELECT count(*) FROM claimed) * q.output_reserve
                                ELSE q.level_output END
        WHERE q.id = 1 AND EXISTS (SELECT 1 FROM claimed)
    )
    -- In line order (the TID scan updates them in table order), so they start in it.
    SELECT c.id, c.owner_id, c.kind, c.payload, c.attempts, c.max_attempts, c.lease_token, c.est_input_tokens,
           v_allowance::integer, c.place::text
    FROM claimed c
    ORDER BY c.fair_tag, c.run_at, c.id;
    RETURN QUERY SELECT NULL::uuid, NULL::bigint, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                        NULL::uuid, NULL::bigint, greatest(v_allowance, 0)::integer, NULL::text WHERE p_busy IS NOT NULL;
END $$;
