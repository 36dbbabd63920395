#!/bin/bash
# Measures `server backup` and `server restore` (the book's docs/src/operating.md, Backup and restore): 20,000 jobs and
# 1,000 documents of 100 KiB on the dev cluster (`cargo xtask pg` running; a debug build).
set -e
cd /work/main
SOCK=/work/main/.data/dev-postgres
BASE="postgres://postgres@localhost:5432"
psql "$BASE/postgres?host=$SOCK" -qc "DROP DATABASE IF EXISTS backupbench" -c "DROP DATABASE IF EXISTS restorebench" -c "CREATE DATABASE backupbench" -c "CREATE DATABASE restorebench"
SRC="$BASE/backupbench?host=$SOCK"; DST="$BASE/restorebench?host=$SOCK"
rm -rf /tmp/bench/a /tmp/bench/b /tmp/bench/backup; mkdir -p /tmp/bench/a/blobs/documents /tmp/bench/b
DATABASE_URL="$SRC" SLUICE_DATA_DIR=/tmp/bench/a SLUICE_LOG=warn target/debug/server migrate
python3 - <<'PY'
import os
for i in range(1000):
    with open(f"/tmp/bench/a/blobs/documents/doc{i}", "wb") as f:
        f.write(os.urandom(100*1024))
PY
psql "$SRC" -q <<'SQL'
INSERT INTO users (email, password_hash, balance) VALUES ('bench@example.com', 'x', 100000);
INSERT INTO jobs (owner_id, kind, payload, state, cost, finished_at)
SELECT (SELECT id FROM users LIMIT 1), 'document',
       jsonb_build_object('document', jsonb_build_object('key', 'documents/doc' || (g % 1000), 'type', 'text', 'sha256', md5(g::text), 'size', 102400, 'name', 'file' || g || '.txt'), 'preset', 'summarize'),
       'done', 1, now()
FROM generate_series(1, 20000) g;
SQL
echo "source: $(du -sh /tmp/bench/a/blobs | cut -f1) of documents, $(psql "$SRC" -tAc "SELECT pg_size_pretty(pg_database_size(current_database()))") database"
/usr/bin/time -f "backup wall %e s" env DATABASE_URL="$SRC" SLUICE_DATA_DIR=/tmp/bench/a SLUICE_LOG=warn target/debug/server backup --to /tmp/bench/backup
echo "backup folder: $(du -sh /tmp/bench/backup | cut -f1)"
/usr/bin/time -f "restore wall %e s" env DATABASE_URL="$DST" SLUICE_DATA_DIR=/tmp/bench/b SLUICE_LOG=warn target/debug/server restore --from /tmp/bench/backup
echo "restored jobs: $(psql "$DST" -tAc 'SELECT count(*) FROM jobs'), documents: $(ls /tmp/bench/b/blobs/documents | wc -l)"
