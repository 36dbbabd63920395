-- Alerts: one row per firing of a rule, open while resolved_at is NULL (at most one open
-- firing per rule). `value` is the latest reading while it fires.
CREATE TABLE alert_firings (
    id          bigserial PRIMARY KEY,
    rule        text             NOT NULL,
    fired_at    timestamptz      NOT NULL DEFAULT now(),
    resolved_at timestamptz,
    value       double precision NOT NULL,
    threshold   double precision NOT NULL,
    detail      text             NOT NULL
);
CREATE UNIQUE INDEX alert_firings_one_open ON alert_firings (rule) WHERE resolved_at IS NULL;
CREATE INDEX alert_firings_newest ON alert_firings (fired_at DESC);

-- The provider-failure rule reads the last minutes' attempts.
CREATE INDEX job_attempts_finished ON job_attempts (finished_at) WHERE finished_at IS NOT NULL;

-- Outgoing webhooks (alert firings and job endings): durable rows, retried with backoff, so a
-- delivery survives restarts. `event_key` makes each event deliverable once. No secret is
-- stored here: a job's delivery names its token, whose secret is read when signing.
CREATE TABLE webhook_deliveries (
    id              bigserial PRIMARY KEY,
    event_key       text        NOT NULL UNIQUE,
    url             text        NOT NULL,
    token_id        bigint      REFERENCES api_tokens (id) ON DELETE CASCADE,
    body            jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    gave_up_at      timestamptz,
    last_status     integer,
    last_error      text
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL AND gave_up_at IS NULL;

-- A token's completion callback and the secret its deliveries are signed with.
ALTER TABLE api_tokens ADD COLUMN callback_url text, ADD COLUMN callback_secret text;
