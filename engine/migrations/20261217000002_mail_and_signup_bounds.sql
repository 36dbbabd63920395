-- Mail an attacker cannot make Sluice send without bound, and sign-up grants once per mailbox
-- (issue 55, item 6).

-- The per-account daily cap on notices counts an account's recent mail.
CREATE INDEX mail_outbox_by_user_and_time ON mail_outbox (user_id, created_at);

-- Sign-up grants given, by mailbox folded (`me+1@x` and `me@x` alike; dots ignored at Gmail),
-- kept as its SHA-256 (the grant outlives an account's deletion, its address does not): a
-- second account at the same mailbox, or the same address after a deletion, gets none.
CREATE TABLE signup_grants (
    mailbox    text PRIMARY KEY,
    user_id    bigint NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now()
);

-- Unverified accounts expire (their address freed): found by age.
CREATE INDEX users_unverified_by_age ON users (created_at) WHERE email_verified_at IS NULL AND deleted_at IS NULL;

-- A sign-up with an address that has an account answers as for a new one, and the owner is
-- mailed instead (a mail of the account's own, not a notice).
ALTER TABLE mail_outbox DROP CONSTRAINT mail_outbox_kind_check,
    ADD CONSTRAINT mail_outbox_kind_check
        CHECK (kind IN ('verify', 'reset', 'done', 'failed', 'credits_low', 'signup_taken'));
