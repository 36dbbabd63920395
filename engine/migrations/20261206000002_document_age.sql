-- A document's age runs from its acceptance across all its parts (issue 33): the vital signs'
-- oldest wait and its alert count a document begun in parts, waiting again (its claim's turn
-- over, a pause, a retry), from its acceptance, not from when it last fell due. Few rows are in
-- parts at once, so this index stays small.
CREATE INDEX jobs_waiting_in_parts ON jobs (accepted_at)
    WHERE state IN ('queued', 'retrying') AND parts_total IS NOT NULL;
