-- When processing was paused (the kill switch), so time spent paused does not count as a job
-- waiting too long: a pause must not turn into a refusal of uploads. One row per pause; an open
-- one (resumed_at NULL) while paused.
CREATE TABLE processing_pauses (
    paused_at  timestamptz PRIMARY KEY,
    resumed_at timestamptz CHECK (resumed_at >= paused_at)
);
CREATE UNIQUE INDEX processing_pauses_one_open ON processing_pauses ((true)) WHERE resumed_at IS NULL;
INSERT INTO processing_pauses (paused_at)
    SELECT processing_changed_at FROM queue_settings WHERE NOT processing_enabled;
