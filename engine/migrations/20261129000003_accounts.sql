-- Accounts, the credit ledger, notices, API tokens and login throttling.

CREATE TABLE users (
    id             bigserial PRIMARY KEY,
    email          text        NOT NULL UNIQUE,
    password_hash  text        NOT NULL,
    role           text        NOT NULL DEFAULT 'user' CHECK (role IN ('user', 'admin')),
    -- Kept in step with the ledger in the same transactions; never negative.
    balance        bigint      NOT NULL DEFAULT 0 CHECK (balance >= 0),
    -- The user's jobs not yet terminal; admission's compound check reads and bumps it.
    in_flight      integer     NOT NULL DEFAULT 0 CHECK (in_flight >= 0),
    max_in_flight  integer     NOT NULL DEFAULT 5 CHECK (max_in_flight >= 1),
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- Append-only. amount > 0 adds to the balance, < 0 takes from it.
CREATE TABLE ledger (
    id        bigserial PRIMARY KEY,
    user_id   bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    kind      text        NOT NULL CHECK (kind IN ('grant', 'debit', 'refund', 'adjustment')),
    amount    bigint      NOT NULL,
    job_id    uuid,
    actor     text        NOT NULL DEFAULT 'system',
    note      text,
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_by_user ON ledger (user_id, at DESC);
-- At most one debit and one refund per job, whatever races.
CREATE UNIQUE INDEX ledger_one_debit_per_job ON ledger (job_id) WHERE kind = 'debit';
CREATE UNIQUE INDEX ledger_one_refund_per_job ON ledger (job_id) WHERE kind = 'refund';

CREATE TABLE notices (
    id         bigserial PRIMARY KEY,
    user_id    bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    job_id     uuid,
    kind       text        NOT NULL,
    message    text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    read_at    timestamptz
);
CREATE INDEX notices_by_user ON notices (user_id, created_at DESC);
CREATE UNIQUE INDEX notices_one_refund_per_job ON notices (job_id) WHERE kind = 'refund';

CREATE TABLE api_tokens (
    id           bigserial PRIMARY KEY,
    user_id      bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name         text        NOT NULL,
    token_sha256 bytea       NOT NULL UNIQUE,
    prefix       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX api_tokens_by_user ON api_tokens (user_id);

-- Failed logins, per account and per client address, for throttling.
CREATE TABLE login_failures (
    key text        NOT NULL,
    at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX login_failures_by_key ON login_failures (key, at);

-- A REST client's Idempotency-Key and the fingerprint of the request it was first used with.
ALTER TABLE jobs ADD COLUMN client_key text, ADD COLUMN request_fingerprint text;
CREATE UNIQUE INDEX jobs_client_key ON jobs (owner_id, client_key) WHERE client_key IS NOT NULL;
