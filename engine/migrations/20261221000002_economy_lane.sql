-- Issue 60: the economy lane. A document's first round of calls goes to the provider's batch
-- API as one batch (every part of it); the batch's id is durable, so polling resumes after a
-- restart; each request's answer waits here until the job's next claim takes it, once.
CREATE TABLE provider_batches (
    id bigserial PRIMARY KEY,
    -- The providers file's deployment ('' for the single provider).
    deployment text NOT NULL,
    provider_batch_id text NOT NULL,
    requests int NOT NULL,
    submitted_at timestamptz NOT NULL DEFAULT now(),
    polled_at timestamptz,
    -- Times its results could not be read (after a few it is ended without them).
    read_failures int NOT NULL DEFAULT 0,
    ended_at timestamptz
);
CREATE INDEX provider_batches_open ON provider_batches (submitted_at) WHERE ended_at IS NULL;

-- No key on jobs (as provider_calls): an answer is taken once and then kept no more, a deleted
-- job's are erased, and the upkeep prunes ended batches with their requests.
CREATE TABLE batch_requests (
    job_id uuid NOT NULL,
    custom_id text NOT NULL,
    batch_id bigint NOT NULL REFERENCES provider_batches (id) ON DELETE CASCADE,
    -- The request's text, by its hash: the job's next claim asks for the same text.
    text_sha256 bytea NOT NULL,
    answer_tokens int NOT NULL,
    -- The provider's answer once the batch ended (checked again when used), or why there is none.
    answer jsonb,
    failure text,
    used_at timestamptz,
    PRIMARY KEY (job_id, custom_id)
);
CREATE INDEX batch_requests_by_batch ON batch_requests (batch_id);
CREATE INDEX batch_requests_by_text ON batch_requests (job_id, text_sha256);
