-- Parts side by side (issue 33). A document in parts was one claim per part, one part at a
-- time: a 250K-token translation ran at a tenth of the pace the provider's limits allow. Now the
-- claim of a job in parts runs its parts at once, as many as the gate and the token budget
-- allow after every other owner waiting has been served: each call beyond the job's first holds
-- a gate slot of its own (`extra_calls`), and each part's tokens are reserved from the budget
-- when it starts (`sluice_part_calls`). A finished part keeps the job's place: the job stays
-- running, so it never goes back to the end of the line between parts.

-- Checks added NOT VALID: a new column's default passes them, and validating would scan the
-- table under its exclusive lock.
ALTER TABLE jobs ADD COLUMN extra_calls integer NOT NULL DEFAULT 0,
    -- The input tokens of those extra calls, for fairness by tokens in flight (the job's own
    -- `est_input_tokens` stays what its next claim reserves).
    ADD COLUMN extra_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD CONSTRAINT jobs_extra_calls_check CHECK (extra_calls >= 0 AND extra_tokens >= 0) NOT VALID;
-- A part's own failed attempts (3 per part, as for a job): the job's attempts count claims.
ALTER TABLE job_parts ADD COLUMN failures integer NOT NULL DEFAULT 0;
ALTER TABLE job_parts ADD CONSTRAINT job_parts_failures_check CHECK (failures >= 0) NOT VALID;

-- The claim, as in 20261202000001 (an applied migration never changes, so its text repeats
-- here), counting the extra calls of running jobs against the gate, and starting each claim
-- with none.
CREATE OR REPLACE FUNCTION sluice_claim(p_max bigint, p_worker text, p_lease_secs float8)
RETURNS TABLE (id uuid, owner_id bigint, kind text, payload jsonb, attempts integer, max_attempts integer,
               lease_token uuid, est_input_tokens bigint)
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
BEGIN
    SELECT * INTO v_s FROM queue_settings q WHERE q.id = 1 FOR UPDATE;
    IF NOT v_s.processing_enabled THEN
        RETURN;
    END IF;
    -- A running job holds one slot, and one more for each call beyond its first (parts side by side).
    SELECT least(p_max, sluice_effective_gate(v_s) - count(*) - coalesce(sum(j.extra_calls), 0)) INTO v_free
    FROM jobs j WHERE j.state = 'running';
    IF v_free <= 0 THEN
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
               AND NOT EXISTS (SELECT 1 FROM served s WHERE s.owner_id = h.owner_id)
             ORDER BY h.run_at, h.job_id
             LIMIT v_free)
            UNION ALL
            SELECT h.owner_id, s.running, h.run_at, h.job_id
            FROM served s JOIN owner_heads h ON h.owner_id = s.owner_id
            WHERE h.job_id IS NOT NULL AND h.run_at <= now()
        ) b
        ORDER BY b.running, b.run_at, b.job_id
        LIMIT v_free
    ),
    candidates AS (
        SELECT c.id, c.run_at,
               b.running + row_number() OVER (PARTITION BY b.owner_id ORDER BY c.run_at, c.id) AS score
        FROM best_owners b
        CROSS JOIN LATERAL (
            SELECT j.id, j.run_at FROM waiting_jobs j
            WHERE j.owner_id = b.owner_id AND j.run_at <= now()
            ORDER BY j.run_at, j.id
            LIMIT v_free
        ) c
    ),
    chosen AS (
        SELECT c.id, c.score, c.run_at FROM candidates c ORDER BY c.score, c.run_at, c.id LIMIT v_free
    ),
    -- `= ANY (ARRAY(..))`, not `IN (SELECT ..)`: the generic plan of the latter read every
    -- waiting job (a sequential scan, 4.5 of a claim's 7 ms with 20,000 waiting).
    locked AS (
        SELECT j.id, j.est_input_tokens FROM waiting_jobs j
        WHERE j.id = ANY (ARRAY(SELECT c.id FROM chosen c))
        FOR UPDATE SKIP LOCKED
    ),
    in_order AS (
        SELECT l.id,
               row_number() OVER w AS n,
               sum(l.est_input_tokens) OVER w AS input_upto
        FROM locked l JOIN chosen c ON c.id = l.id
        WINDOW w AS (ORDER BY c.score, c.run_at, c.id)
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
    SELECT c.id, c.owner_id, c.kind, c.payload, c.attempts, c.max_attempts, c.lease_token, c.est_input_tokens
    FROM claimed c;
END $$;

-- More calls for a running job in parts: `p_running` of its calls run now; it wants to start
-- parts of `p_tokens` input and `p_outputs` expected output tokens, in order. The job's row is
-- locked first, then the settings row (the order account deletion takes them), so grants are
-- serialised with the claims. Every other owner with a due waiting job keeps a gate slot and
-- its head's tokens (fairness: their documents start within one claim cycle, whatever the size
-- of this one); of the rest, the longest prefix that fits the gate and the buckets is granted
-- and reserved. A call on the job's own slot (none running) needs no new gate slot, only
-- tokens, and goes when the buckets are full whatever its size, as a claim does. `go_on` is
-- false once processing is paused, the job is to be canceled, the attempt lost its lease, or
-- (between parts, nothing running) the gate is full while another owner waits: the job then
-- goes back in line, and the claim decides again.
CREATE FUNCTION sluice_part_calls(p_job uuid, p_token uuid, p_running integer, p_tokens bigint[], p_outputs bigint[])
RETURNS TABLE (granted integer, go_on boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_s queue_settings;
    v_owner bigint;
    v_free bigint;
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
BEGIN
    -- Grants and polls are cheap to lose in a crash: no wait for the WAL flush under the lock.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT j.owner_id INTO v_owner FROM jobs j
    WHERE j.id = p_job AND j.lease_token = p_token AND j.state = 'running' AND j.cancel_requested_at IS NULL
    FOR UPDATE;
    SELECT * INTO v_s FROM queue_settings q WHERE q.id = 1 FOR UPDATE;
    IF v_owner IS NULL OR NOT v_s.processing_enabled THEN
        RETURN QUERY SELECT 0, false;
        RETURN;
    END IF;
    IF coalesce(cardinality(p_tokens), 0) = 0 THEN
        RETURN QUERY SELECT 0, true;
        RETURN;
    END IF;
    SELECT count(*), coalesce(sum(w.est_input_tokens), 0) INTO v_others, v_others_tokens FROM (
        SELECT h.job_id FROM owner_heads h
        WHERE h.job_id IS NOT NULL AND h.run_at <= now() AND h.owner_id <> v_owner
        ORDER BY h.run_at, h.job_id LIMIT 70
    ) o JOIN jobs w ON w.id = o.job_id;
    SELECT sluice_effective_gate(v_s) - count(*) - coalesce(sum(j.extra_calls), 0) - v_others INTO v_free
    FROM jobs j WHERE j.state = 'running';
    IF p_running = 0 AND v_free < 0 THEN
        -- Between parts with the gate full and another owner waiting: give the slot back.
        RETURN QUERY SELECT 0, false;
        RETURN;
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
    END IF;
    FOR i IN 1 .. cardinality(p_tokens) LOOP
        -- A call beyond the job's own slot needs a free gate slot.
        EXIT WHEN p_running + v_granted >= 1 AND v_free <= 0;
        -- The call on the job's own slot goes when the buckets are full, whatever its size.
        EXIT WHEN NOT (p_running = 0 AND v_granted = 0 AND v_req_full AND v_in_full AND v_out_full)
              AND (v_granted + 1 > v_req - v_others
                   OR v_input + p_tokens[i] > v_in - v_others_tokens
                   OR v_output + coalesce(p_outputs[i], 0) > v_out - v_others * v_s.output_reserve);
        IF p_running + v_granted >= 1 THEN
            v_free := v_free - 1;
        END IF;
        v_granted := v_granted + 1;
        v_input := v_input + p_tokens[i];
        v_output := v_output + coalesce(p_outputs[i], 0);
    END LOOP;
    IF v_granted > 0 THEN
        UPDATE jobs j SET extra_calls = greatest(0, p_running + v_granted - 1), extra_tokens = j.extra_tokens + v_input
        WHERE j.id = p_job AND j.lease_token = p_token AND j.state = 'running';
        IF v_budgeted THEN
            UPDATE queue_settings q SET levels_at = greatest(q.levels_at, clock_timestamp()),
                level_requests = sluice_refill(q.level_requests, q.limit_requests_per_min * q.limit_share, q.limit_burst_secs, q.levels_at) - v_granted,
                level_input = sluice_refill(q.level_input, q.limit_input_tokens_per_min * q.limit_share, q.limit_burst_secs, q.levels_at) - v_input,
                level_output = sluice_refill(q.level_output, q.limit_output_tokens_per_min * q.limit_share, q.limit_burst_secs, q.levels_at) - v_output
            WHERE q.id = 1;
        END IF;
    END IF;
    RETURN QUERY SELECT v_granted, true;
END $$;

-- The retry budget counts the time a job could have run (issue 33): from its acceptance, or
-- from its last part stored (the budget runs per part, not across a whole document), less the
-- time processing was paused meanwhile (a job paused for 7 days and then hit by one transient
-- error retries).
CREATE FUNCTION sluice_retry_age(p_job uuid, p_accepted timestamptz) RETURNS float8
LANGUAGE sql STABLE AS $$
    WITH since AS (
        SELECT greatest(p_accepted, (SELECT max(p.done_at) FROM job_parts p WHERE p.job_id = p_job)) AS t
    )
    SELECT extract(epoch FROM now() - s.t)::float8 - coalesce((
        SELECT sum(extract(epoch FROM least(coalesce(z.resumed_at, now()), now()) - greatest(z.paused_at, s.t)))::float8
        FROM processing_pauses z
        WHERE coalesce(z.resumed_at, now()) > s.t AND z.paused_at < now()
    ), 0)
    FROM since s
$$;
