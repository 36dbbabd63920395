-- Device tokens (OWASP's device cookies): a browser that logged in to an account before gets a
-- token; its log-ins are throttled per token, so strangers' guesses at the account (which fill
-- the account-wide window) cannot lock its owner out. Only the token's hash is kept.
CREATE TABLE device_tokens (
    token_hash   bytea       PRIMARY KEY,
    user_id      bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX device_tokens_by_user ON device_tokens (user_id, last_used_at DESC);
