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

-- The grants given before this remembered too (the same folding as `users::mailbox_of`), so an
-- existing account's `+tag` twin or its re-sign-up after a deletion gets none either.
INSERT INTO signup_grants (mailbox, user_id)
SELECT DISTINCT ON (mailbox) mailbox, user_id FROM (
    SELECT encode(sha256(convert_to(
               CASE WHEN domain IN ('gmail.com', 'googlemail.com') THEN replace(local, '.', '') || '@gmail.com'
                    ELSE local || '@' || domain END, 'UTF8')), 'hex') AS mailbox,
           user_id
    FROM (SELECT u.id AS user_id,
                 split_part(split_part(lower(trim(u.email)), '@', 1), '+', 1) AS local,
                 split_part(lower(trim(u.email)), '@', 2) AS domain
          FROM users u
          WHERE u.deleted_at IS NULL AND position('@' IN u.email) > 0
            AND EXISTS (SELECT 1 FROM ledger l WHERE l.user_id = u.id AND l.kind = 'grant' AND l.note = 'sign-up grant')) parts
) folded
ORDER BY mailbox, user_id
ON CONFLICT (mailbox) DO NOTHING;
