-- One table for every throttle (failed logins, sign-ups): an event per counted attempt. Events
-- are taken under a per-key advisory lock, so "count, then add" cannot be raced past the limit.
CREATE TABLE throttle_events (
    id  bigserial   PRIMARY KEY,
    key text        NOT NULL,
    at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX throttle_events_by_key ON throttle_events (key, at);
INSERT INTO throttle_events (key, at) SELECT key, at FROM login_failures;
DROP TABLE login_failures;
