//! Blob storage through `object_store`: a local folder by default, S3-compatible by URL.
//! The database keeps only keys and metadata; names are generated here, never the user's.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload, WriteMultipart};

use crate::error::{EngineError, Result};

/// Blob storage for uploaded documents.
#[derive(Clone)]
pub struct Blobs {
    store: Arc<dyn ObjectStore>,
    /// Bytes buffered per upload before a part is written (S3 wants at least 5 MiB parts).
    part_bytes: usize,
    /// The local folder, whose free space can be measured (none for S3).
    folder: Option<PathBuf>,
    /// When a write last found the store full (ms since the epoch; 0: not full).
    full_since_ms: Arc<AtomicU64>,
}

/// After a write found the store full, it counts as full (uploads refused before they are
/// read) until this much is free again...
pub const FULL_UNTIL_FREE_BYTES: u64 = 16 << 20;
/// ...or, for a store whose free space cannot be measured (S3), for this long.
pub const FULL_FOR: Duration = Duration::from_secs(60);

fn storage(e: object_store::Error) -> EngineError {
    match e {
        object_store::Error::NotFound { .. } => EngineError::NotFound,
        other if out_of_space(&other) => EngineError::StoreFull,
        other => EngineError::Storage(other.to_string()),
    }
}

/// Whether an error means the store has no room: the disk's ENOSPC or EDQUOT somewhere in its
/// sources, or an S3-compatible store's "insufficient storage" (MinIO's 507).
fn out_of_space(e: &object_store::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::StorageFull || io.raw_os_error() == Some(libc::EDQUOT) {
                return true;
            }
        }
        source = error.source();
    }
    let said = e.to_string();
    said.contains("No space left on device")
        || said.contains("XMinioStorageFull")
        || said.contains("Insufficient Storage")
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(1).max(1)
}

impl Blobs {
    /// A local folder (created if missing).
    pub fn local(folder: &Path) -> Result<Blobs> {
        std::fs::create_dir_all(folder).map_err(|e| EngineError::Storage(e.to_string()))?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(folder).map_err(storage)?;
        Ok(Blobs {
            store: Arc::new(store),
            part_bytes: 1 << 20,
            folder: Some(folder.to_path_buf()),
            full_since_ms: Arc::default(),
        })
    }

    /// `s3://bucket/prefix` and the like; credentials and endpoint from the usual `AWS_*`
    /// environment variables (e.g. `AWS_ENDPOINT` for MinIO or other S3-compatible stores).
    pub fn from_url(url: &str) -> Result<Blobs> {
        let options =
            std::env::vars().filter(|(k, _)| k.starts_with("AWS_")).map(|(k, v)| (k.to_lowercase(), v)).collect();
        Blobs::from_url_with(url, options)
    }

    /// `s3://bucket/prefix` with the store's options given (`aws_endpoint`, `aws_region`, ...:
    /// what the `AWS_*` variables say, lower-cased).
    pub fn from_url_with(url: &str, options: Vec<(String, String)>) -> Result<Blobs> {
        let parsed = url::Url::parse(url).map_err(|e| EngineError::Invalid(format!("blob store URL: {e}")))?;
        let (store, prefix) = object_store::parse_url_opts(&parsed, options).map_err(storage)?;
        let store: Arc<dyn ObjectStore> = if prefix.as_ref().is_empty() {
            Arc::from(store)
        } else {
            Arc::new(object_store::prefix::PrefixStore::new(store, prefix))
        };
        Ok(Blobs { store, part_bytes: 5 << 20, folder: None, full_since_ms: Arc::default() })
    }

    /// A fresh, server-generated key.
    pub fn new_key() -> String {
        let mut bytes = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
        format!("documents/{}", hex::encode(bytes))
    }

    /// Where a done translation's rebuilt file (a Word or OpenDocument file) is kept, built
    /// once at its first download and streamed from here after: outside `documents/`, which
    /// the orphan sweep and the reconciliation read as uploads.
    pub fn translated_key(job_id: uuid::Uuid) -> String {
        format!("translated/{job_id}")
    }

    /// Where the reason a translated file cannot be built is kept (its paragraphs do not line
    /// up, say): a download after the first answers it without reading the document again.
    pub fn translated_refusal_key(job_id: uuid::Uuid) -> String {
        format!("translated/{job_id}.refused")
    }

    /// Store `data` under `key` (replacing what was there).
    pub async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        self.store.put(&ObjectPath::from(key), PutPayload::from(data)).await.map_err(|e| self.noted(storage(e)))?;
        Ok(())
    }

    /// An error, remembered if it says the store is full.
    fn noted(&self, e: EngineError) -> EngineError {
        note_full(&self.full_since_ms, e)
    }

    /// Bytes free where the documents are stored (a local folder's file system; none for S3).
    pub fn free_bytes(&self) -> Option<u64> {
        let folder = self.folder.as_ref()?;
        let path = std::ffi::CString::new(folder.as_os_str().as_encoded_bytes()).ok()?;
        // SAFETY: a valid C string and a zeroed struct the call fills.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        let ok = unsafe { libc::statvfs(path.as_ptr(), &mut stat) } == 0;
        ok.then(|| (stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
    }

    /// Whether the store is full: a write found it so, and there is not yet
    /// [`FULL_UNTIL_FREE_BYTES`] free again (or, unmeasurable, [`FULL_FOR`] has not passed).
    /// Uploads are refused before they are read meanwhile.
    pub fn is_full(&self) -> bool {
        let since = self.full_since_ms.load(Ordering::Relaxed);
        if since == 0 {
            return false;
        }
        let recovered = match self.free_bytes() {
            Some(free) => free >= FULL_UNTIL_FREE_BYTES,
            None => now_ms().saturating_sub(since) >= FULL_FOR.as_millis() as u64,
        };
        if recovered {
            let _ = self.full_since_ms.compare_exchange(since, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        !recovered
    }

    /// Start writing a blob part by part: memory is bounded by a part, not by the blob, and
    /// nothing is visible under `key` until [`BlobWriter::finish`].
    pub async fn writer(&self, key: &str) -> Result<BlobWriter> {
        let upload = self.store.put_multipart(&ObjectPath::from(key)).await.map_err(|e| self.noted(storage(e)))?;
        Ok(BlobWriter {
            inner: Some(WriteMultipart::new_with_chunk_size(upload, self.part_bytes)),
            full_since_ms: self.full_since_ms.clone(),
        })
    }

    /// The blob as a stream of chunks (downloads never hold a whole document).
    pub async fn stream(&self, key: &str) -> Result<BoxStream<'static, Result<Bytes>>> {
        let got = self.store.get(&ObjectPath::from(key)).await.map_err(storage)?;
        let range = got.range.clone();
        match got.payload {
            // A local file is read a chunk of its own size at a time (object_store's 8 KiB
            // reads, each on a blocking thread, copied about 100 MB a second).
            object_store::GetResultPayload::File(file, _) => Ok(file_chunks(file, range)),
            object_store::GetResultPayload::Stream(stream) => Ok(stream.map_err(storage).boxed()),
        }
    }

    /// Keys of documents stored before `before`, in batches of up to `batch`, as the store
    /// lists them (a store of millions never sits in memory at once).
    pub fn documents_before(&self, before: DateTime<Utc>, batch: usize) -> BoxStream<'static, Result<Vec<String>>> {
        self.keys_before("documents", before, batch)
    }

    /// Keys under `prefix` stored before `before`, in batches of up to `batch`.
    pub fn keys_before(
        &self,
        prefix: &str,
        before: DateTime<Utc>,
        batch: usize,
    ) -> BoxStream<'static, Result<Vec<String>>> {
        self.store
            .list(Some(&ObjectPath::from(prefix)))
            .map_err(storage)
            .try_filter_map(
                move |meta| async move { Ok((meta.last_modified < before).then(|| meta.location.to_string())) },
            )
            .try_chunks(batch)
            .map_err(|e| e.1)
            .boxed()
    }

    /// Whether a blob is stored under `key` (its metadata only, not its bytes).
    pub async fn exists(&self, key: &str) -> Result<bool> {
        match self.store.head(&ObjectPath::from(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(storage(e)),
        }
    }

    /// The whole blob, or `NotFound`.
    pub async fn get(&self, key: &str) -> Result<Bytes> {
        let got = self.store.get(&ObjectPath::from(key)).await.map_err(storage)?;
        got.bytes().await.map_err(storage)
    }

    /// Deleting a missing blob is fine (retention may run twice).
    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.store.delete(&ObjectPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(storage(e)),
        }
    }
}

/// What one read of a local file takes: a chunk in memory, not the file.
const FILE_CHUNK: usize = 1 << 20;

/// The bytes of `file` in `range`, a chunk at a time.
fn file_chunks(file: std::fs::File, range: std::ops::Range<u64>) -> BoxStream<'static, Result<Bytes>> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let start = async move {
        let mut file = tokio::fs::File::from_std(file);
        file.seek(std::io::SeekFrom::Start(range.start)).await?;
        Ok::<_, std::io::Error>(file.take(range.end.saturating_sub(range.start)))
    };
    futures::stream::once(start)
        .map_ok(|reader| {
            futures::stream::try_unfold(reader, |mut reader| async move {
                // No bigger than what is left: a small file's download holds its own size.
                let want = (reader.limit() as usize).clamp(1, FILE_CHUNK);
                let mut chunk = bytes::BytesMut::with_capacity(want);
                while chunk.len() < want {
                    if reader.read_buf(&mut chunk).await? == 0 {
                        break;
                    }
                }
                Ok::<_, std::io::Error>((!chunk.is_empty()).then(|| (chunk.freeze(), reader)))
            })
        })
        .try_flatten()
        .map_err(|e| EngineError::Storage(format!("reading a stored document: {e}")))
        .boxed()
}

/// A blob being written (see [`Blobs::writer`]). Dropped unfinished (its request gone), it
/// aborts in the background: no multipart parts are left in the store.
pub struct BlobWriter {
    /// None once finished or aborted.
    inner: Option<WriteMultipart>,
    /// Its store's (see [`Blobs::is_full`]).
    full_since_ms: Arc<AtomicU64>,
}

fn note_full(full_since_ms: &AtomicU64, e: EngineError) -> EngineError {
    if matches!(e, EngineError::StoreFull) {
        full_since_ms.store(now_ms(), Ordering::Relaxed);
    }
    e
}

impl BlobWriter {
    fn writing(&mut self) -> Result<&mut WriteMultipart> {
        self.inner.as_mut().ok_or_else(|| EngineError::Storage("the blob is already finished".into()))
    }

    /// Add bytes; waits while earlier parts are still being written, so memory stays bounded.
    pub async fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let full = self.full_since_ms.clone();
        let inner = self.writing()?;
        inner.wait_for_capacity(1).await.map_err(|e| note_full(&full, storage(e)))?;
        inner.write(bytes);
        Ok(())
    }

    /// Make the blob visible under its key.
    pub async fn finish(mut self) -> Result<()> {
        let inner = self.inner.take().ok_or_else(|| EngineError::Storage("the blob is already finished".into()))?;
        inner.finish().await.map_err(|e| note_full(&self.full_since_ms, storage(e)))?;
        Ok(())
    }

    /// Throw away what was written; nothing is left under the key.
    pub async fn abort(mut self) {
        if let Some(inner) = self.inner.take() {
            if let Err(e) = inner.abort().await {
                tracing::warn!(error = %e, "could not abort a blob upload");
            }
        }
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            if let Err(e) = inner.abort().await {
                tracing::warn!(error = %e, "could not abort an abandoned blob upload");
            }
        });
    }
}
