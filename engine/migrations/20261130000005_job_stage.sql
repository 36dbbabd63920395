-- What a running job is doing (reading, waiting for the provider, writing) and since when,
-- for the people watching it. Written only by the attempt that holds the lease; it describes
-- the current attempt while stage_since >= started_at, and means nothing in other states.
ALTER TABLE jobs
    ADD COLUMN stage       text CHECK (stage IN ('reading', 'waiting_for_provider', 'writing')),
    ADD COLUMN stage_since timestamptz,
    ADD COLUMN stage_pages integer;
