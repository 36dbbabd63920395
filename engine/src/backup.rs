//! Backup and restore: the database as `pg_dump` writes it (from the Postgres install the
//! server uses) plus every stored document a job in that dump names, taken so that no job in
//! the dump lacks its document. The backup holds off only what it has not copied yet: the
//! documents its snapshot names go into `backup_holds` (while the backup lock keeps deletions
//! out, for the moment it takes to list them), and a deletion of one still held is deferred
//! (`deferred`), never waited for: the backup deletes it itself once copied. Deletions,
//! uploads, "run again" and the queue go on meanwhile. The dump and the list of documents are
//! read from one exported snapshot, so they agree exactly.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

use crate::documents::backup_holds::{BACKUP_LOCK, BACKUP_RUNNING};
use crate::documents::Blobs;
use crate::error::{EngineError, Result};

/// What a backup folder holds besides `database.dump` and `documents/`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub taken_at: chrono::DateTime<chrono::Utc>,
    pub postgres: String,
    pub jobs: i64,
    /// Documents copied, and their bytes.
    pub documents: usize,
    pub document_bytes: u64,
    /// Documents named by jobs that had already released them (nothing to copy).
    pub released: usize,
    pub took_ms: u64,
}

const DUMP: &str = "database.dump";
/// The sessions' table (tower-sessions' Postgres store), whose rows a backup leaves out.
const SESSIONS: &str = "tower_sessions.session";
const DOCUMENTS: &str = "documents";
const MANIFEST: &str = "manifest.json";

/// Write a backup of the database at `database_url` and of `blobs` into `dir` (new or empty),
/// with `pg_dump` from `pg_bin`. Returns what it holds.
pub async fn backup(pool: &PgPool, database_url: &str, blobs: &Blobs, pg_bin: &Path, dir: &Path) -> Result<Manifest> {
    let started = Instant::now();
    let taken_at = chrono::Utc::now();
    private_folder(dir).map_err(|e| io_error("creating the backup folder", e))?;
    if std::fs::read_dir(dir).map_err(|e| io_error("reading the backup folder", e))?.next().is_some() {
        return Err(EngineError::Invalid(format!("{} is not empty: back up into a new folder", dir.display())));
    }
    // Its owner's only: documents and accounts, whatever the umask.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io_error("creating the backup folder", e))?;
    // Held by a connection of its own (released if this process dies), not by the snapshot
    // below, so the snapshot ends as soon as the dump is written and vacuum is not held back.
    let mut lock = pool.acquire().await?;
    sqlx::query("SELECT pg_advisory_lock($1)").bind(BACKUP_RUNNING).execute(&mut *lock).await?;
    // Rows a backup that died left behind: the deletions they deferred are carried out below.
    let mut deferred = match release_holds(&mut lock).await {
        Ok(deferred) => deferred,
        Err(e) => {
            // Never back to the pool holding the lock: close the connection (and the lock).
            drop(lock.detach());
            return Err(e);
        }
    };
    let copied = dump_and_copy(pool, &mut lock, database_url, blobs, pg_bin, dir).await;
    // Whatever was not copied (the backup failed) is held no more, still under this backup's
    // lock, so no later backup's rows are touched; the deletions it deferred happen now.
    let left = release_holds(&mut lock).await;
    if sqlx::query("SELECT pg_advisory_unlock_all()").execute(&mut *lock).await.is_err() {
        drop(lock.detach());
    }
    deferred.extend(left?);
    for key in &deferred {
        delete_deferred(pool, blobs, key).await;
    }
    let (jobs, postgres, documents, document_bytes, released) = copied?;
    let manifest = Manifest {
        taken_at,
        postgres,
        jobs,
        documents,
        document_bytes,
        released,
        took_ms: started.elapsed().as_millis() as u64,
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| EngineError::Storage(e.to_string()))?;
    private_file(&dir.join(MANIFEST))
        .and_then(|mut file| std::io::Write::write_all(&mut file, &json))
        .map_err(|e| io_error("writing the manifest", e))?;
    Ok(manifest)
}

/// A deletion the backup held off: done now; if it fails (busy, the store), the backup goes on
/// and the hourly orphan sweep deletes the document.
async fn delete_deferred(pool: &PgPool, blobs: &Blobs, key: &str) {
    if let Err(e) = crate::documents::sweep::delete_if_unneeded(pool, blobs, key).await {
        tracing::warn!(%key, error = %e, "a deletion the backup held off failed; the orphan sweep will do it");
    }
}

/// Delete every row of `backup_holds`; returns the keys whose deletion was deferred to it.
async fn release_holds(lock: &mut PgConnection) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "WITH gone AS (DELETE FROM backup_holds RETURNING key, deferred) SELECT key FROM gone WHERE deferred",
    )
    .fetch_all(&mut *lock)
    .await?)
}

/// The dump and the documents its jobs name, read from one exported snapshot; the documents
/// are copied once the snapshot has ended (held in `backup_holds` until each is copied).
/// Returns (jobs, the Postgres version, documents copied, their bytes, documents released
/// before the backup).
async fn dump_and_copy(
    pool: &PgPool,
    lock: &mut PgConnection,
    database_url: &str,
    blobs: &Blobs,
    pg_bin: &Path,
    dir: &Path,
) -> Result<(i64, String, usize, u64, usize)> {
    // Deletions in progress finish first (each briefly); new ones wait until the documents
    // the snapshot names are held, then go on.
    sqlx::query("SELECT pg_advisory_lock($1)").bind(BACKUP_LOCK).execute(&mut *lock).await?;
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY").execute(&mut *tx).await?;
    let snapshot: String = sqlx::query_scalar("SELECT pg_export_snapshot()").fetch_one(&mut *tx).await?;
    // A document may be missing only if every job naming it has let it go (released, or
    // deleted by its owner).
    let named: Vec<(String, bool)> = sqlx::query_as(
        "SELECT payload #>> '{document,key}', bool_and(document_released_at IS NOT NULL OR deleted_at IS NOT NULL)
         FROM jobs WHERE kind = 'document' AND payload #>> '{document,key}' IS NOT NULL GROUP BY 1",
    )
    .fetch_all(&mut *tx)
    .await?;
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&mut *tx).await?;
    let postgres: String = sqlx::query_scalar("SHOW server_version").fetch_one(&mut *tx).await?;
    let keys: Vec<&str> = named.iter().map(|(key, _)| key.as_str()).collect();
    sqlx::query("INSERT INTO backup_holds (key) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING")
        .bind(&keys)
        .execute(&mut *lock)
        .await?;
    // Held: deletions go on (deferring what is not copied yet) while the dump is written.
    sqlx::query("SELECT pg_advisory_unlock($1)").bind(BACKUP_LOCK).execute(&mut *lock).await?;
    let (url, password) = without_password(database_url);
    // pg_dump writes into the file made here, keeping its mode.
    private_file(&dir.join(DUMP)).map_err(|e| io_error("writing the dump", e))?;
    let dumped = tokio::process::Command::new(pg_bin.join("pg_dump"))
        // Sessions stay out: a backup holds no key to anyone's account (users log in again
        // after a restore).
        .args([
            "--format=custom",
            "--no-owner",
            "--exclude-table-data",
            SESSIONS,
            "--exclude-table-data",
            "backup_holds",
        ])
        .args(["--snapshot", &snapshot, "--file"])
        .arg(dir.join(DUMP))
        .arg("--dbname")
        .arg(url)
        .envs(password.map(|p| ("PGPASSWORD", p)))
        .output()
        .await
        .map_err(|e| io_error("starting pg_dump", e))?;
    if !dumped.status.success() {
        return Err(EngineError::Storage(format!(
            "pg_dump failed: {}",
            String::from_utf8_lossy(&dumped.stderr).trim()
        )));
    }
    tx.commit().await?;
    let (mut documents, mut document_bytes, mut released) = (0, 0u64, 0);
    for (key, let_go) in &named {
        let path = document_path(dir, key)?;
        let copied = copy_document(blobs, key, &path).await;
        // Copied (or not there to copy): a deletion held off meanwhile happens now.
        let deferred: Option<bool> = sqlx::query_scalar("DELETE FROM backup_holds WHERE key = $1 RETURNING deferred")
            .bind(key)
            .fetch_optional(&mut *lock)
            .await?;
        if deferred == Some(true) {
            delete_deferred(pool, blobs, key).await;
        }
        match copied {
            Ok(bytes) => {
                documents += 1;
                document_bytes += bytes;
            }
            Err(EngineError::NotFound) if *let_go => released += 1,
            Err(EngineError::NotFound) => {
                return Err(EngineError::Storage(format!("the document {key} a kept job names is missing")))
            }
            Err(e) => return Err(e),
        }
    }
    Ok((jobs, postgres, documents, document_bytes, released))
}

/// Stream one document into `path` (memory: a chunk, not the document). Returns its bytes.
async fn copy_document(blobs: &Blobs, key: &str, path: &Path) -> Result<u64> {
    use futures::StreamExt;
    use tokio::io::AsyncWriteExt;
    let mut chunks = blobs.stream(key).await?;
    private_folder(path.parent().unwrap_or(path)).map_err(|e| io_error("creating a folder", e))?;
    let file = private_file(path).map_err(|e| io_error("writing a document", e))?;
    let mut file = tokio::fs::File::from_std(file);
    let mut bytes = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        file.write_all(&chunk).await.map_err(|e| io_error("writing a document", e))?;
        bytes += chunk.len() as u64;
    }
    file.flush().await.map_err(|e| io_error("writing a document", e))?;
    Ok(bytes)
}

/// Restore the backup in `dir` into the empty database at `database_url` (with `pg_restore`
/// from `pg_bin`) and its documents into `blobs`. Refuses a database that has tables.
pub async fn restore(database_url: &str, blobs: &Blobs, pg_bin: &Path, dir: &Path) -> Result<Manifest> {
    let manifest: Manifest = serde_json::from_slice(
        &std::fs::read(dir.join(MANIFEST)).map_err(|e| io_error("reading the backup's manifest", e))?,
    )
    .map_err(|e| EngineError::Invalid(format!("the backup's manifest does not read: {e}")))?;
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(database_url).await?;
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema NOT IN ('pg_catalog', 'information_schema')",
    )
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    if tables > 0 {
        return Err(EngineError::Invalid("the database is not empty: restore into a new one".into()));
    }
    let (url, password) = without_password(database_url);
    let restored = tokio::process::Command::new(pg_bin.join("pg_restore"))
        .args(["--no-owner", "--exit-on-error", "--dbname"])
        .arg(url)
        .envs(password.map(|p| ("PGPASSWORD", p)))
        .arg(dir.join(DUMP))
        .output()
        .await
        .map_err(|e| io_error("starting pg_restore", e))?;
    if !restored.status.success() {
        return Err(EngineError::Storage(format!(
            "pg_restore failed: {}",
            String::from_utf8_lossy(&restored.stderr).trim()
        )));
    }
    let root = dir.join(DOCUMENTS);
    let mut pending = if root.exists() { vec![root.clone()] } else { Vec::new() };
    let (mut documents, mut document_bytes) = (0usize, 0u64);
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).map_err(|e| io_error("reading the documents", e))? {
            let entry = entry.map_err(|e| io_error("reading the documents", e))?;
            let kind = entry.file_type().map_err(|e| io_error("reading the documents", e))?;
            let path = entry.path();
            if kind.is_dir() {
                pending.push(path);
                continue;
            }
            if !kind.is_file() {
                return Err(EngineError::Invalid(format!("not a plain file in the backup: {}", path.display())));
            }
            let key =
                path.strip_prefix(&root).ok().and_then(|p| p.to_str()).ok_or_else(|| {
                    EngineError::Invalid(format!("an unexpected file in the backup: {}", path.display()))
                })?;
            let bytes = std::fs::read(&path).map_err(|e| io_error("reading a document", e))?;
            document_bytes += bytes.len() as u64;
            documents += 1;
            blobs.put(key, bytes.into()).await?;
        }
    }
    if (documents, document_bytes) != (manifest.documents, manifest.document_bytes) {
        return Err(EngineError::Storage(format!(
            "the backup's documents do not match its manifest: {documents} documents of {document_bytes} bytes, \
             the manifest says {} of {}",
            manifest.documents, manifest.document_bytes
        )));
    }
    Ok(manifest)
}

/// Where a document's copy goes: its key as a path under `documents/` (keys are Sluice's own,
/// but one that would leave the folder is refused all the same).
fn document_path(dir: &Path, key: &str) -> Result<PathBuf> {
    let safe = !key.is_empty()
        && key.split('/').all(|part| !part.is_empty() && part != "." && part != ".." && !part.contains('\\'));
    if !safe {
        return Err(EngineError::Invalid(format!("a document key that is not a plain path: {key:?}")));
    }
    Ok(dir.join(DOCUMENTS).join(key))
}

/// Pure: a connection URL without its password, and the password (decoded), so the password
/// goes to pg_dump and pg_restore in their environment, not on a command line `ps` shows.
pub fn without_password(database_url: &str) -> (String, Option<String>) {
    match url::Url::parse(database_url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let password =
                parsed.password().map(|p| percent_encoding::percent_decode_str(p).decode_utf8_lossy().into_owned());
            let _ = parsed.set_password(None);
            (parsed.to_string(), password)
        }
        _ => (database_url.to_string(), None),
    }
}

/// A folder (and its parents) only its owner may enter (0700).
fn private_folder(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// A new file only its owner may read (0600), whatever the umask.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)
}

fn io_error(what: &str, e: std::io::Error) -> EngineError {
    EngineError::Storage(format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::document_path;
    use std::path::Path;

    #[test]
    fn passwords_leave_the_url_for_the_environment() {
        use super::without_password;
        assert_eq!(
            without_password("postgres://app:s%40cret@db.internal:5432/sluice?sslmode=require"),
            ("postgres://app@db.internal:5432/sluice?sslmode=require".to_string(), Some("s@cret".to_string()))
        );
        let socket = "postgres://postgres@localhost:5432/postgres?host=/tmp/x";
        assert_eq!(without_password(socket), (socket.to_string(), None));
    }

    #[test]
    fn document_keys_stay_inside_the_backup() {
        let dir = Path::new("/backup");
        assert_eq!(document_path(dir, "documents/ab/cd").unwrap(), Path::new("/backup/documents/documents/ab/cd"));
        for bad in ["", "../etc/passwd", "a/../../b", "/abs", "a//b", "a/./b", "a\\b"] {
            assert!(document_path(dir, bad).is_err(), "{bad}");
        }
    }
}
