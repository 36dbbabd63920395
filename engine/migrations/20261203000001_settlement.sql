-- What a canceled job keeps: the share of its provider calls started when the cancel was asked
-- for (the provider bills those). Fixed at the request, as the user was told when confirming.
ALTER TABLE jobs ADD COLUMN cancel_kept_credits integer NOT NULL DEFAULT 0 CHECK (cancel_kept_credits >= 0);

-- Counting a user's recent unreadable documents (the daily allowance of refunds).
CREATE INDEX jobs_unreadable_by_owner ON jobs (owner_id, finished_at) WHERE failure_kind = 'invalid_input';

-- What a job's document costs once settled (NULL: its cost). A PDF is admitted at a hold (the
-- price of its worst case) with this set to its price by size; once its text is read, it is its
-- text's price (never more than the hold). The difference is refunded when the job ends.
ALTER TABLE jobs ADD COLUMN settled_cost integer CHECK (settled_cost >= 0 AND settled_cost <= cost);
