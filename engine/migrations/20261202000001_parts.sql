-- Documents beyond one provider call, processed in parts (issue 22).
--
-- A job whose text does not fit one call is split into parts (`job_parts`, level 0). The job is
-- claimed once per part: each claim is one provider call under its own lease, gate slot and
-- token reservation (the job's `est_input_tokens` is set to the next part's before it goes back
-- in line), retried on its own (the job's attempts start again for each part), and the part's
-- output is stored in the transaction that puts the job back in line, so a crash never redoes
-- a finished part. Summaries combine by reducing: level n+1 is made of level n's outputs, until
-- one part is left. The user sees one job: one debit, one state, at most one refund.

CREATE TABLE job_parts (
    job_id        uuid    NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    -- 0: the document's own text; n + 1: the outputs of level n, combined.
    level         integer NOT NULL CHECK (level >= 0),
    idx           integer NOT NULL CHECK (idx >= 0),
    -- The text the provider reads (the part's body) and the context before it (overlap).
    body          text    NOT NULL,
    overlap       text    NOT NULL DEFAULT '',
    est_tokens    bigint  NOT NULL CHECK (est_tokens >= 0),
    output        text,
    input_tokens  bigint,
    output_tokens bigint,
    -- The attempt that wrote the output (its lease token).
    attempt_id    uuid,
    done_at       timestamptz,
    PRIMARY KEY (job_id, level, idx),
    CHECK ((output IS NULL) = (done_at IS NULL))
);

-- The next part of a job: its first part not done.
CREATE INDEX job_parts_pending ON job_parts (job_id, level, idx) WHERE output IS NULL;

-- Progress for the job's pages and the API: parts of the document, and how many are done.
ALTER TABLE jobs
    ADD COLUMN parts_total integer CHECK (parts_total > 1),
    ADD COLUMN parts_done  integer NOT NULL DEFAULT 0 CHECK (parts_done >= 0),
    -- 'reading' the document's parts or 'combining' their outputs.
    ADD COLUMN parts_stage text CHECK (parts_stage IN ('parts', 'combining'));

-- Fairness by tokens: a running job weighs one slot per started 25,000 input tokens (the first
-- price step), so an owner running a 100K-token part counts as four small documents.
CREATE FUNCTION sluice_token_weight(p_tokens bigint) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(1, (greatest(p_tokens, 0) + 24999) / 25000)
$$;

-- The claim, as in 20261201000003 (an applied migration never changes, so its text repeats
-- here), with owners ordered by their running jobs' token weight instead of their count.
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
        SELECT j.owner_id, sum(sluice_token_weight(j.est_input_tokens))::bigint AS running
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

-- Worker processes and their slots (issue 22: "worker slots follow the gate"), refreshed by
-- each process's heartbeat, so the admin page can set the slots alive across processes beside
-- the gate: the concurrency in effect is the smaller of the two.
CREATE TABLE worker_processes (
    name           text PRIMARY KEY,
    slots          integer     NOT NULL CHECK (slots >= 0),
    heartbeat_secs float8      NOT NULL CHECK (heartbeat_secs > 0),
    started_at     timestamptz NOT NULL DEFAULT now(),
    seen_at        timestamptz NOT NULL DEFAULT now()
);
