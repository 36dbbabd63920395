-- Issue 56: real providers.
-- What each provider's tokenizer counts against ours (o200k_base), learned from the usage its
-- answers report, per provider and model: parts are planned by the provider's own count.
CREATE TABLE provider_token_ratios (
    provider   text NOT NULL,
    model      text NOT NULL,
    ratio      float8 NOT NULL CHECK (ratio > 0 AND ratio < 10),
    samples    bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, model)
);

-- An answer as it is written (streamed): about how many tokens the running attempt's calls
-- have written so far, and how many they are expected to write, for the job page. A table of
-- its own (the jobs row's type stays as a running previous release's claim functions know it);
-- written every few seconds at most, by the attempt holding the lease.
CREATE TABLE job_writing (
    job_id          uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    lease_token     uuid NOT NULL,
    written_tokens  bigint NOT NULL CHECK (written_tokens >= 0),
    expected_tokens bigint NOT NULL CHECK (expected_tokens >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Input tokens the provider read from its prompt cache, per call (Anthropic
-- `cache_read_input_tokens`, OpenAI `cached_tokens`): the console prices them at the cached
-- rate. Kept apart from the jobs (the money was spent whatever becomes of the job), pruned
-- with the other evidence.
CREATE TABLE provider_cache_reads (
    id                  bigserial PRIMARY KEY,
    job_id              uuid NOT NULL,
    at                  timestamptz NOT NULL DEFAULT now(),
    cached_input_tokens bigint NOT NULL CHECK (cached_input_tokens > 0)
);
CREATE INDEX provider_cache_reads_at ON provider_cache_reads (at);
