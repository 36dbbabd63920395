-- Issue 60: several provider deployments, named, in the providers file's order, each with its
-- own budget (buckets as queue_settings keeps the claim's, refilled when read); one that fails
-- calls in a row rests, every process seeing it. And which deployment each call went to.
CREATE TABLE provider_deployments (
    name text PRIMARY KEY,
    position int NOT NULL,
    kind text NOT NULL,
    model text NOT NULL DEFAULT '',
    -- No longer in the file: kept for the calls' history, never routed to.
    in_file boolean NOT NULL DEFAULT true,
    limit_requests_per_min bigint,
    limit_input_tokens_per_min bigint,
    limit_output_tokens_per_min bigint,
    level_requests float8 NOT NULL DEFAULT 'Infinity',
    level_input float8 NOT NULL DEFAULT 'Infinity',
    level_output float8 NOT NULL DEFAULT 'Infinity',
    levels_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    failures_in_a_row int NOT NULL DEFAULT 0,
    -- Since when it has failed without answering (the alert's clock), and until when it rests.
    resting_since timestamptz,
    resting_until timestamptz,
    last_failure text,
    last_failure_at timestamptz,
    last_success_at timestamptz
);

-- A log, as provider_cache_reads is: kept as long as the evidence (the upkeep prunes it by
-- age), no key on jobs (a job's deletion writes nothing here; its rows hold no words of its).
CREATE TABLE provider_calls (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    deployment text NOT NULL,
    answered boolean NOT NULL,
    -- Why the call moved on from it (the provider's words as the error says them).
    failure text
);
CREATE INDEX provider_calls_by_job ON provider_calls (job_id, id);
CREATE INDEX provider_calls_at ON provider_calls (at);
