-- Stored bytes per user as a counter the transitions move (issue 55, item 5): the storage
-- quota's check (every upload and estimate) read every job its owner ever had, twice. Now it
-- reads one row. Kept by triggers, so every path that admits, releases or deletes a job, or
-- writes a part, moves it in its own transaction:
--   stored_documents: each owner's documents still kept, with how many of its jobs hold each
--                     (a document shared by "run again" counts once);
--   part_storage:     each job's part text and answers, in bytes;
--   storage_deltas:   what each of those changes moved an owner's bytes by, appended (never a
--                     row updated in place: one hot row per owner would take its lock in
--                     whatever order the transition's other locks came, and deadlock an
--                     upload against a finishing document); the upkeep folds an owner's rows
--                     into one.
-- An owner's stored bytes are the sum of their deltas. The reconciliation checks them
-- against the rows they count.

CREATE TABLE stored_documents (
    owner_id bigint  NOT NULL,
    key      text    NOT NULL,
    size     bigint  NOT NULL,
    holders  integer NOT NULL,
    PRIMARY KEY (owner_id, key)
);

CREATE TABLE part_storage (
    job_id   uuid   PRIMARY KEY,
    owner_id bigint NOT NULL,
    bytes    bigint NOT NULL DEFAULT 0
);
CREATE INDEX part_storage_by_owner ON part_storage (owner_id);

CREATE TABLE storage_deltas (
    user_id bigint NOT NULL,
    bytes   bigint NOT NULL
);
CREATE INDEX storage_deltas_by_user ON storage_deltas (user_id) INCLUDE (bytes);

CREATE FUNCTION sluice_storage_add(p_user bigint, p_bytes bigint) RETURNS void LANGUAGE sql AS $$
    INSERT INTO storage_deltas (user_id, bytes) SELECT p_user, p_bytes WHERE p_bytes <> 0;
$$;

-- One job no longer holds its document: the last holder's release frees its bytes.
CREATE FUNCTION sluice_document_let_go(p_owner bigint, p_key text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    left_holders integer;
    freed bigint;
BEGIN
    UPDATE stored_documents SET holders = holders - 1 WHERE owner_id = p_owner AND key = p_key
    RETURNING holders, size INTO left_holders, freed;
    IF left_holders IS NOT NULL AND left_holders <= 0 THEN
        DELETE FROM stored_documents WHERE owner_id = p_owner AND key = p_key;
        PERFORM sluice_storage_add(p_owner, -freed);
    END IF;
END $$;

CREATE FUNCTION sluice_storage_after_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH held AS (
        SELECT owner_id, payload #>> '{document,key}' AS key,
               max(coalesce((payload #>> '{document,size}')::numeric, 0))::int8 AS size, count(*)::int AS n
        FROM new_jobs
        WHERE kind = 'document' AND document_released_at IS NULL AND payload #>> '{document,key}' IS NOT NULL
        GROUP BY 1, 2),
    upserted AS (
        INSERT INTO stored_documents AS d (owner_id, key, size, holders) SELECT owner_id, key, size, n FROM held
        ON CONFLICT (owner_id, key) DO UPDATE SET holders = d.holders + EXCLUDED.holders
        RETURNING d.owner_id, d.size, (d.xmax = 0) AS first)
    INSERT INTO storage_deltas (user_id, bytes)
    SELECT owner_id, sum(size) FROM upserted WHERE first GROUP BY owner_id;
    RETURN NULL;
END $$;

CREATE FUNCTION sluice_storage_after_delete() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    gone record;
BEGIN
    FOR gone IN
        SELECT owner_id, payload #>> '{document,key}' AS key FROM old_jobs
        WHERE kind = 'document' AND document_released_at IS NULL AND payload #>> '{document,key}' IS NOT NULL
    LOOP
        PERFORM sluice_document_let_go(gone.owner_id, gone.key);
    END LOOP;
    -- Its parts' bytes go with it (whether the cascade deleted its parts before or after).
    WITH parts AS (DELETE FROM part_storage p USING old_jobs o WHERE p.job_id = o.id RETURNING p.owner_id, p.bytes)
    INSERT INTO storage_deltas (user_id, bytes)
    SELECT owner_id, -sum(bytes) FROM parts GROUP BY owner_id HAVING sum(bytes) <> 0;
    RETURN NULL;
END $$;

CREATE FUNCTION sluice_storage_after_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM sluice_document_let_go(NEW.owner_id, NEW.payload #>> '{document,key}');
    RETURN NULL;
END $$;

CREATE FUNCTION sluice_storage_after_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE stored_documents, part_storage, storage_deltas;
    RETURN NULL;
END $$;

CREATE FUNCTION sluice_part_bytes() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    job uuid;
    delta bigint := 0;
    owner bigint;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        job := OLD.job_id;
        delta := delta - (octet_length(OLD.body) + octet_length(OLD.overlap) + coalesce(octet_length(OLD.output), 0));
    END IF;
    IF TG_OP <> 'DELETE' THEN
        job := NEW.job_id;
        delta := delta + (octet_length(NEW.body) + octet_length(NEW.overlap) + coalesce(octet_length(NEW.output), 0));
    END IF;
    IF delta = 0 THEN
        RETURN NULL;
    END IF;
    UPDATE part_storage SET bytes = bytes + delta WHERE job_id = job RETURNING owner_id INTO owner;
    IF owner IS NULL THEN
        IF TG_OP = 'DELETE' THEN
            RETURN NULL; -- its job is gone, and its bytes were counted off with it
        END IF;
        SELECT j.owner_id INTO owner FROM jobs j WHERE j.id = job;
        IF owner IS NULL THEN
            RETURN NULL;
        END IF;
        INSERT INTO part_storage AS p (job_id, owner_id, bytes) VALUES (job, owner, delta)
        ON CONFLICT (job_id) DO UPDATE SET bytes = p.bytes + EXCLUDED.bytes;
    END IF;
    PERFORM sluice_storage_add(owner, delta);
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_storage_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION sluice_storage_after_insert();
CREATE TRIGGER jobs_storage_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS old_jobs FOR EACH STATEMENT EXECUTE FUNCTION sluice_storage_after_delete();
CREATE TRIGGER jobs_storage_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_storage_after_truncate();
-- The hot path never names `document_released_at`: this costs its updates nothing.
CREATE TRIGGER jobs_storage_release AFTER UPDATE OF document_released_at ON jobs
    FOR EACH ROW WHEN (OLD.kind = 'document' AND OLD.document_released_at IS NULL AND NEW.document_released_at IS NOT NULL
                       AND NEW.payload #>> '{document,key}' IS NOT NULL)
    EXECUTE FUNCTION sluice_storage_after_release();
CREATE TRIGGER job_parts_storage AFTER INSERT OR UPDATE OR DELETE ON job_parts
    FOR EACH ROW EXECUTE FUNCTION sluice_part_bytes();

-- What is stored now.
INSERT INTO stored_documents (owner_id, key, size, holders)
SELECT owner_id, payload #>> '{document,key}', max(coalesce((payload #>> '{document,size}')::numeric, 0))::int8, count(*)
FROM jobs WHERE kind = 'document' AND document_released_at IS NULL AND payload #>> '{document,key}' IS NOT NULL
GROUP BY 1, 2;
INSERT INTO part_storage (job_id, owner_id, bytes)
SELECT p.job_id, j.owner_id, sum(octet_length(p.body) + octet_length(p.overlap) + coalesce(octet_length(p.output), 0))
FROM job_parts p JOIN jobs j ON j.id = p.job_id GROUP BY 1, 2;
INSERT INTO storage_deltas (user_id, bytes)
SELECT owner_id, sum(bytes) FROM (
    SELECT owner_id, size AS bytes FROM stored_documents UNION ALL SELECT owner_id, bytes FROM part_storage) counted
GROUP BY owner_id;
