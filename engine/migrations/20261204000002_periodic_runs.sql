-- Periodic work runs once per interval across every process (issue 25): each task's last run,
-- taken by one conditional write, so N processes do not write N reports an hour.
CREATE TABLE periodic_runs (
    task        text        PRIMARY KEY,
    last_run_at timestamptz NOT NULL,
    last_runner text        NOT NULL
);
