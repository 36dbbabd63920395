-- What a canceled job keeps: the share of its provider calls started when the cancel was asked
-- for (the provider bills those). Fixed at the request, as the user was told when confirming.
ALTER TABLE jobs ADD COLUMN cancel_kept_credits integer NOT NULL DEFAULT 0 CHECK (cancel_kept_credits >= 0);

-- Counting a user's recent unreadable documents (the daily allowance of refunds).
CREATE INDEX jobs_unreadable_by_owner ON jobs (owner_id, finished_at) WHERE failure_kind = 'invalid_input';
