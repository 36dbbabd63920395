-- An attempt's row is written once, when the attempt ends (done, failed, retried, handed back,
-- canceled, rescued), from the job's lease: its token (the row's id and the fence), its number,
-- its worker and its start. The claim no longer inserts a row that every ending then updates
-- (one insert and three index entries a job instead of an insert, an update and five). While
-- it runs, the attempt is the job's lease itself; its start is kept on the job.
ALTER TABLE jobs ADD COLUMN claimed_at timestamptz;

-- Attempts running now keep their start; their open rows go (their ending writes them anew).
-- Locked first, as the earlier migrations do, so a process of the previous release cannot
-- claim or end an attempt in between.
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;
UPDATE jobs j SET claimed_at = a.started_at FROM job_attempts a WHERE a.id = j.lease_token AND j.state = 'running';
DELETE FROM job_attempts WHERE outcome IS NULL;
-- A row is an ended attempt. This also stops a claim of the previous release that was already
-- running the old function when this commits (it waited on the lock above) from writing an
-- open row that the attempt's ending would then meet as a duplicate key: its insert fails, the
-- claim is rolled back whole, and the worker claims again with the new function. Rows from
-- before are not checked (NOT VALID): some ended attempts of old releases lack a finish time.
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_ended CHECK (outcome IS NOT NULL AND finished_at IS NOT NULL) NOT VALID;

-- Rows are only inserted now: pages filled.
ALTER TABLE job_attempts SET (fillfactor = 100);

-- The claim, as in 20261212000001 (an applied migration never changes, so its text repeats
-- here), with no attempt row: the attempt's start is kept on the job.
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
    RETURN QUERY
    -- The due jobs with the lowest tags, in one walk of the tags' index; a job another claim
    -- holds is passed over. Locked rows that the budget leaves out stay waiting.
    WITH locked AS (
        SELECT j.id, j.est_input_tokens, j.fair_tag, j.run_at FROM waiting_jobs j
        WHERE j.run_at <= now()
        ORDER BY j.fair_tag, j.run_at, j.id
        LIMIT v_free
        FOR UPDATE SKIP LOCKED
    ),
    in_order AS (
        SELECT l.id,
               row_number() OVER w AS n,
               sum(l.est_input_tokens) OVER w AS input_upto
        FROM locked l
        WINDOW w AS (ORDER BY l.fair_tag, l.run_at, l.id)
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
            started_at = coalesce(j.started_at, now()), claimed_at = now(), updated_at = now()
        FROM fitting WHERE j.id = fitting.id
        RETURNING j.id, j.owner_id, j.kind, j.payload, j.attempts, j.max_attempts, j.lease_token, j.est_input_tokens,
                  j.fair_tag
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
    SELECT c.id, c.owner_id, c.kind, c.payload, c.attempts, c.max_attempts, c.lease_token, c.est_input_tokens,
           v_allowance::integer
    FROM claimed c;
    RETURN QUERY SELECT NULL::uuid, NULL::bigint, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                        NULL::uuid, NULL::bigint, greatest(v_allowance, 0)::integer WHERE p_busy IS NOT NULL;
END $$;
