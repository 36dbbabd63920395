-- The orphan-blob sweep asks which stored documents no job points at.
CREATE INDEX jobs_document_key ON jobs ((payload #>> '{document,key}')) WHERE kind = 'document';
