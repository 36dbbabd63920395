-- Abuse round two (issue 34).

-- An account's deletion looks up its address by index, never by scanning whole tables: the
-- columns holding an actor's address whole, and (by trigram, only rows with an '@') the free
-- text that may name one. See `accounts::deletion::{ADDRESS_COLUMNS, ADDRESS_TEXTS}`.
CREATE EXTENSION IF NOT EXISTS pg_trgm;

CREATE INDEX audit_log_actor ON audit_log (actor);
CREATE INDEX ledger_actor ON ledger (actor) WHERE actor IS NOT NULL;
CREATE INDEX jobs_canceled_by ON jobs (canceled_by) WHERE canceled_by IS NOT NULL;
CREATE INDEX reconciliation_reports_actor ON reconciliation_reports (actor);
CREATE INDEX reconciliation_reports_acked_by ON reconciliation_reports (acked_by) WHERE acked_by IS NOT NULL;
CREATE INDEX reviews_marked_by ON reviews (marked_by);
CREATE INDEX reviews_resolved_by ON reviews (resolved_by) WHERE resolved_by IS NOT NULL;
CREATE INDEX alert_firings_acked_by ON alert_firings (acked_by) WHERE acked_by IS NOT NULL;
CREATE INDEX webhook_deliveries_alert_acked_by ON webhook_deliveries ((body #>> '{alert,acked_by}'))
    WHERE token_id IS NULL;

CREATE INDEX audit_log_subject_text ON audit_log USING gin (subject gin_trgm_ops) WHERE subject LIKE '%@%';
CREATE INDEX audit_log_old_value_text ON audit_log USING gin (old_value gin_trgm_ops) WHERE old_value LIKE '%@%';
CREATE INDEX audit_log_new_value_text ON audit_log USING gin (new_value gin_trgm_ops) WHERE new_value LIKE '%@%';
CREATE INDEX ledger_note_text ON ledger USING gin (note gin_trgm_ops) WHERE note LIKE '%@%';
CREATE INDEX alert_firings_detail_text ON alert_firings USING gin (detail gin_trgm_ops) WHERE detail LIKE '%@%';
CREATE INDEX alert_firings_ack_note_text ON alert_firings USING gin (ack_note gin_trgm_ops) WHERE ack_note LIKE '%@%';
CREATE INDEX reviews_note_text ON reviews USING gin (note gin_trgm_ops) WHERE note LIKE '%@%';
CREATE INDEX reviews_resolution_note_text ON reviews USING gin (resolution_note gin_trgm_ops)
    WHERE resolution_note LIKE '%@%';
CREATE INDEX reconciliation_reports_ack_note_text ON reconciliation_reports USING gin (ack_note gin_trgm_ops)
    WHERE ack_note LIKE '%@%';
CREATE INDEX webhook_deliveries_alert_text ON webhook_deliveries USING gin ((body::text) gin_trgm_ops)
    WHERE token_id IS NULL;

-- The login throttle's rows about an account, by the account's key.
CREATE INDEX throttle_events_account ON throttle_events (split_part(key, ':', 3)) WHERE key LIKE 'login:account:%';

-- A deleted job's notices and webhook deliveries, by the job.
CREATE INDEX notices_by_job ON notices (job_id) WHERE job_id IS NOT NULL;
CREATE INDEX webhook_deliveries_by_job ON webhook_deliveries ((body #>> '{job,id}'));

-- What a backup in progress has yet to copy (see `backup.rs`): a deletion of one of these is
-- deferred to the backup, never waited for. Meaningful only while a backup holds its lock.
CREATE TABLE backup_holds (
    key      text    PRIMARY KEY,
    deferred boolean NOT NULL DEFAULT false
);

-- The document store's free space as the upkeep last saw it, and when a process last found it
-- full (one row; each process's upkeep writes it): the vital signs and the `store_full` alert
-- read it. A process that never met a full store leaves `full_at` as it is.
CREATE TABLE blob_store_space (
    id         integer     PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    free_bytes bigint,
    full_at    timestamptz,
    checked_at timestamptz NOT NULL DEFAULT now()
);
