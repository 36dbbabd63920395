-- What a drained job costs Postgres in four shapes of queue storage, measured serially in one
-- session (issue 38: is a narrow table of ready work worth its redesign?). Each cycle claims 500
-- jobs and then ends them, each half committed; the figures are wall-clock µs a job.
--
--   A  Sluice as it is: `sluice_claim_with_places` (fair order, gate, budget) updates the job's row to
--      running; the completion updates it to done with its result and the successful
--      attempt's token and worker (issue 38's eighth step: no attempt row for a success).
--   B  A narrow table of ready work beside the jobs: the claim deletes from it and inserts a
--      lease; the completion deletes the lease, updates the job's row once (done, its result,
--      its attempt count) and inserts the attempt row.
--   C  graphile-worker's shape (its `_private_jobs`, 0.18): the claim updates a narrow row,
--      the completion deletes it; no result and no attempt are kept.
--   D  C's claim, and an end that keeps what Sluice keeps without touching a wide row: the
--      narrow row deleted, the outcome (result, finish) and the attempt row inserted.
--
-- `cargo xtask bench shapes` runs it on a private cluster's freshly migrated database, named
-- bench_shapes; it refuses any other, and one with jobs.

\set ON_ERROR_STOP on
DO $$ BEGIN
    IF current_database() <> 'bench_shapes' OR EXISTS (SELECT 1 FROM jobs) THEN
        RAISE EXCEPTION 'storage_shapes.sql changes settings and empties the jobs table: run it on a fresh database named bench_shapes';
    END IF;
END $$;
-- Every commit alike: A's claim commits without waiting for the WAL's flush (`sluice_claim_with_places`),
-- so all of them do, and the figures are the statements' cost, not the disk's.
SET synchronous_commit = off;

UPDATE queue_settings SET gate_size = 70;

-- B's tables, as a redesign would have them.
CREATE TABLE shape_ready (job_id uuid PRIMARY KEY, fair_tag bigint NOT NULL, run_at timestamptz NOT NULL,
                          est_input_tokens bigint NOT NULL);
CREATE INDEX shape_ready_order ON shape_ready (fair_tag, run_at, job_id);
CREATE TABLE shape_leases (job_id uuid PRIMARY KEY, token uuid NOT NULL, owner text NOT NULL,
                           expires_at timestamptz NOT NULL, claimed_at timestamptz NOT NULL, attempt int NOT NULL);
CREATE INDEX shape_leases_expiry ON shape_leases (expires_at);

-- C's table: graphile-worker 0.18's columns, constraints and indexes.
CREATE TABLE shape_graphile (
    id bigserial PRIMARY KEY, job_queue_id int, task_id int NOT NULL, payload json NOT NULL DEFAULT '{}',
    priority smallint NOT NULL DEFAULT 0, run_at timestamptz NOT NULL DEFAULT now(),
    attempts smallint NOT NULL DEFAULT 0, max_attempts smallint NOT NULL DEFAULT 25, last_error text,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(), key text,
    locked_at timestamptz, locked_by text, revision int NOT NULL DEFAULT 0, flags jsonb,
    is_available boolean GENERATED ALWAYS AS ((locked_at IS NULL) AND (attempts < max_attempts)) STORED NOT NULL,
    CHECK (length(key) > 0 AND length(key) <= 512), CHECK (max_attempts >= 1));
CREATE UNIQUE INDEX shape_graphile_key ON shape_graphile (key) INCLUDE (id);
CREATE INDEX shape_graphile_main ON shape_graphile (priority, run_at) INCLUDE (id, task_id, job_queue_id)
    WHERE is_available = true;
-- D's: the same, apart, so neither claim walks the other's entries.
CREATE TABLE shape_kept (LIKE shape_graphile INCLUDING ALL);

-- D's outcomes, written once (the job's wide row untouched).
CREATE TABLE shape_outcomes (job_id bigint PRIMARY KEY, state text NOT NULL, result jsonb, input_tokens bigint,
                             output_tokens bigint, finished_at timestamptz NOT NULL);
CREATE INDEX shape_outcomes_finished ON shape_outcomes (finished_at);
CREATE TABLE shape_attempts (id uuid PRIMARY KEY, job_id bigint NOT NULL, attempt int NOT NULL, worker text NOT NULL,
                             started_at timestamptz NOT NULL, finished_at timestamptz NOT NULL, outcome text NOT NULL);
CREATE INDEX shape_attempts_by_job ON shape_attempts (job_id, started_at);
CREATE INDEX shape_attempts_finished ON shape_attempts (finished_at);

-- 40,000 jobs for each shape: A's due now, B's in the jobs table too (not due, so A never
-- takes them) with their ready rows, C's in its own table.
INSERT INTO jobs (owner_id, kind, payload) SELECT g % 100 + 1, 'job', '{"n":1}' FROM generate_series(1, 40000) g;
INSERT INTO jobs (owner_id, kind, payload, run_at)
    SELECT g % 100 + 1, 'job', '{"n":1}', now() + interval '1 year' FROM generate_series(1, 40000) g;
INSERT INTO shape_ready SELECT id, fair_tag, now(), est_input_tokens FROM jobs WHERE run_at > now() + interval '300 days';
INSERT INTO shape_graphile (task_id, payload) SELECT 1, '{"n":1}' FROM generate_series(1, 40000);
INSERT INTO shape_kept (task_id, payload) SELECT 1, '{"n":1}' FROM generate_series(1, 40000);
VACUUM ANALYZE jobs;
VACUUM ANALYZE shape_ready;
VACUUM ANALYZE shape_graphile;
VACUUM ANALYZE shape_kept;
CHECKPOINT;

CREATE PROCEDURE shape_a(n int, INOUT claim_ms float8, INOUT done_ms float8) LANGUAGE plpgsql AS $$
DECLARE ids uuid[]; tokens uuid[]; t0 timestamptz; t1 timestamptz; x int;
BEGIN
    t0 := clock_timestamp();
    SELECT array_agg(c.id), array_agg(c.lease_token) INTO ids, tokens
    FROM sluice_claim_with_places(n, 'shapes', 60, 0, n) c WHERE c.id IS NOT NULL;
    COMMIT;
    t1 := clock_timestamp();
    -- The completion's statement (`queue::transitions::write_results`).
    WITH done AS (
        UPDATE jobs j SET state = 'done', result = '{"ok":true}', input_tokens = 1, output_tokens = 1,
            lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, last_error = NULL,
            finished_at = now(), updated_at = now(), done_attempt = i.token, done_worker = 'shapes'
        FROM unnest(ids, tokens) AS i(id, token)
        WHERE j.id = ANY(ids) AND j.id = i.id AND j.lease_token = i.token AND j.cancel_requested_at IS NULL
        RETURNING j.id)
    SELECT count(*) INTO x FROM done;
    COMMIT;
    claim_ms := claim_ms + extract(epoch FROM t1 - t0) * 1000;
    done_ms := done_ms + extract(epoch FROM clock_timestamp() - t1) * 1000;
END $$;

CREATE PROCEDURE shape_b(n int, INOUT claim_ms float8, INOUT done_ms float8) LANGUAGE plpgsql AS $$
DECLARE ids uuid[]; tokens uuid[]; t0 timestamptz; t1 timestamptz; x int;
BEGIN
    t0 := clock_timestamp();
    WITH taken AS (
        DELETE FROM shape_ready r WHERE r.job_id IN (
            SELECT q.job_id FROM shape_ready q ORDER BY q.fair_tag, q.run_at, q.job_id LIMIT n FOR UPDATE SKIP LOCKED)
        RETURNING r.job_id),
    leased AS (
        INSERT INTO shape_leases SELECT t.job_id, gen_random_uuid(), 'shapes', now() + interval '60 s', now(), 1 FROM taken t
        RETURNING job_id, token)
    -- The worker needs the job itself.
    SELECT array_agg(j.id), array_agg(l.token), count(j.payload) INTO ids, tokens, x
    FROM leased l JOIN jobs j ON j.id = l.job_id;
    COMMIT;
    t1 := clock_timestamp();
    WITH input AS (SELECT * FROM unnest(ids, tokens) AS t(id, token)),
    ended AS (
        DELETE FROM shape_leases le USING input i WHERE le.job_id = ANY(ids) AND le.job_id = i.id AND le.token = i.token
        RETURNING le.job_id, le.token, le.claimed_at, le.attempt),
    done AS (
        UPDATE jobs j SET state = 'done', attempts = e.attempt, started_at = coalesce(j.started_at, e.claimed_at),
            result = '{"ok":true}', input_tokens = 1, output_tokens = 1, finished_at = now(), updated_at = now()
        FROM ended e WHERE j.id = e.job_id
        RETURNING j.id, e.attempt, e.token, e.claimed_at),
    attempt_rows AS (
        INSERT INTO job_attempts (id, job_id, attempt, worker, started_at, finished_at, outcome, input_tokens, output_tokens)
        SELECT d.token, d.id, d.attempt, 'shapes', d.claimed_at, now(), 'succeeded', 1, 1 FROM done d)
    SELECT count(*) INTO x FROM done;
    COMMIT;
    claim_ms := claim_ms + extract(epoch FROM t1 - t0) * 1000;
    done_ms := done_ms + extract(epoch FROM clock_timestamp() - t1) * 1000;
END $$;

-- graphile-worker's claim (its getJobs, batched), on C's table or D's.
CREATE FUNCTION shape_graphile_claim(jobs_table regclass, n int) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE ids bigint[];
BEGIN
    EXECUTE format(
        'WITH picked AS (
             SELECT g.id FROM %1$s g
             WHERE g.is_available = true AND g.run_at <= now() AND g.task_id = ANY(''{1}''::int[])
             ORDER BY g.priority, g.run_at LIMIT $1 FOR UPDATE SKIP LOCKED),
         locked AS (
             UPDATE %1$s g SET attempts = g.attempts + 1, locked_by = ''shapes'', locked_at = now()
             FROM picked WHERE g.id = picked.id RETURNING g.*)
         SELECT array_agg(l.id) FROM locked l', jobs_table) INTO ids USING n;
    RETURN ids;
END $$;

-- C (`keep` false: the end deletes the narrow row) and D (`keep`: the end keeps the outcome and
-- the attempt), each on its own table.
CREATE PROCEDURE shape_narrow(n int, keep boolean, INOUT claim_ms float8, INOUT done_ms float8)
LANGUAGE plpgsql AS $$
DECLARE ids bigint[]; t0 timestamptz; t1 timestamptz;
BEGIN
    t0 := clock_timestamp();
    ids := shape_graphile_claim(CASE WHEN keep THEN 'shape_kept' ELSE 'shape_graphile' END, n);
    COMMIT;
    t1 := clock_timestamp();
    IF keep THEN
        WITH ended AS (DELETE FROM shape_kept WHERE id = ANY(ids) RETURNING id, attempts, locked_at),
        outcomes AS (INSERT INTO shape_outcomes SELECT e.id, 'done', '{"ok":true}', 1, 1, now() FROM ended e)
        INSERT INTO shape_attempts SELECT gen_random_uuid(), e.id, e.attempts, 'shapes', e.locked_at, now(), 'succeeded'
        FROM ended e;
    ELSE
        DELETE FROM shape_graphile WHERE id = ANY(ids);
    END IF;
    COMMIT;
    claim_ms := claim_ms + extract(epoch FROM t1 - t0) * 1000;
    done_ms := done_ms + extract(epoch FROM clock_timestamp() - t1) * 1000;
END $$;

-- Five rounds of 16 cycles a shape, interleaved; µs a job = ms over 8,000 jobs x 1,000.
DO $$
DECLARE a_c float8; a_d float8; b_c float8; b_d float8; c_c float8; c_d float8; d_c float8; d_d float8;
BEGIN
    FOR round IN 1..5 LOOP
        a_c := 0; a_d := 0; b_c := 0; b_d := 0; c_c := 0; c_d := 0; d_c := 0; d_d := 0;
        FOR i IN 1..16 LOOP
            CALL shape_a(500, a_c, a_d);
            CALL shape_b(500, b_c, b_d);
            CALL shape_narrow(500, false, c_c, c_d);
            CALL shape_narrow(500, true, d_c, d_d);
        END LOOP;
        RAISE NOTICE 'round %: A claim % + end % = % | B % + % = % | C % + % = % | D % + % = % (µs a job); '
                     'against C: A %x, B %x, D %x', round,
            round((a_c / 8)::numeric, 1), round((a_d / 8)::numeric, 1), round(((a_c + a_d) / 8)::numeric, 1),
            round((b_c / 8)::numeric, 1), round((b_d / 8)::numeric, 1), round(((b_c + b_d) / 8)::numeric, 1),
            round((c_c / 8)::numeric, 1), round((c_d / 8)::numeric, 1), round(((c_c + c_d) / 8)::numeric, 1),
            round((d_c / 8)::numeric, 1), round((d_d / 8)::numeric, 1), round(((d_c + d_d) / 8)::numeric, 1),
            round(((a_c + a_d) / (c_c + c_d))::numeric, 2), round(((b_c + b_d) / (c_c + c_d))::numeric, 2),
            round(((d_c + d_d) / (c_c + c_d))::numeric, 2);
    END LOOP;
END $$;

DROP PROCEDURE shape_a, shape_b, shape_narrow;
DROP FUNCTION shape_graphile_claim;
DROP TABLE shape_ready, shape_leases, shape_graphile, shape_kept, shape_outcomes, shape_attempts;
DELETE FROM jobs;
