-- A scan's text as OCR read it, kept for the job's next attempts (issue 61): a retry after a
-- provider's refusal, a lost lease or a dead process reads minutes of pages again otherwise.
-- Forgotten with the job's kept answers (ended jobs, released documents, deletions) and with
-- its job.
CREATE TABLE kept_scan_texts (
    job_id uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    text text NOT NULL,
    pages_read integer NOT NULL,
    text_layer_tokens bigint NOT NULL,
    kept_at timestamptz NOT NULL DEFAULT now()
);
