-- A deleted job's erasure is recorded, so a deletion cut short (a timeout, a crash) is finished
-- by the upkeep sweep rather than forgotten.
ALTER TABLE jobs ADD COLUMN erased_at timestamptz;
CREATE INDEX jobs_deletions_pending ON jobs (id) WHERE deleted_at IS NOT NULL AND (erased_at IS NULL OR document_released_at IS NULL);
