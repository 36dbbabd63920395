-- One spelling of "waiting" (queued, or retrying until its run_at) for every query: the view.
-- The planner inlines it, so queries through it still use the partial indexes whose predicate
-- is the same. (A view's `*` is fixed when it is made: recreate it when `jobs` gains a column.)
CREATE VIEW waiting_jobs AS SELECT * FROM jobs WHERE state IN ('queued', 'retrying');

-- The dead-letter queue: failed jobs an admin has not discarded. Replays and discards update
-- through it (a simple view is updatable), so only rows still dead are touched.
CREATE VIEW dead_letters AS SELECT * FROM jobs WHERE state = 'failed' AND discarded_at IS NULL;

-- The owners with waiting jobs, by a loose index scan over jobs_waiting_by_owner: one index
-- probe per owner, however many jobs each has. Shared by the claim and the place in line.
CREATE FUNCTION sluice_waiting_owners() RETURNS SETOF bigint LANGUAGE sql STABLE AS $$
    WITH RECURSIVE owners(owner_id) AS (
        (SELECT j.owner_id FROM waiting_jobs j ORDER BY j.owner_id LIMIT 1)
        UNION ALL
        SELECT (SELECT j.owner_id FROM waiting_jobs j WHERE j.owner_id > o.owner_id ORDER BY j.owner_id LIMIT 1)
        FROM owners o WHERE o.owner_id IS NOT NULL
    )
    SELECT owner_id FROM owners WHERE owner_id IS NOT NULL
$$;

-- The claim, as in 20261129000002 (an applied migration never changes, so its text repeats
-- here), reading waiting jobs through the view and owners through the function.
-- Inside a volatile plpgsql function every statement takes a fresh snapshot, so the running
-- count is read *after* the settings-row lock is granted: claims are serialised across every
-- process and the gate cannot be raced past.
CREATE OR REPLACE FUNCTION sluice_claim(p_max bigint, p_worker text, p_lease_secs float8)
RETURNS TABLE (id uuid, owner_id bigint, kind text, payload jsonb, attempts integer, max_attempts integer, lease_token uuid)
LANGUAGE plpgsql VOLATILE
-- The plan does not depend on the arguments' values; re-planning each call cost more than the claim.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_enabled boolean;
    v_gate integer;
    v_free bigint;
BEGIN
    SELECT s.processing_enabled, s.gate_size INTO v_enabled, v_gate
    FROM queue_settings s WHERE s.id = 1 FOR UPDATE;
    IF NOT v_enabled THEN
        RETURN;
    END IF;
    SELECT least(p_max, v_gate - count(*)) INTO v_free FROM jobs j WHERE j.state = 'running';
    IF v_free <= 0 THEN
        RETURN;
    END IF;
    -- Fairness: each owner's waiting jobs are ranked by due time; a job's score is its owner's
    -- running jobs plus its rank, so the oldest job of the least-served owner goes first.
    -- Only the v_free owners whose first due job scores best can place a job in the batch (any
    -- other owner's jobs score no better than those first jobs), so only they are expanded.
    -- Losing this transaction's commit in a crash is harmless (the job stays waiting, and the
    -- worker's later write is fenced off), so it need not wait for the WAL flush.
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
    picked AS (
        SELECT j.id FROM waiting_jobs j
        WHERE j.id IN (SELECT c.id FROM candidates c ORDER BY c.score, c.run_at, c.id LIMIT v_free)
        FOR UPDATE SKIP LOCKED
    ),
    claimed AS (
        UPDATE jobs j
        SET state = 'running', attempts = j.attempts + 1, lease_owner = p_worker,
            lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => p_lease_secs),
            started_at = coalesce(j.started_at, now()), updated_at = now()
        FROM picked WHERE j.id = picked.id
        RETURNING j.id, j.owner_id, j.kind, j.payload, j.attempts, j.max_attempts, j.lease_token
    ),
    attempt_rows AS (
        INSERT INTO job_attempts (id, job_id, attempt, worker)
        SELECT c.lease_token, c.id, c.attempts, p_worker FROM claimed c
    )
    SELECT c.id, c.owner_id, c.kind, c.payload, c.attempts, c.max_attempts, c.lease_token FROM claimed c;
END $$;

-- The first page's demo click counter is gone; an account surviving a restart is the probe now.
DROP TABLE page_clicks;
