//! Blob storage through `object_store`: a local folder by default, S3-compatible by URL.
//! The database keeps only keys and metadata; names are generated here, never the user's.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload};

use crate::error::{EngineError, Result};

/// Blob storage for uploaded documents.
#[derive(Clone)]
pub struct Blobs {
    store: Arc<dyn ObjectStore>,
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
        Ok(Blobs { store: Arc::new(store) })
    }

    /// `s3://bucket/prefix` and the like; credentials and endpoint from the usual `AWS_*`
    /// environment variables (e.g. `AWS_ENDPOINT` for MinIO or other S3-compatible stores).
    pub fn from_url(url: &str) -> Result<Blobs> {
        let parsed = url::Url::parse(url).map_err(|e| EngineError::Invalid(format!("blob store URL: {e}")))?;
        let options: Vec<(String, String)> =
            std::env::vars().filter(|(k, _)| k.starts_with("AWS_")).map(|(k, v)| (k.to_lowercase(), v)).collect();
        let (store, prefix) = object_store::parse_url_opts(&parsed, options).map_err(storage)?;
        let store: Arc<dyn ObjectStore> = if prefix.as_ref().is_empty() {
            Arc::from(store)
        } else {
            Arc::new(object_store::prefix::PrefixStore::new(store, prefix))
        };
        Ok(Blobs { store })
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

    /// Store a streamed upload's chunks without copying them into one buffer.
    pub async fn put_chunks(&self, key: &str, chunks: Vec<Bytes>) -> Result<()> {
        self.store.put(&ObjectPath::from(key), chunks.into_iter().collect::<PutPayload>()).await.map_err(storage)?;
        Ok(())
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
