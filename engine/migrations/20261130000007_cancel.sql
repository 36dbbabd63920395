-- Cancellation: `canceled` is a terminal state. A waiting job is canceled at once (refunded in
-- the same transaction); a running one gets a request its worker honours at the next safe point
-- or when its attempt ends (a result that arrives anyway is not charged).
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('queued', 'running', 'retrying', 'done', 'failed', 'canceled'));
ALTER TABLE jobs ADD COLUMN cancel_requested_at timestamptz, ADD COLUMN canceled_by text;

ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_outcome_check;
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_outcome_check
    CHECK (outcome IN ('succeeded', 'retry_scheduled', 'failed', 'lease_expired', 'handed_back',
                       'paused_requeue', 'canceled'));

-- A canceled job no longer holds its document's idempotency key: uploading it again makes a
-- new job.
DROP INDEX jobs_idempotency;
CREATE UNIQUE INDEX jobs_idempotency ON jobs (owner_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state NOT IN ('failed', 'canceled');
