-- The fair pick, bounded (issue 38). The claim ranked up to free-slots jobs of every owner it
-- might serve and sorted them all: 20,000 candidates for a claim of 500 across 100 owners, 42 of
-- its 70 ms. A job's score is its owner's running weight plus its rank among the owner's due
-- jobs, so with k owners in play no job scoring above top = (their highest running weight) +
-- ceil(free / k) is needed while each owner still has jobs up to top: those owners alone hold
-- k * ceil(free / k) >= free jobs scoring at most top. Each owner is read up to top, so the pick
-- is exact whenever it finds `free` candidates, or when no owner was cut at top (then every due
-- job of these owners is a candidate). Otherwise (some owners have only a few jobs) it is read
-- again with no bound, as before.
CREATE FUNCTION sluice_fair_pick(p_free bigint, p_bounded boolean,
                                 OUT ids uuid[], OUT candidates bigint, OUT cut boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    WITH served AS (
        SELECT j.owner_id, sum(sluice_token_weight(j.est_input_tokens + j.extra_tokens))::bigint AS running
        FROM jobs j WHERE j.state = 'running' GROUP BY j.owner_id
    ),
    -- The owners fairness serves first: least weight running, then the oldest due head. Owners with
    -- nothing running come from the heads' index in order (skipping at most the running owners);
    -- those running something are at most the gate's worth.
    best_owners AS (
        SELECT b.owner_id, b.running FROM (
            (SELECT h.owner_id, 0::bigint AS running, h.run_at, h.job_id
             FROM owner_heads h
             WHERE h.job_id IS NOT NULL AND h.run_at <= now()
               -- `NOT IN`, a hashed subplan: with a batch fetched ahead hundreds of owners run
               -- something, and `NOT EXISTS` was a nested loop over them for every head read
               -- (310,000 comparisons in a claim of 500 with 10,000 owners waiting).
               AND h.owner_id NOT IN (SELECT s.owner_id FROM served s)
             ORDER BY h.run_at, h.job_id
             LIMIT p_free)
            UNION ALL
            -- By key (`OFFSET 0` keeps the tests below out of the lookup): the generic plan took
            -- the order index and read half of it for each running owner.
            SELECT s.owner_id, s.running, h.run_at, h.job_id
            FROM served s
            CROSS JOIN LATERAL (SELECT h.run_at, h.job_id FROM owner_heads h WHERE h.owner_id = s.owner_id OFFSET 0) h
            WHERE h.job_id IS NOT NULL AND h.run_at <= now()
        ) b
        ORDER BY b.running, b.run_at, b.job_id
        LIMIT p_free
    ),
    bound AS (
        SELECT CASE WHEN p_bounded THEN max(b.running) + ceil(p_free::float8 / nullif(count(*), 0))::bigint END AS top
        FROM best_owners b
    ),
    owner_caps AS (
        SELECT b.owner_id, b.running, least(p_free, coalesce(t.top - b.running, p_free)) AS cap
        FROM best_owners b CROSS JOIN bound t
    ),
    ranked AS (
        SELECT c.id, c.run_at,
               o.running + row_number() OVER (PARTITION BY o.owner_id ORDER BY c.run_at, c.id) AS score,
               count(*) OVER (PARTITION BY o.owner_id) = o.cap AND o.cap < p_free AS cut
        FROM owner_caps o
        CROSS JOIN LATERAL (
            SELECT j.id, j.run_at FROM waiting_jobs j
            WHERE j.owner_id = o.owner_id AND j.run_at <= now()
            ORDER BY j.run_at, j.id
            LIMIT o.cap
        ) c
    )
    SELECT ARRAY(SELECT r.id FROM ranked r ORDER BY r.score, r.run_at, r.id LIMIT p_free),
           (SELECT count(*) FROM ranked),
           coalesce((SELECT bool_or(r.cut) FROM ranked r), false)
    INTO ids, candidates, cut;
END $$;

-- The claim, as in 20261209000001 (an applied migration never changes, so its text repeats
-- here), with its pick from `sluice_fair_pick`.
CREATE OR REPLACE FUNCTION sluice_claim(p_max bigint, p_worker text, p_lease_secs float8,
                             p_busy bigint DEFAULT NULL, p_prefetch bigint DEFAULT 0)
RETURNS TABLE (id uuid, owner_id bigint, kind text, payload jsonb, attempts integer, max_attempts integer,
               lease_token uuid, est_input_tokens bigint, gate_allowance integer)
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
    v_ids uuid[];
    v_candidates bigint;
    v_cut boolean;
BEGIN
    SELECT * INTO v_s FROM queue_settings q WHERE q.id = 1 FOR UPDATE;
    IF NOT v_s.processing_enabled THEN
        RETURN QUERY SELECT NULL::uuid, NULL::bigint, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                            NULL::uuid, NULL::bigint, 0 WHERE p_busy IS NOT NULL;
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
                            NULL::uuid, NULL::bigint, greatest(v_allowance, 0)::integer WHERE p_busy IS NOT NULL;
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
    SELECT p.ids, p.candidates, p.cut INTO v_ids, v_candidates, v_cut FROM sluice_fair_pick(v_free, true) p;
    IF v_candidates < v_free AND v_cut THEN
        SELECT p.ids INTO v_ids FROM sluice_fair_pick(v_free, false) p;
    END IF;
    RETURN QUERY
    WITH chosen AS (
        SELECT c.id, c.ord FROM unnest(v_ids) WITH ORDINALITY AS c(id, ord)
    ),
    -- `= ANY (array)`, not `IN (SELECT ..)`: the generic plan of the latter read every waiting
    -- job (a sequential scan, 4.5 of a claim's 7 ms with 20,000 waiting).
    locked AS (
        SELECT j.id, j.est_input_tokens FROM waiting_jobs j
        WHERE j.id = ANY (v_ids)
        FOR UPDATE SKIP LOCKED
    ),
    in_order AS (
        SELECT l.id,
               row_number() OVER w AS n,
               sum(l.est_input_tokens) OVER w AS input_upto
        FROM locked l JOIN chosen c ON c.id = l.id
        WINDOW w AS (ORDER BY c.ord)
    ),
    fitting AS (
        SELECT o.id FROM in_order o
        WHERE (o.n <= v_req OR (o.n = 1 AND v_req_full))
          AND (o.input_upto <= v_in OR (o.n = 1 AND v_in_full))
          AND (o.n * v_s.output_reserve <= v_out OR (o.n = 1 AND v_out_full))
    ),
    claimed AS (
        UPDATE jobs j
        SET state = 'running', attempts = j.attempts + 1, lease_owner = p_worker, extra_calls = 0, extra_tokens = 0,
            lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => p_lease_secs),
            started_at = coalesce(j.started_at, now()), updated_at = now()
        FROM fitting WHERE j.id = fitting.id
        RETURNING j.id, j.owner_id, j.kind, j.payload, j.attempts, j.max_attempts, j.lease_token, j.est_input_tokens
    ),
    attempt_rows AS (
        INSERT INTO job_attempts (id, job_id, attempt, worker)
        SELECT c.lease_token, c.id, c.attempts, p_worker FROM claimed c
    ),
    reserved AS (
        UPDATE queue_settings q
        SET level_requests = q.level_requests - (SELECT count(*) FROM claimed),
            level_input = q.level_input - (SELECT coalesce(sum(c.est_input_tokens), 0) FROM claimed c),
            level_output = q.level_output - (SELECT count(*) FROM claimed) * q.output_reserve
        WHERE q.id = 1 AND v_budgeted
    )
    SELECT c.id, c.owner_id, c.kind, c.payload, c.attempts, c.max_attempts, c.lease_token, c.est_input_tokens,
           v_allowance::integer
    FROM claimed c;
    RETURN QUERY SELECT NULL::uuid, NULL::bigint, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                        NULL::uuid, NULL::bigint, greatest(v_allowance, 0)::integer WHERE p_busy IS NOT NULL;
END $$;

