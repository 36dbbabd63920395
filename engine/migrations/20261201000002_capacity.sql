-- Provider capacity (issue 13): each job's input-token estimate, the provider's limits and the
-- token budget shared by every process, and the adaptive gate.

-- Estimated input tokens of the job's provider request: from the upload's size and type, then
-- refined from the extracted text. The claim reserves it from the budget.
ALTER TABLE jobs ADD COLUMN est_input_tokens bigint NOT NULL DEFAULT 0 CHECK (est_input_tokens >= 0);
-- The views' `*` was fixed when they were made; the new column goes at the end.
CREATE OR REPLACE VIEW waiting_jobs AS SELECT * FROM jobs WHERE state IN ('queued', 'retrying');
CREATE OR REPLACE VIEW dead_letters AS SELECT * FROM jobs WHERE state = 'failed' AND discarded_at IS NULL;

-- The budget lives in the settings row the claim already locks, so reserving from it is part of
-- the same serialised claim. Limits are per minute (NULL = unlimited); each is a token bucket
-- holding at most `burst_secs` of its rate (60: a minute's worth, as Anthropic's buckets do),
-- refilled continuously. Levels may go below zero when a job turns out larger than reserved.
ALTER TABLE queue_settings
    ADD COLUMN limit_requests_per_min bigint CHECK (limit_requests_per_min > 0),
    ADD COLUMN limit_input_tokens_per_min bigint CHECK (limit_input_tokens_per_min > 0),
    ADD COLUMN limit_output_tokens_per_min bigint CHECK (limit_output_tokens_per_min > 0),
    ADD COLUMN limit_burst_secs float8 NOT NULL DEFAULT 60 CHECK (limit_burst_secs > 0),
    -- The share of each limit the budget plans to use: the time between a claim and its request
    -- varies, so running at exactly the limit would meet the provider's bucket empty now and then.
    ADD COLUMN limit_share float8 NOT NULL DEFAULT 0.95 CHECK (limit_share > 0 AND limit_share <= 1),
    -- Output tokens reserved per request until its real usage is known.
    ADD COLUMN output_reserve bigint NOT NULL DEFAULT 1024 CHECK (output_reserve >= 0),
    ADD COLUMN level_requests float8 NOT NULL DEFAULT 'Infinity',
    ADD COLUMN level_input float8 NOT NULL DEFAULT 'Infinity',
    ADD COLUMN level_output float8 NOT NULL DEFAULT 'Infinity',
    ADD COLUMN levels_at timestamptz NOT NULL DEFAULT now(),
    -- The adaptive gate: after a 429/529 the gate is cut to `adaptive_gate` at `adaptive_since`
    -- and grows back by one slot every `adaptive_recover_secs` (NULL = not reduced).
    ADD COLUMN adaptive_gate integer CHECK (adaptive_gate >= 1),
    ADD COLUMN adaptive_since timestamptz,
    ADD COLUMN adaptive_reason text,
    ADD COLUMN adaptive_recover_secs float8 NOT NULL DEFAULT 10 CHECK (adaptive_recover_secs > 0);

-- A bucket's level now: refilled at rate/60 a second since `at`, up to rate/60 * burst.
-- VOLATILE: it reads the clock (clock_timestamp), not the transaction's time.
CREATE FUNCTION sluice_refill(p_level float8, p_rate float8, p_burst float8, p_at timestamptz)
RETURNS float8 LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p_rate IS NULL THEN 'Infinity'::float8
                ELSE least(p_rate / 60.0 * p_burst,
                           p_level + p_rate / 60.0 * greatest(0, extract(epoch FROM clock_timestamp() - p_at)))
           END
$$;

-- The gate in force: the configured one, or the adaptive one while it grows back (counted in
-- float8, so a cut long ago cannot overflow an integer).
CREATE FUNCTION sluice_effective_gate(s queue_settings) RETURNS integer LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN s.adaptive_gate IS NULL THEN s.gate_size
                ELSE least(s.gate_size::float8, s.adaptive_gate + floor(
                    greatest(0, extract(epoch FROM clock_timestamp() - s.adaptive_since))::float8 / s.adaptive_recover_secs))::integer
           END
$$;

-- The claim, as in 20261130000001 (an applied migration never changes, so its text repeats
-- here), with the effective gate and the token budget: of the jobs fairness picks, the longest
-- prefix whose requests, input tokens and reserved output tokens fit what the buckets hold is
-- claimed, and reserved from them. A job larger than a whole bucket goes when the bucket is full.
-- A job that does not fit stays waiting without using an attempt.
DROP FUNCTION sluice_claim(bigint, text, float8);
CREATE FUNCTION sluice_claim(p_max bigint, p_worker text, p_lease_secs float8)
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
    SELECT least(p_max, sluice_effective_gate(v_s) - count(*)) INTO v_free FROM jobs j WHERE j.state = 'running';
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
        SELECT j.owner_id, count(*) AS running FROM jobs j WHERE j.state = 'running' GROUP BY j.owner_id
    ),
    best_owners AS (
        SELECT o.owner_id, coalesce(s.running, 0) AS running
        FROM sluice_waiting_owners() o(owner_id)
        CROSS JOIN LATERAL (
            SELECT j.run_at, j.id FROM waiting_jobs j
            WHERE j.owner_id = o.owner_id AND j.run_at <= now()
            ORDER BY j.run_at, j.id LIMIT 1
        ) first_due
        LEFT JOIN served s ON s.owner_id = o.owner_id
        ORDER BY coalesce(s.running, 0), first_due.run_at, first_due.id
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
    locked AS (
        SELECT j.id, j.est_input_tokens FROM waiting_jobs j
        WHERE j.id IN (SELECT c.id FROM chosen c)
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
        SET state = 'running', attempts = j.attempts + 1, lease_owner = p_worker,
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
