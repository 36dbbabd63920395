-- The attempt rows' foreign key to `jobs` (issue 38). Its check ran a `SELECT .. FOR KEY SHARE`
-- on the job for every attempt row a claim inserted, 6 to 8 µs of Postgres time a drained job
-- (measured), for a job the same statement had just locked and updated: only the claim writes
-- attempt rows, for the jobs it claims. What the key did besides, taking a job's attempts with
-- it when the job goes, statement triggers do now (one delete a statement, not one a row).
ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_job_id_fkey;

CREATE FUNCTION sluice_attempts_after_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_attempts a USING old_jobs o WHERE a.job_id = o.id;
    RETURN NULL;
END $$;

-- A delete, not a truncate: a statement that truncates both tables holds `job_attempts` open.
-- (Only tests and benchmarks truncate `jobs`.)
CREATE FUNCTION sluice_attempts_after_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_attempts;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_attempts_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS old_jobs FOR EACH STATEMENT EXECUTE FUNCTION sluice_attempts_after_delete();
CREATE TRIGGER jobs_attempts_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_attempts_after_truncate();
