-- A job's successful attempt is kept on the job's own row (issue 38, eighth step). The result
-- writes that row anyway, and the job's row already holds all the attempt is but its id (the
-- lease token, which is the fence) and its worker: its number, start (`claimed_at`), end
-- (`finished_at`) and tokens. A row in `job_attempts` besides cost every drained job one insert
-- and three index entries. Attempts that end otherwise (a retry, failed, handed back, canceled,
-- rescued, a document's part) still get their row when they end.
ALTER TABLE jobs ADD COLUMN done_attempt uuid, ADD COLUMN done_worker text;

-- Every ended attempt, as `job_attempts` held them all before: its rows, and the successful
-- attempts kept on their jobs. Done jobs from before this migration have their row in
-- `job_attempts` and no `done_attempt`, so none is counted twice. A reader that filters by job
-- or by end time reaches each half through its own index (the jobs' key and `jobs_finished_at`).
CREATE VIEW attempt_history AS
    SELECT a.id, a.job_id, a.attempt, a.worker, a.started_at, a.finished_at, a.outcome, a.error_class, a.error,
           a.detail, a.provider_status, a.retry_after_ms, a.input_tokens, a.output_tokens
    FROM job_attempts a
    UNION ALL
    SELECT j.done_attempt, j.id, j.attempts, j.done_worker, coalesce(j.claimed_at, j.finished_at), j.finished_at,
           'succeeded', NULL, NULL, NULL, NULL, NULL, j.input_tokens, j.output_tokens
    FROM jobs j
    WHERE j.done_attempt IS NOT NULL AND j.finished_at IS NOT NULL;
