-- Storage is paid for or released (issue 23): a canceled job's document, and a failed job's
-- once the admins' inspection window has passed, is deleted; the job remembers when.
ALTER TABLE jobs ADD COLUMN document_released_at timestamptz;
CREATE INDEX jobs_releasable ON jobs (finished_at)
    WHERE state IN ('canceled', 'failed') AND document_released_at IS NULL;
