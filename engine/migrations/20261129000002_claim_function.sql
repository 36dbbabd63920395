-- Claims in one round trip. Inside a volatile plpgsql function every statement takes a fresh
-- snapshot, so the running count is read *after* the settings-row lock is granted: claims are
-- serialised across every process and the gate cannot be raced past.
CREATE FUNCTION sluice_claim(p_max bigint, p_worker text, p_lease_secs float8)
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
    -- Owners are found with a loose index scan over jobs_waiting_by_owner. Only the v_free
    -- owners whose first due job scores best can place a job in the batch (any other owner's
    -- jobs score no better than those first jobs), so only they are expanded.
    -- Losing this transaction's commit in a crash is harmless (the job stays waiting, and the
    -- worker's later write is fenced off), so it need not wait for the WAL flush.
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    WITH RECURSIVE owners(owner_id) AS (
        (SELECT j.owner_id FROM jobs j WHERE j.state IN ('queued', 'retrying') ORDER BY j.owner_id LIMIT 1)
        UNION ALL
        SELECT (SELECT j.owner_id FROM jobs j
                WHERE j.state IN ('queued', 'retrying') AND j.owner_id > o.owner_id
                ORDER BY j.owner_id LIMIT 1)
        FROM owners o WHERE o.owner_id IS NOT NULL
    ),
    served AS (
        SELECT j.owner_id, count(*) AS running FROM jobs j WHERE j.state = 'running' GROUP BY j.owner_id
    ),
    best_owners AS (
        SELECT o.owner_id, coalesce(s.running, 0) AS running
        FROM owners o
        CROSS JOIN LATERAL (
            SELECT j.run_at, j.id FROM jobs j
            WHERE j.owner_id = o.owner_id AND j.state IN ('queued', 'retrying') AND j.run_at <= now()
            ORDER BY j.run_at, j.id LIMIT 1
        ) first_due
        LEFT JOIN served s ON s.owner_id = o.owner_id
        WHERE o.owner_id IS NOT NULL
        ORDER BY coalesce(s.running, 0), first_due.run_at, first_due.id
        LIMIT v_free
    ),
    candidates AS (
        SELECT c.id, c.run_at,
               b.running + row_number() OVER (PARTITION BY b.owner_id ORDER BY c.run_at, c.id) AS score
        FROM best_owners b
        CROSS JOIN LATERAL (
            SELECT j.id, j.run_at FROM jobs j
            WHERE j.owner_id = b.owner_id AND j.state IN ('queued', 'retrying') AND j.run_at <= now()
            ORDER BY j.run_at, j.id
            LIMIT v_free
        ) c
    ),
    picked AS (
        SELECT j.id FROM jobs j
        WHERE j.id IN (SELECT c.id FROM candidates c ORDER BY c.score, c.run_at, c.id LIMIT v_free)
          AND j.state IN ('queued', 'retrying')
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
