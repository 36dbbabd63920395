-- Answered parts of a document done in parts that were read (downloaded as `parts.md`) before
-- it ended (issue 55): a failure after that keeps the answered parts' share, as a document's
-- failure does, even when the failure is ours; nobody gets paid work free by downloading it
-- and then failing the rest. A table of its own: the jobs row's type stays as the claim
-- functions of a running previous release know it.
CREATE TABLE parts_read (
    job_id  uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    read_at timestamptz NOT NULL DEFAULT now()
);
