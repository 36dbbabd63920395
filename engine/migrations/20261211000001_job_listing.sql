-- The listing of jobs by owner and by acceptance time, apart from `jobs` (issue 38). Neither
-- column ever changes, but an index over them on `jobs` took one new entry at every update of a
-- job's row (none of those updates is heap-only: the state is in other indexes' predicates), four
-- of a job's eight in a first-attempt success: 27 of 158 µs of Postgres time a job, measured.
-- Rows here are written once, at insert, and go when their job goes (both by statement triggers,
-- so no path can forget them); the listing's readers join `jobs` by key.
CREATE TABLE job_listing (
    job_id      uuid        PRIMARY KEY,
    owner_id    bigint      NOT NULL,
    accepted_at timestamptz NOT NULL
);

-- No job may be inserted (or deleted) between the copy and the triggers below: an older
-- process still running during a deploy would otherwise add jobs the listing never sees.
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO job_listing (job_id, owner_id, accepted_at) SELECT id, owner_id, accepted_at FROM jobs;

-- A user's jobs, newest first (their list, monthly usage, stored bytes, account deletion); the
-- job id makes the order total. (The key serves a search by job id and the triggers.)
CREATE INDEX job_listing_by_owner ON job_listing (owner_id, accepted_at DESC, job_id);
-- Every job, newest first (the admin search, intake rates).
CREATE INDEX job_listing_by_time ON job_listing (accepted_at DESC, job_id);

DROP INDEX jobs_accepted_at;
DROP INDEX jobs_owner_recent;

CREATE FUNCTION sluice_listing_after_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_listing (job_id, owner_id, accepted_at) SELECT n.id, n.owner_id, n.accepted_at FROM new_jobs n;
    RETURN NULL;
END $$;

CREATE FUNCTION sluice_listing_after_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_listing l USING old_jobs o WHERE l.job_id = o.id;
    RETURN NULL;
END $$;

CREATE FUNCTION sluice_listing_after_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE job_listing;
    RETURN NULL;
END $$;

-- The hot path never writes a job's owner or acceptance time (a trigger `OF` these columns
-- costs nothing to an update that does not name them); a repair or a test that does moves the
-- listing's row with it.
CREATE FUNCTION sluice_listing_after_move() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE job_listing l SET owner_id = NEW.owner_id, accepted_at = NEW.accepted_at WHERE l.job_id = OLD.id;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_listing_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION sluice_listing_after_insert();
CREATE TRIGGER jobs_listing_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS old_jobs FOR EACH STATEMENT EXECUTE FUNCTION sluice_listing_after_delete();
CREATE TRIGGER jobs_listing_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_listing_after_truncate();
CREATE TRIGGER jobs_listing_move AFTER UPDATE OF owner_id, accepted_at ON jobs
    FOR EACH ROW WHEN (NEW.owner_id IS DISTINCT FROM OLD.owner_id OR NEW.accepted_at IS DISTINCT FROM OLD.accepted_at)
    EXECUTE FUNCTION sluice_listing_after_move();
