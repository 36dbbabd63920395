-- Fairness fixed at enqueue (issue 38): start-time fair queuing by tokens. Each job gets a
-- virtual start tag when it enters the line, max(virtual time, its owner's finish tag), and
-- moves its owner's finish tag on by its token weight (`sluice_token_weight`: 1 per 25K input
-- tokens). The claim takes the due jobs with the lowest tags, in one walk of an index, and
-- moves the virtual time to the highest tag it served. An owner is charged for what it sent
-- into the line, in tokens: one 490K-token document moves its owner's finish tag 20 ahead, so
-- the owner's next job waits while others are served 20 weights' worth, and another owner's
-- 2K-token job, tagged at the virtual time, goes first. An owner idle for a while is tagged at
-- the virtual time, not earlier: no credit is saved up by waiting.
--
-- This replaces the fair pick of 20261210000001 (least weight running, then the oldest head),
-- which read every running job and every served owner's head at each claim, and the statement
-- triggers that kept each owner's head in `owner_heads` at every change of a job: 38 of 223 µs
-- of Postgres time a drained job, measured. The bound (proven on random lines in
-- engine/src/queue/policy/fair_tags.rs, whose tags engine/tests/fairness.rs holds these to): at
-- any point of the claim order, two owners with jobs waiting have been served token weights
-- within the largest job's weight of each other.
--
-- A job comes into the line new (a new tag) on every path (admission, a retry, a replay, a
-- document's parts back in line, a handed-back or paused attempt), except a claim undone
-- before its job started (`unclaim`, the jobs a process fetched ahead): it comes back with its
-- run_at unchanged and keeps its tag, so its place. A retry is tagged when it fails (its owner
-- charged then) and keeps the tag while it waits for its due time. A canceled waiting job gives
-- its owner's line back what it had not been served (`sluice_shorten_line`).

-- Nothing may change the line between the tags given below and the trigger taking over.
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;

DROP TRIGGER jobs_heads_insert ON jobs;
DROP TRIGGER jobs_heads_update ON jobs;
DROP TRIGGER jobs_heads_delete ON jobs;
DROP TRIGGER jobs_heads_truncate ON jobs;
DROP FUNCTION sluice_heads_after_insert();
DROP FUNCTION sluice_heads_after_update();
DROP FUNCTION sluice_heads_after_delete();
DROP FUNCTION sluice_heads_after_truncate();
DROP FUNCTION sluice_refresh_heads(bigint[]);
DROP FUNCTION sluice_waiting_owners();

-- Each owner's line: its row is still what admission locks first (`sluice_lock_lines`), and now
-- holds the owner's finish tag.
ALTER TABLE owner_heads RENAME TO owner_lines;
ALTER INDEX owner_heads_pkey RENAME TO owner_lines_pkey;
DROP INDEX owner_heads_order;
ALTER TABLE owner_lines DROP COLUMN run_at, DROP COLUMN job_id, ADD COLUMN finish_tag bigint NOT NULL DEFAULT 0;

ALTER TABLE queue_settings ADD COLUMN virtual_time bigint NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN fair_tag bigint NOT NULL DEFAULT 0;
-- A view's `*` is what the table had when it was made: again, with the tag.
CREATE OR REPLACE VIEW waiting_jobs AS SELECT * FROM jobs WHERE state IN ('queued', 'retrying');
CREATE OR REPLACE VIEW dead_letters AS SELECT * FROM jobs WHERE state = 'failed' AND discarded_at IS NULL;

-- The jobs waiting now, tagged as if they had all come at once, each owner's in their old order.
UPDATE jobs j SET fair_tag = t.tag
FROM (
    SELECT w.id, sum(sluice_token_weight(w.est_input_tokens)) OVER (PARTITION BY w.owner_id ORDER BY w.run_at, w.id)
                 - sluice_token_weight(w.est_input_tokens) AS tag
    FROM waiting_jobs w
) t
WHERE j.id = t.id;
INSERT INTO owner_lines (owner_id, finish_tag)
SELECT w.owner_id, sum(sluice_token_weight(w.est_input_tokens)) FROM waiting_jobs w GROUP BY w.owner_id
ON CONFLICT (owner_id) DO UPDATE SET finish_tag = excluded.finish_tag;

-- The claim's order. (Jobs leave it when claimed, so a claim writes no entry here.)
CREATE INDEX jobs_waiting_fair ON jobs (fair_tag, run_at, id) WHERE state IN ('queued', 'retrying');

CREATE OR REPLACE FUNCTION sluice_lock_lines(p_owners bigint[]) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO owner_lines (owner_id)
    SELECT DISTINCT o FROM unnest(p_owners) o ORDER BY o
    ON CONFLICT (owner_id) DO NOTHING;
    PERFORM 1 FROM owner_lines l WHERE l.owner_id = ANY (p_owners) ORDER BY l.owner_id FOR UPDATE;
END $$;

-- A new tag for a job of `p_owner`'s coming into the line with `p_tokens` input tokens. It
-- locks the owner's line: a statement that brings jobs of several owners into the line locks
-- their lines first, in owner order (`sluice_lock_lines`), so two never deadlock.
CREATE FUNCTION sluice_next_tag(p_owner bigint, p_tokens bigint) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_weight bigint := sluice_token_weight(p_tokens);
    v_tag bigint;
BEGIN
    INSERT INTO owner_lines AS l (owner_id, finish_tag)
    SELECT p_owner, q.virtual_time + v_weight FROM queue_settings q WHERE q.id = 1
    ON CONFLICT (owner_id) DO UPDATE SET finish_tag = greatest(l.finish_tag, excluded.finish_tag - v_weight) + v_weight
    RETURNING l.finish_tag - v_weight INTO v_tag;
    RETURN v_tag;
END $$;

-- Before a statement that brings jobs of several owners back into the line: their rows first
-- (as a retry, a rescue or a replay takes them), then their owners' lines in owner order.
CREATE FUNCTION sluice_lock_entries(p_jobs uuid[]) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_owners bigint[];
BEGIN
    SELECT array_agg(r.owner_id) INTO v_owners
    FROM (SELECT j.owner_id FROM jobs j WHERE j.id = ANY (p_jobs) ORDER BY j.id FOR UPDATE) r;
    PERFORM sluice_lock_lines(coalesce(v_owners, '{}'));
END $$;

-- After an owner's waiting job was canceled: its finish tag back to the end of what it still
-- has waiting or running (nothing: 0, so its next job is tagged at the virtual time), so work
-- canceled unserved costs it no place later. Lowers only.
CREATE FUNCTION sluice_shorten_line(p_owner bigint) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE owner_lines l SET finish_tag = e.finish
    FROM (
        SELECT greatest(
            coalesce((SELECT max(w.fair_tag + sluice_token_weight(w.est_input_tokens)) FROM waiting_jobs w
                      WHERE w.owner_id = p_owner), 0),
            coalesce((SELECT max(r.fair_tag + sluice_token_weight(r.est_input_tokens)) FROM jobs r
                      WHERE r.state = 'running' AND r.owner_id = p_owner), 0)) AS finish
    ) e
    WHERE l.owner_id = p_owner AND l.finish_tag > e.finish;
END $$;

CREATE FUNCTION sluice_tag_entry() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.fair_tag := sluice_next_tag(NEW.owner_id, NEW.est_input_tokens);
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_tag_insert BEFORE INSERT ON jobs
    FOR EACH ROW WHEN (NEW.state IN ('queued', 'retrying')) EXECUTE FUNCTION sluice_tag_entry();
CREATE TRIGGER jobs_tag_entry BEFORE UPDATE OF state ON jobs
    FOR EACH ROW WHEN (NEW.state IN ('queued', 'retrying') AND OLD.state NOT IN ('queued', 'retrying')
                       AND NEW.run_at IS DISTINCT FROM OLD.run_at)
    EXECUTE FUNCTION sluice_tag_entry();

DROP FUNCTION sluice_fair_pick(bigint, boolean);

-- The claim, as in 20261210000001 (an applied migration never changes, so its text repeats
-- here), taking the due jobs by tag.
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
            started_at = coalesce(j.started_at, now()), updated_at = now()
        FROM fitting WHERE j.id = fitting.id
        RETURNING j.id, j.owner_id, j.kind, j.payload, j.attempts, j.max_attempts, j.lease_token, j.est_input_tokens,
                  j.fair_tag
    ),
    attempt_rows AS (
        INSERT INTO job_attempts (id, job_id, attempt, worker)
        SELECT c.lease_token, c.id, c.attempts, p_worker FROM claimed c
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


-- A document's part calls, as in 20261206000001 (an applied migration never changes, so its text
-- repeats here), with the other owners waiting found without the heads.
CREATE OR REPLACE FUNCTION sluice_part_calls(p_job uuid, p_token uuid, p_running integer, p_tokens bigint[], p_outputs bigint[])
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

