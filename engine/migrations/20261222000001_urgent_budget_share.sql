-- The urgent lane's reserve of the provider's token buckets, apart from its share of the gate
-- (issue 58). Small documents wait for tokens, not slots, behind a large one: twenty 2K-token
-- translations ask some 60K output tokens at once, about a whole bucket of a hosted model's
-- 400K a minute, while a large document's parts drain it. A reserve of the buckets costs the
-- bulk lane only once per busy spell (a bucket refills at the same pace whoever draws it), so
-- it can be large; a reserve of the gate costs large documents slots for as long as they run,
-- so it stays small. `urgent_share` keeps the gate's; `urgent_budget_share` the buckets'.
--
-- A part larger than what the bulk lane may take of a bucket went only when the buckets were
-- full and nothing of its job was running: one part at a time. Now one such call goes each
-- time the buckets are full, however many of its job's run, while no other owner's work is
-- due: the bucket's pace, not a part's whole run, sets the large document's pace.
--
-- The two functions are those of 20261219000001 (an applied migration never changes, so their
-- text repeats here) with those two changes.

ALTER TABLE queue_settings
    ADD COLUMN urgent_budget_share float8 NOT NULL DEFAULT 0.5
        CHECK (urgent_budget_share >= 0 AND urgent_budget_share <= 0.95);

CREATE OR REPLACE FUNCTION sluice_claim_with_places(p_max bigint, p_worker text, p_lease_secs float8,
                                                    p_busy bigint DEFAULT NULL, p_prefetch bigint DEFAULT 0)
RETURNS TABLE (id uuid, owner_id bigint, kind text, payload jsonb, attempts integer, max_attempts integer,
               lease_token uuid, est_input_tokens bigint, gate_allowance integer, place text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_s queue_settings;
    v_r record;
    v_free bigint;
    v_req float8 := 'Infinity';
    v_in float8 := 'Infinity';
    v_out float8 := 'Infinity';
    v_req_full boolean := true;
    v_in_full boolean := true;
    v_out_full boolean := true;
    v_budgeted boolean;
    v_allowance bigint;
    v_urgent_room bigint;
    v_bulk_room bigint;
    v_split boolean;
    -- How many of the claimed the claimer starts at once (the rest it fetches ahead).
    v_start_now bigint;
    -- What the bulk lane leaves in each bucket for the urgent lane.
    v_keep_req float8 := 0;
    v_keep_in float8 := 0;
    v_keep_out float8 := 0;
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
    SELECT * INTO v_r FROM sluice_lane_rooms(v_s, p_worker, p_busy);
    v_allowance := v_r.gate - v_r.others;
    v_free := CASE WHEN p_busy IS NULL THEN least(p_max, v_allowance)
                   WHEN v_allowance > p_busy THEN least(p_max, v_allowance - p_busy + greatest(p_prefetch, 0))
                   ELSE 0 END;
    IF v_free <= 0 THEN
        RETURN QUERY SELECT NULL::uuid, NULL::bigint, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                            NULL::uuid, NULL::bigint, greatest(v_allowance, 0)::integer, NULL::text WHERE p_busy IS NOT NULL;
        RETURN;
    END IF;
    -- As many as the claimer has slots free now: the gate's room for it, at most its own.
    v_start_now := CASE WHEN p_busy IS NULL THEN v_free
                        ELSE greatest(least(v_allowance - p_busy, p_max - greatest(p_prefetch, 0)), 0) END;
    -- The lanes' rooms count every running row (the claimer's too, its fetched-ahead ones
    -- included): a lane's cap is across processes. Without large documents running or due
    -- there is one lane, and short jobs are fetched ahead as before.
    v_urgent_room := greatest(v_r.urgent_cap - v_r.urgent_used, 0);
    v_bulk_room := greatest(v_r.bulk_cap - v_r.bulk_used, 0);
    v_split := v_r.bulk_demand > 0 AND (v_urgent_room < v_free OR v_bulk_room < v_free);
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
                  q.level_output >= coalesce(q.limit_output_tokens_per_min * q.limit_share / 60.0 * q.limit_burst_secs, 0),
                  coalesce(q.limit_requests_per_min * q.limit_share / 60.0 * q.limit_burst_secs * q.urgent_budget_share, 0),
                  coalesce(q.limit_input_tokens_per_min * q.limit_share / 60.0 * q.limit_burst_secs * q.urgent_budget_share, 0),
                  coalesce(q.limit_output_tokens_per_min * q.limit_share / 60.0 * q.limit_burst_secs * q.urgent_budget_share, 0)
        INTO v_req, v_in, v_out, v_req_full, v_in_full, v_out_full, v_keep_req, v_keep_in, v_keep_out;
    END IF;
    RETURN QUERY
    -- The due jobs with the lowest tags, in one walk of the tags' index; a job another claim
    -- holds is passed over. Locked rows that the lanes or the budget leave out stay waiting.
    -- Each is kept by its place in the table (`ctid`), read there by the update below.
    WITH by_deadline AS (
        -- Work whose deadline is near, nearest first, within fairness (its tag near the line's
        -- front): an index probe that finds nothing when no deadline is near.
        SELECT j.ctid AS at, j.est_input_tokens, j.fair_tag, j.run_at, j.id, j.urgent, j.latest_start FROM jobs j
        WHERE j.state IN ('queued', 'retrying') AND j.latest_start IS NOT NULL
          AND j.latest_start <= now() + make_interval(secs => v_s.deadline_lead_secs) AND j.due_by > now()
          AND j.run_at <= now() AND j.fair_tag <= v_s.virtual_time + v_s.deadline_fair_window
        ORDER BY j.latest_start, j.id
        LIMIT v_free
        FOR UPDATE SKIP LOCKED
    ),
    by_tag AS (
        SELECT j.ctid AS at, j.est_input_tokens, j.fair_tag, j.run_at, j.id, j.urgent, NULL::timestamptz AS latest_start
        FROM jobs j
        WHERE j.state IN ('queued', 'retrying') AND j.run_at <= now() AND (NOT v_split OR j.urgent)
        ORDER BY j.fair_tag, j.run_at, j.id
        LIMIT CASE WHEN v_split THEN least(v_free, v_urgent_room) ELSE v_free END
        FOR UPDATE SKIP LOCKED
    ),
    -- Only when the lanes split the claim: the bulk lane's line on its own.
    bulk_by_tag AS (
        SELECT j.ctid AS at, j.est_input_tokens, j.fair_tag, j.run_at, j.id, j.urgent, NULL::timestamptz AS latest_start
        FROM jobs j
        WHERE j.state IN ('queued', 'retrying') AND NOT j.urgent AND j.run_at <= now()
        ORDER BY j.fair_tag, j.run_at, j.id
        LIMIT CASE WHEN v_split THEN least(v_free, v_bulk_room) ELSE 0 END
        FOR UPDATE SKIP LOCKED
    ),
    -- A row found twice (near its deadline and by its tag) once, as near its deadline.
    candidates AS (
        SELECT DISTINCT ON (c.at) c.* FROM (
            SELECT * FROM by_deadline UNION ALL SELECT * FROM by_tag UNION ALL SELECT * FROM bulk_by_tag
        ) c
        ORDER BY c.at, c.latest_start NULLS LAST
    ),
    -- Each lane within its room, then the claim's order: near deadlines first, then by tag.
    in_lane AS (
        SELECT c.*, row_number() OVER (PARTITION BY c.urgent ORDER BY c.latest_start NULLS LAST, c.fair_tag, c.run_at, c.id) AS lane_n
        FROM candidates c
    ),
    locked AS (
        SELECT l.at, l.est_input_tokens, l.fair_tag, l.run_at, l.id, l.urgent, l.latest_start,
               row_number() OVER (ORDER BY l.latest_start NULLS LAST, l.fair_tag, l.run_at, l.id) AS n
        FROM in_lane l
        WHERE NOT v_split OR l.lane_n <= CASE WHEN l.urgent THEN v_urgent_room ELSE v_bulk_room END
        ORDER BY l.latest_start NULLS LAST, l.fair_tag, l.run_at, l.id
        LIMIT v_free
    ),
    -- Running sums only under a provider budget (in float8, as the levels are kept). The bulk
    -- lane leaves the urgent lane's share of each bucket.
    in_order AS (
        SELECT l.at, l.id, l.n, l.urgent, l.latest_start IS NOT NULL AS for_deadline,
               sum(l.est_input_tokens::float8) OVER (ORDER BY l.n) AS input_upto
        FROM locked l
    ),
    fitting AS (
        SELECT l.at, l.id, l.n, l.latest_start IS NOT NULL AS for_deadline FROM locked l WHERE NOT v_budgeted
        UNION ALL
        SELECT o.at, o.id, o.n, o.for_deadline FROM in_order o
        WHERE v_budgeted
          AND (o.n <= v_req - CASE WHEN o.urgent THEN 0 ELSE v_keep_req END OR (o.n = 1 AND v_req_full))
          AND (o.input_upto <= v_in - CASE WHEN o.urgent THEN 0 ELSE v_keep_in END OR (o.n = 1 AND v_in_full))
          AND (o.n * v_s.output_reserve <= v_out - CASE WHEN o.urgent THEN 0 ELSE v_keep_out END OR (o.n = 1 AND v_out_full))
    ),
    -- By place (a TID scan), whatever the planner guesses of how many fit.
    claimed AS (
        UPDATE jobs j
        SET state = 'running', attempts = j.attempts + 1, lease_owner = p_worker, extra_calls = 0, extra_tokens = 0,
            lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => p_lease_secs),
            started_at = coalesce(j.started_at, now()), claimed_at = now(), updated_at = now(),
            -- Beyond the claimer's free slots: into its memory, to start later.
            fetched_ahead = j.ctid = ANY (ARRAY(SELECT f.at FROM fitting f WHERE f.n > v_start_now))
        WHERE j.ctid = ANY (ARRAY(SELECT f.at FROM fitting f))
        RETURNING j.id, j.owner_id, j.kind, j.payload, j.attempts, j.max_attempts, j.lease_token, j.est_input_tokens,
                  j.fair_tag, j.ctid AS place
    ),
    -- Each claimed row with its place in the claim's order and whether its deadline took it.
    ranked AS (
        SELECT c.*, f.n, f.for_deadline FROM claimed c
        JOIN fitting f ON f.id = c.id
    ),
    -- The virtual time moves to the highest tag the line served (work taken for its deadline
    -- does not move it: the line's order did not reach it); the budget pays for what was claimed.
    settled AS (
        UPDATE queue_settings q
        SET virtual_time = greatest(q.virtual_time, coalesce((SELECT max(r.fair_tag) FROM ranked r
                                                              WHERE NOT r.for_deadline), 0)),
            level_requests = CASE WHEN v_budgeted THEN q.level_requests - (SELECT count(*) FROM claimed) ELSE q.level_requests END,
            level_input = CASE WHEN v_budgeted THEN q.level_input - (SELECT coalesce(sum(c.est_input_tokens), 0) FROM claimed c)
                               ELSE q.level_input END,
            level_output = CASE WHEN v_budgeted THEN q.level_output - (SELECT count(*) FROM claimed) * q.output_reserve
                                ELSE q.level_output END
        WHERE q.id = 1 AND EXISTS (SELECT 1 FROM claimed)
    )
    -- In claim order, so they start in it (the first `v_start_now` at once).
    SELECT r.id, r.owner_id, r.kind, r.payload, r.attempts, r.max_attempts, r.lease_token, r.est_input_tokens,
           v_allowance::integer, r.place::text
    FROM ranked r
    ORDER BY r.n;
    RETURN QUERY SELECT NULL::uuid, NULL::bigint, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                        NULL::uuid, NULL::bigint, greatest(v_allowance, 0)::integer, NULL::text WHERE p_busy IS NOT NULL;
END $$;

CREATE OR REPLACE FUNCTION sluice_part_calls(p_job uuid, p_token uuid, p_running integer, p_tokens bigint[], p_outputs bigint[])
RETURNS TABLE (granted integer, go_on boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_s queue_settings;
    v_r record;
    v_owner bigint;
    v_urgent boolean;
    v_free bigint;
    v_lane_room bigint;
    v_share bigint;
    v_others bigint;
    v_others_tokens bigint;
    v_req float8 := 'Infinity';
    v_in float8 := 'Infinity';
    v_out float8 := 'Infinity';
    v_req_full boolean := true;
    v_in_full boolean := true;
    v_out_full boolean := true;
    v_budgeted boolean;
    v_granted integer := 0;
    v_input bigint := 0;
    v_output bigint := 0;
    v_weight bigint := 0;
BEGIN
    SELECT j.owner_id, j.urgent INTO v_owner, v_urgent FROM jobs j
    WHERE j.id = p_job AND j.lease_token = p_token AND j.state = 'running' AND j.cancel_requested_at IS NULL
    FOR UPDATE;
    IF v_owner IS NOT NULL THEN
        PERFORM sluice_lock_lines(ARRAY[v_owner]);
    END IF;
    SELECT * INTO v_s FROM queue_settings q WHERE q.id = 1 FOR UPDATE;
    IF v_owner IS NULL OR NOT v_s.processing_enabled THEN
        RETURN QUERY SELECT 0, false;
        RETURN;
    END IF;
    IF coalesce(cardinality(p_tokens), 0) = 0 THEN
        RETURN QUERY SELECT 0, true;
        RETURN;
    END IF;
    -- Every other owner with a due job (up to the gate's most), each with its first due job's
    -- tokens: one index probe per owner, over the owners' waiting jobs in owner order, and no
    -- more than 1,000 owners read (owners whose jobs all wait for a later retry are passed).
    WITH RECURSIVE owners(owner_id, run_at, est, n) AS (
        (SELECT j.owner_id, j.run_at, j.est_input_tokens, 1 FROM waiting_jobs j ORDER BY j.owner_id, j.run_at, j.id LIMIT 1)
        UNION ALL
        SELECT x.owner_id, x.run_at, x.est, o.n + 1 FROM owners o
        CROSS JOIN LATERAL (
            SELECT j.owner_id, j.run_at, j.est_input_tokens AS est FROM waiting_jobs j
            WHERE j.owner_id > o.owner_id ORDER BY j.owner_id, j.run_at, j.id LIMIT 1
        ) x
        WHERE o.n < 1000
    )
    SELECT count(*), coalesce(sum(o.est), 0) INTO v_others, v_others_tokens
    FROM (SELECT w.est FROM owners w WHERE w.run_at <= now() AND w.owner_id <> v_owner LIMIT 70) o;
    SELECT * INTO v_r FROM sluice_lane_rooms(v_s);
    v_free := v_r.gate - v_r.others - v_others;
    IF p_running = 0 AND v_free < 0 THEN
        -- Between parts with the gate full and another owner waiting: give the slot back.
        RETURN QUERY SELECT 0, false;
        RETURN;
    END IF;
    IF v_urgent THEN
        v_lane_room := v_r.urgent_cap - v_r.urgent_used;
        v_share := sluice_part_share(v_r.urgent_cap, v_r.urgent_owners);
    ELSE
        v_lane_room := v_r.bulk_cap - v_r.bulk_used;
        v_share := sluice_part_share(v_r.bulk_cap, v_r.bulk_owners);
    END IF;
    v_budgeted := coalesce(v_s.limit_requests_per_min, v_s.limit_input_tokens_per_min, v_s.limit_output_tokens_per_min) IS NOT NULL;
    IF v_budgeted THEN
        -- Read, not written: a poll that is granted nothing changes nothing.
        SELECT sluice_refill(v_s.level_requests, v_s.limit_requests_per_min * v_s.limit_share, v_s.limit_burst_secs, v_s.levels_at),
               sluice_refill(v_s.level_input, v_s.limit_input_tokens_per_min * v_s.limit_share, v_s.limit_burst_secs, v_s.levels_at),
               sluice_refill(v_s.level_output, v_s.limit_output_tokens_per_min * v_s.limit_share, v_s.limit_burst_secs, v_s.levels_at)
        INTO v_req, v_in, v_out;
        v_req_full := v_req >= coalesce(v_s.limit_requests_per_min * v_s.limit_share / 60.0 * v_s.limit_burst_secs, 0);
        v_in_full := v_in >= coalesce(v_s.limit_input_tokens_per_min * v_s.limit_share / 60.0 * v_s.limit_burst_secs, 0);
        v_out_full := v_out >= coalesce(v_s.limit_output_tokens_per_min * v_s.limit_share / 60.0 * v_s.limit_burst_secs, 0);
        IF NOT v_urgent THEN
            -- The bulk lane leaves the urgent lane's share of each bucket.
            v_req := v_req - coalesce(v_s.limit_requests_per_min * v_s.limit_share / 60.0 * v_s.limit_burst_secs * v_s.urgent_budget_share, 0);
            v_in := v_in - coalesce(v_s.limit_input_tokens_per_min * v_s.limit_share / 60.0 * v_s.limit_burst_secs * v_s.urgent_budget_share, 0);
            v_out := v_out - coalesce(v_s.limit_output_tokens_per_min * v_s.limit_share / 60.0 * v_s.limit_burst_secs * v_s.urgent_budget_share, 0);
        END IF;
    END IF;
    FOR i IN 1 .. cardinality(p_tokens) LOOP
        -- A call beyond the job's own slot needs a free gate slot, room in its lane and room in
        -- its owner's share of the lane.
        EXIT WHEN p_running + v_granted >= 1 AND (v_free <= 0 OR v_lane_room <= 0 OR p_running + v_granted >= v_share);
        -- A call goes when the buckets are full, whatever its size (one a grant): a part larger
        -- than what the bulk lane may take of a bucket still goes as fast as the bucket refills,
        -- not one at a time. Beyond the job's own slot, only while no other owner's work is due:
        -- a job asking again every moment must not win every full bucket ahead of them.
        EXIT WHEN NOT (v_granted = 0 AND (p_running = 0 OR v_others = 0) AND v_req_full AND v_in_full AND v_out_full)
              AND (v_granted + 1 > v_req - v_others
                   OR v_input + p_tokens[i] > v_in - v_others_tokens
                   OR v_output + coalesce(p_outputs[i], 0) > v_out - v_others * v_s.output_reserve);
        IF p_running + v_granted >= 1 THEN
            v_free := v_free - 1;
            v_lane_room := v_lane_room - 1;
        END IF;
        v_granted := v_granted + 1;
        v_input := v_input + p_tokens[i];
        v_output := v_output + coalesce(p_outputs[i], 0);
        v_weight := v_weight + sluice_token_weight(p_tokens[i]);
    END LOOP;
    IF v_granted > 0 THEN
        UPDATE jobs j SET extra_calls = greatest(0, p_running + v_granted - 1), extra_tokens = j.extra_tokens + v_input
        WHERE j.id = p_job AND j.lease_token = p_token AND j.state = 'running';
        -- Charged like work entering the line: its owner's next entry is tagged after it.
        UPDATE owner_lines l SET finish_tag = greatest(l.finish_tag, v_s.virtual_time) + v_weight
        WHERE l.owner_id = v_owner;
        IF v_budgeted THEN
            UPDATE queue_settings q SET levels_at = greatest(q.levels_at, clock_timestamp()),
                level_requests = sluice_refill(q.level_requests, q.limit_requests_per_min * q.limit_share, q.limit_burst_secs, q.levels_at) - v_granted,
                level_input = sluice_refill(q.level_input, q.limit_input_tokens_per_min * q.limit_share, q.limit_burst_secs, q.levels_at) - v_input,
                level_output = sluice_refill(q.level_output, q.limit_output_tokens_per_min * q.limit_share, q.limit_burst_secs, q.levels_at) - v_output
            WHERE q.id = 1;
        END IF;
    ELSE
        -- Nothing granted: nothing to make durable, no flush to wait for.
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY SELECT v_granted, true;
END $$;
