-- Claims that stay flat as owners grow (issue 15). The fair claim ranks owners by (running jobs,
-- first due waiting job). It found them by walking every owner with waiting jobs, so a claim cost
-- O(waiting owners): 1,878 jobs/s with 100 owners, 255 with 10,000. Each owner's first waiting
-- job (its head) is now kept in `owner_heads`, in the transaction that changes the owner's
-- waiting jobs, and the claim reads the best owners from its index.

-- No job may change between the backfill below and the triggers taking over (an older process
-- still running during a deploy would otherwise leave a job with no head, never claimed).
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;

-- One row per owner that ever waited; job_id is NULL while the owner has no waiting job (rows are
-- never deleted, and are locked in owner order: no deadlock between statements).
CREATE TABLE owner_heads (
    owner_id bigint PRIMARY KEY,
    run_at timestamptz,
    job_id uuid
);
CREATE INDEX owner_heads_order ON owner_heads (run_at, job_id) WHERE job_id IS NOT NULL;

INSERT INTO owner_heads (owner_id, run_at, job_id)
SELECT DISTINCT ON (j.owner_id) j.owner_id, j.run_at, j.id FROM waiting_jobs j ORDER BY j.owner_id, j.run_at, j.id;

-- Recompute the heads of these owners from their waiting jobs (an index probe each). Their rows
-- are locked first, in owner order, and only then read: a statement that waited for another
-- transaction's lock sees what that one committed (READ COMMITTED: a new snapshot per
-- statement). Computing first and waiting after would write a stale head: a claim racing an
-- enqueue for the same owner could leave a waiting job with no head, never claimed.
-- PL/pgSQL, so the plans are cached (a SQL function is planned anew at every call).

-- Lock these owners' lines (their rows, made if missing), in owner order. Admission calls it
-- too, before the owner's `users` row: cancel and replay change the line before their hooks
-- write `users`, so the other order could deadlock with them.
CREATE FUNCTION sluice_lock_lines(p_owners bigint[]) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The fresh read after the lock needs a snapshot per statement.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'jobs may only change under READ COMMITTED (owner_heads would go stale)';
    END IF;
    INSERT INTO owner_heads (owner_id)
    SELECT DISTINCT o FROM unnest(p_owners) o ORDER BY o
    ON CONFLICT (owner_id) DO NOTHING;
    PERFORM 1 FROM owner_heads h WHERE h.owner_id = ANY (p_owners) ORDER BY h.owner_id FOR UPDATE;
END $$;

CREATE FUNCTION sluice_refresh_heads(p_owners bigint[]) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF cardinality(p_owners) = 0 THEN
        RETURN;
    END IF;
    PERFORM sluice_lock_lines(p_owners);
    UPDATE owner_heads h SET run_at = f.run_at, job_id = f.id
    FROM (
        SELECT o.owner_id, first.run_at, first.id
        FROM unnest(p_owners) o(owner_id)
        LEFT JOIN LATERAL (
            SELECT j.run_at, j.id FROM waiting_jobs j WHERE j.owner_id = o.owner_id ORDER BY j.run_at, j.id LIMIT 1
        ) first ON true
    ) f
    WHERE h.owner_id = f.owner_id AND (h.run_at, h.job_id) IS DISTINCT FROM (f.run_at, f.id);
END $$;

-- Statement triggers with the changed rows: one call per statement (a claim of 24 jobs is one
-- refresh), and only owners whose waiting jobs changed are touched (a completion touches none).
CREATE FUNCTION sluice_heads_after_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM sluice_refresh_heads(ARRAY(
        SELECT DISTINCT n.owner_id FROM new_jobs n WHERE n.state IN ('queued', 'retrying')));
    RETURN NULL;
END $$;

CREATE FUNCTION sluice_heads_after_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM sluice_refresh_heads(ARRAY(
        SELECT DISTINCT n.owner_id FROM new_jobs n JOIN old_jobs o ON o.id = n.id
        WHERE (o.state IN ('queued', 'retrying')) <> (n.state IN ('queued', 'retrying'))
           OR (n.state IN ('queued', 'retrying') AND o.run_at <> n.run_at)));
    RETURN NULL;
END $$;

CREATE FUNCTION sluice_heads_after_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM sluice_refresh_heads(ARRAY(
        SELECT DISTINCT o.owner_id FROM old_jobs o WHERE o.state IN ('queued', 'retrying')));
    RETURN NULL;
END $$;

CREATE FUNCTION sluice_heads_after_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE owner_heads SET run_at = NULL, job_id = NULL WHERE job_id IS NOT NULL;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_heads_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION sluice_heads_after_insert();
CREATE TRIGGER jobs_heads_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION sluice_heads_after_update();
CREATE TRIGGER jobs_heads_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS old_jobs FOR EACH STATEMENT EXECUTE FUNCTION sluice_heads_after_delete();
CREATE TRIGGER jobs_heads_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_heads_after_truncate();

-- Owners with waiting jobs, now a read of the heads (the place in line uses it).
CREATE OR REPLACE FUNCTION sluice_waiting_owners() RETURNS SETOF bigint LANGUAGE sql STABLE AS $$
    SELECT h.owner_id FROM owner_heads h WHERE h.job_id IS NOT NULL
$$;

-- The claim, as in 20261201000002 (an applied migration never changes, so its text repeats
-- here), with the rows to lock found by their key, and the best owners read from `owner_heads`: the same choice as before (held to the
-- plain definition of fairness on random lines in engine/tests/fairness.rs), at a cost that does
-- not grow with the number of owners waiting.
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
        SELECT j.owner_id, count(*) AS running FROM jobs j WHERE j.state = 'running' GROUP BY j.owner_id
    ),
    -- The owners fairness serves first: least running, then the oldest due head. Owners with
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
