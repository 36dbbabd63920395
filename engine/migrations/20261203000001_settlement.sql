-- What a canceled job keeps: the share of its provider calls started when the cancel was asked
-- for (the provider bills those). Fixed at the request, as the user was told when confirming.
ALTER TABLE jobs ADD COLUMN cancel_kept_credits integer NOT NULL DEFAULT 0 CHECK (cancel_kept_credits >= 0);

-- A job that failed because the document reader could not read its document (the file's
-- doing, not a policy refusal): these count against the daily allowance of refunds.
ALTER TABLE jobs ADD COLUMN failed_unreadable boolean NOT NULL DEFAULT false;
CREATE INDEX jobs_unreadable_by_owner ON jobs (owner_id, finished_at) WHERE failed_unreadable;

-- What a job's document costs once settled (NULL: its cost). A PDF is admitted at a hold (the
-- price of its worst case) with this set to its price by size; once its text is read, it is its
-- text's price (never more than the hold). The difference is refunded when the job ends.
ALTER TABLE jobs ADD COLUMN settled_cost integer CHECK (settled_cost >= 0 AND settled_cost <= cost);
