-- Users delete their documents and their account (issue 25). A deleted job stays as a line of
-- the credit history, with what the user sent and got erased; a deleted account keeps its row
-- (the ledger's books) without its e-mail address or password.
ALTER TABLE jobs ADD COLUMN deleted_at timestamptz;
ALTER TABLE users ADD COLUMN deleted_at timestamptz;
