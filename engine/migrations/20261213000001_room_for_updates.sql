-- A job is written three times (accepted, claimed, finished) and its attempt twice. When the
-- new version of a row does not fit on the old one's page, Postgres first marks the old
-- version locked in a WAL record of its own, then writes the whole new row elsewhere; with
-- room on the page the update is one shorter record on the same page. Pages of `jobs` are
-- filled to 40 % at insert (a claim rewrites whole pages of jobs inserted together, and the
-- versions it leaves dead are pruned before the results need the room), those of
-- `job_attempts` to 50 %. Only pages written from now on follow this.
ALTER TABLE jobs SET (fillfactor = 40);
ALTER TABLE job_attempts SET (fillfactor = 50);

-- A job without a stored document (no key) wrote a null key into this index on every update.
-- Every reader looks a key up by equality, which implies a key, so the index leaves them out.
DROP INDEX jobs_document_key;
CREATE INDEX jobs_document_key ON jobs ((payload #>> '{document,key}'))
    WHERE kind = 'document' AND payload #>> '{document,key}' IS NOT NULL;
