//! Blob storage through `object_store`: a local folder by default, S3-compatible by URL.
//! The database keeps only keys and metadata; names are generated here, never the user's.

use std::path::Path;
use std::sync::Arc;

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
}

fn storage(e: object_store::Error) -> EngineError {
    match e {
        object_store::Error::NotFound { .. } => EngineError::NotFound,
        other => EngineError::Storage(other.to_string()),
    }
}

impl Blobs {
    /// A local folder (created if missing).
    pub fn local(folder: &Path) -> Result<Blobs> {
        std::fs::create_dir_all(folder).map_err(|e| EngineError::Storage(e.to_string()))?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(folder).map_err(storage)?;
        Ok(Blobs { store: Arc::new(store), part_bytes: 1 << 20 })
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
        Ok(Blobs { store, part_bytes: 5 << 20 })
    }

    /// A fresh, server-generated key.
    pub fn new_key() -> String {
        let mut bytes = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
        format!("documents/{}", hex::encode(bytes))
    }

    /// Store `data` under `key` (replacing what was there).
    pub async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        self.store.put(&ObjectPath::from(key), PutPayload::from(data)).await.map_err(storage)?;
        Ok(())
    }

    /// Start writing a blob part by part: memory is bounded by a part, not by the blob, and
    /// nothing is visible under `key` until [`BlobWriter::finish`].
    pub async fn writer(&self, key: &str) -> Result<BlobWriter> {
        let upload = self.store.put_multipart(&ObjectPath::from(key)).await.map_err(storage)?;
        Ok(BlobWriter { inner: WriteMultipart::new_with_chunk_size(upload, self.part_bytes) })
    }

    /// The blob as a stream of chunks (downloads never hold a whole document).
    pub async fn stream(&self, key: &str) -> Result<BoxStream<'static, Result<Bytes>>> {
        let got = self.store.get(&ObjectPath::from(key)).await.map_err(storage)?;
        Ok(got.into_stream().map_err(storage).boxed())
    }

    /// Keys of documents stored before `before`, in batches of up to `batch`, as the store
    /// lists them (a store of millions never sits in memory at once).
    pub fn documents_before(&self, before: DateTime<Utc>, batch: usize) -> BoxStream<'static, Result<Vec<String>>> {
        self.store
            .list(Some(&ObjectPath::from("documents")))
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

/// A blob being written (see [`Blobs::writer`]).
pub struct BlobWriter {
    inner: WriteMultipart,
}

impl BlobWriter {
    /// Add bytes; waits while earlier parts are still being written, so memory stays bounded.
    pub async fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.inner.wait_for_capacity(1).await.map_err(storage)?;
        self.inner.write(bytes);
        Ok(())
    }

    /// Make the blob visible under its key.
    pub async fn finish(self) -> Result<()> {
        self.inner.finish().await.map_err(storage)?;
        Ok(())
    }

    /// Throw away what was written; nothing is left under the key.
    pub async fn abort(self) {
        if let Err(e) = self.inner.abort().await {
            tracing::warn!(error = %e, "could not abort a blob upload");
        }
    }
}
