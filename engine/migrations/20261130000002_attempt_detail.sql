-- A provider's own error text, masked, for admins; users read `error` (our words) only.
ALTER TABLE job_attempts ADD COLUMN detail text;
