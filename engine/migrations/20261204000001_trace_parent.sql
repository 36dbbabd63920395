-- Traces that follow a job (issue 26): the upload's W3C `traceparent`, when traces are
-- exported, so each attempt's span joins the upload's trace.
ALTER TABLE jobs ADD COLUMN trace_parent text CHECK (length(trace_parent) <= 64);
