-- A document's answer kept before its completion is written (issue 58). A worker hands a
-- successful attempt to its completer, which writes results in batches; a process that dies
-- in between lost the answer, and the rescue sent the document to the provider again: paid
-- twice. The processor now keeps the answer here, durably, before handing it on, and an
-- attempt that finds its job's answer kept uses it without calling anyone. Rows of ended jobs
-- are forgotten by the upkeep (and with their job).
CREATE TABLE kept_answers (
    job_id uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    result jsonb NOT NULL,
    input_tokens bigint,
    output_tokens bigint,
    kept_at timestamptz NOT NULL DEFAULT now()
);
