-- The durable job queue. A job row is also the outbox: admission inserts it in the same
-- transaction as the credit debit, so there is no second system to fall out of step with.

CREATE TABLE jobs (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner_id         bigint      NOT NULL,
    kind             text        NOT NULL DEFAULT 'document',
    payload          jsonb       NOT NULL DEFAULT '{}',
    idempotency_key  text,
    cost             integer     NOT NULL DEFAULT 0 CHECK (cost >= 0),
    state            text        NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'running', 'retrying', 'done', 'failed')),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     integer     NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    run_at           timestamptz NOT NULL DEFAULT now(),
    lease_owner      text,
    lease_token      uuid,
    lease_expires_at timestamptz,
    last_error       text,
    failure_kind     text CHECK (failure_kind IN ('invalid_input', 'provider_rejected', 'retries_exhausted', 'timed_out')),
    failure_reason   text,
    result           jsonb,
    input_tokens     bigint,
    output_tokens    bigint,
    accepted_at      timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    replays          integer     NOT NULL DEFAULT 0,
    discarded_at     timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'running') = (lease_token IS NOT NULL)),
    CHECK ((state = 'failed') = (failure_kind IS NOT NULL))
);

-- Claim path: waiting jobs per owner in due order (fair claim walks owners through this index).
CREATE INDEX jobs_waiting_by_owner ON jobs (owner_id, run_at, id) WHERE state IN ('queued', 'retrying');
-- Next due time and backlog age.
CREATE INDEX jobs_waiting_by_run_at ON jobs (run_at) WHERE state IN ('queued', 'retrying');
-- Gate count and lease rescue: only running rows, a few dozen at most.
CREATE INDEX jobs_running ON jobs (lease_expires_at) WHERE state = 'running';
-- Dead-letter queue.
CREATE INDEX jobs_dead ON jobs (failure_kind, failure_reason) WHERE state = 'failed' AND discarded_at IS NULL;
-- Rates and retention.
CREATE INDEX jobs_accepted_at ON jobs (accepted_at);
CREATE INDEX jobs_finished_at ON jobs (finished_at) WHERE finished_at IS NOT NULL;
-- A user's job list.
CREATE INDEX jobs_owner_recent ON jobs (owner_id, accepted_at DESC);
-- Idempotency: one live (not failed) job per owner and key.
CREATE UNIQUE INDEX jobs_idempotency ON jobs (owner_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state <> 'failed';

-- One row per attempt; its id is the lease token (the fencing token) of that attempt.
CREATE TABLE job_attempts (
    id              uuid PRIMARY KEY,
    job_id          uuid        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt         integer     NOT NULL,
    worker          text        NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    outcome         text CHECK (outcome IN ('succeeded', 'retry_scheduled', 'failed', 'lease_expired', 'handed_back', 'paused_requeue')),
    error_class     text,
    error           text,
    provider_status integer,
    retry_after_ms  bigint,
    input_tokens    bigint,
    output_tokens   bigint
);
CREATE INDEX job_attempts_by_job ON job_attempts (job_id, started_at);

-- Process-wide switches, one row. Claims lock this row, which serialises them so the gate holds
-- across every worker process.
CREATE TABLE queue_settings (
    id                  integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    processing_enabled  boolean     NOT NULL DEFAULT true,
    gate_size           integer     NOT NULL DEFAULT 24 CHECK (gate_size BETWEEN 1 AND 70),
    processing_changed_at timestamptz NOT NULL DEFAULT now(),
    processing_changed_by text      NOT NULL DEFAULT 'system'
);
INSERT INTO queue_settings DEFAULT VALUES;

CREATE TABLE audit_log (
    id        bigserial PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text        NOT NULL,
    action    text        NOT NULL,
    subject   text,
    old_value text,
    new_value text
);
CREATE INDEX audit_log_recent ON audit_log (at DESC);

-- Wake idle workers the moment work arrives (delivered at commit; identical payloads in one
-- transaction fold into one notification).
CREATE FUNCTION sluice_notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sluice_jobs', 'work');
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_notify_insert AFTER INSERT ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_notify_jobs();

-- The demo counter for the first page (proves the browser -> server function -> Postgres path).
CREATE TABLE page_clicks (
    id     integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    clicks bigint  NOT NULL DEFAULT 0
);
INSERT INTO page_clicks DEFAULT VALUES;
