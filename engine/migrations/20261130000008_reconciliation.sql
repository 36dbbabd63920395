-- Reconciliation reports: when the books were checked, what was checked, and every
-- discrepancy found (with the ids to look at). Evidence, kept; nothing is repaired by a run.
CREATE TABLE reconciliation_reports (
    id            bigserial PRIMARY KEY,
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz NOT NULL DEFAULT now(),
    actor         text        NOT NULL,
    checks        jsonb       NOT NULL,
    discrepancies jsonb       NOT NULL,
    found         integer     NOT NULL
);
CREATE INDEX reconciliation_reports_newest ON reconciliation_reports (finished_at DESC);
