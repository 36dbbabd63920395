-- The operator console (issue 24): timed pauses, reviews, acknowledgements, processes, and
-- the index the outcomes-and-cost view reads the ledger by.

-- A pause with an end: the maintenance tick of any process resumes processing once it passes
-- (kept here, so it survives a restart). NULL for a pause without an end, and while running.
ALTER TABLE queue_settings ADD COLUMN resume_at timestamptz;

-- "Needs review": a person owns a failed job or a dead-letter group until it is resolved
-- (replayed, discarded, or "resolved, no action"), with who and why at each end.
CREATE TABLE reviews (
    id              bigserial PRIMARY KEY,
    job_id          uuid REFERENCES jobs (id) ON DELETE CASCADE,
    failure_kind    text,
    failure_reason  text,
    note            text        NOT NULL CHECK (length(note) <= 2000),
    assignee_id     bigint      REFERENCES users (id) ON DELETE SET NULL,
    marked_by       text        NOT NULL,
    marked_at       timestamptz NOT NULL DEFAULT now(),
    resolved_by     text,
    resolved_at     timestamptz,
    resolution      text CHECK (resolution IN ('replayed', 'discarded', 'no_action')),
    resolution_note text CHECK (length(resolution_note) <= 2000),
    -- A job or a group, never both.
    CHECK ((job_id IS NULL) = (failure_kind IS NOT NULL)),
    CHECK ((resolved_at IS NULL) = (resolution IS NULL))
);
CREATE UNIQUE INDEX reviews_open_job ON reviews (job_id) WHERE resolved_at IS NULL AND job_id IS NOT NULL;
CREATE UNIQUE INDEX reviews_open_group ON reviews (failure_kind, failure_reason)
    WHERE resolved_at IS NULL AND job_id IS NULL;
CREATE INDEX reviews_recent ON reviews (marked_at DESC);
-- For deleting a job's reviews with it (retention prunes thousands of jobs a statement).
CREATE INDEX reviews_job ON reviews (job_id) WHERE job_id IS NOT NULL;
CREATE INDEX reviews_assignee ON reviews (assignee_id) WHERE assignee_id IS NOT NULL;

-- Acknowledgements: someone has seen it and says so.
ALTER TABLE alert_firings
    ADD COLUMN acked_by text, ADD COLUMN acked_at timestamptz,
    ADD COLUMN ack_note text CHECK (length(ack_note) <= 2000);
ALTER TABLE reconciliation_reports
    ADD COLUMN acked_by text, ADD COLUMN acked_at timestamptz,
    ADD COLUMN ack_note text CHECK (length(ack_note) <= 2000);

-- Every server process records itself, not only worker pools.
ALTER TABLE worker_processes
    ADD COLUMN role    text    NOT NULL DEFAULT 'worker',
    ADD COLUMN version text    NOT NULL DEFAULT '',
    ADD COLUMN running integer NOT NULL DEFAULT 0 CHECK (running >= 0);

-- Outcomes and cost read the ledger by time.
CREATE INDEX ledger_at ON ledger (at) WHERE kind IN ('debit', 'refund');
