-- Accounts people can keep (issue 37): staff roles, verified addresses, sessions that a reset
-- ends, single-use links, mail choices and a durable mail outbox.

ALTER TABLE users DROP CONSTRAINT users_role_check;
ALTER TABLE users ADD CONSTRAINT users_role_check CHECK (role IN ('user', 'support', 'operator', 'admin'));

ALTER TABLE users
    ADD COLUMN email_verified_at timestamptz,
    -- Sessions carry the epoch they began in; a reset or a password change moves it on.
    ADD COLUMN session_epoch     integer NOT NULL DEFAULT 0,
    -- Which notices also come by e-mail (each mail has a one-click unsubscribe).
    ADD COLUMN mail_done         boolean NOT NULL DEFAULT true,
    ADD COLUMN mail_failed       boolean NOT NULL DEFAULT true,
    ADD COLUMN mail_credits_low  boolean NOT NULL DEFAULT true,
    -- The key in this account's unsubscribe links (it can only turn mail off). Random per row.
    ADD COLUMN mail_key          uuid    NOT NULL DEFAULT gen_random_uuid();
-- Accounts made before verification existed were given their grant: they count as verified.
UPDATE users SET email_verified_at = created_at;

-- Links mailed to an address: verification and password reset. Single-use, expiring, and
-- kept only as the SHA-256 of the token.
CREATE TABLE account_links (
    token_hash bytea       PRIMARY KEY,
    user_id    bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    purpose    text        NOT NULL CHECK (purpose IN ('verify', 'reset')),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at    timestamptz
);
CREATE INDEX account_links_by_user ON account_links (user_id, purpose);
CREATE INDEX account_links_expired ON account_links (expires_at);

-- Mail waiting to be sent, sent, or given up: one row per event (`event_key`), retried with
-- backoff. The address is read from the account when sending (a deleted account gets
-- nothing, and no address is copied here); a link's token sits in `detail` only until sent.
CREATE TABLE mail_outbox (
    id              bigserial PRIMARY KEY,
    event_key       text        NOT NULL UNIQUE,
    user_id         bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    kind            text        NOT NULL CHECK (kind IN ('verify', 'reset', 'done', 'failed', 'credits_low')),
    detail          jsonb       NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    sent_at         timestamptz,
    gave_up_at      timestamptz,
    last_error      text
);
CREATE INDEX mail_outbox_due ON mail_outbox (next_attempt_at) WHERE sent_at IS NULL AND gave_up_at IS NULL;
CREATE INDEX mail_outbox_pending_by_user ON mail_outbox (user_id) WHERE sent_at IS NULL AND gave_up_at IS NULL;
CREATE INDEX mail_outbox_ended ON mail_outbox (coalesce(sent_at, gave_up_at))
    WHERE sent_at IS NOT NULL OR gave_up_at IS NOT NULL;
