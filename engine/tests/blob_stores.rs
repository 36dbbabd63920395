//! Blob storage behaves the same on a local folder and on S3: every test here runs against
//! both, the S3 one a real S3-compatible server on loopback (`s3s-fs`, signatures checked)
//! reached over HTTP by `object_store`, as a deployment with a bucket would be.

use std::time::Duration;

use bytes::Bytes;
use engine::documents::intake::{self, UploadCheck};
use engine::documents::Blobs;
use engine::testing::wait_for;
use engine::EngineError;
use fakeprovider::s3::S3Server;
use futures::{StreamExt, TryStreamExt};

/// A local folder and an S3 bucket, each fresh. The server and folder live as long as these.
struct Stores {
    local: Blobs,
    s3: Blobs,
    _server: S3Server,
    folder: std::path::PathBuf,
}

impl Drop for Stores {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.folder);
    }
}

async fn stores(name: &str) -> Stores {
    let folder = std::env::temp_dir().join(format!("sluice-blobs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&folder);
    let server = S3Server::start("sluice-documents").await;
    let s3 = Blobs::from_url_with(&server.url("sluice"), server.options()).unwrap();
    Stores { local: Blobs::local(&folder).unwrap(), s3, _server: server, folder }
}

impl Stores {
    fn both(&self) -> [(&'static str, &Blobs); 2] {
        [("local", &self.local), ("s3", &self.s3)]
    }
}

async fn listed(blobs: &Blobs, batch: usize) -> Vec<usize> {
    let later = chrono::Utc::now() + chrono::Duration::minutes(1);
    blobs.documents_before(later, batch).map(|b| b.unwrap().len()).collect().await
}

#[tokio::test]
async fn small_blobs_are_stored_read_listed_and_deleted_alike() {
    let stores = stores("small").await;
    for (name, blobs) in stores.both() {
        let key = Blobs::new_key();
        assert!(!blobs.exists(&key).await.unwrap(), "{name}");
        blobs.put(&key, Bytes::from_static(b"some text")).await.unwrap();
        assert!(blobs.exists(&key).await.unwrap(), "{name}");
        assert_eq!(blobs.get(&key).await.unwrap().as_ref(), b"some text", "{name}");
        blobs.delete(&key).await.unwrap();
        blobs.delete(&key).await.unwrap(); // twice is fine
        assert!(matches!(blobs.get(&key).await, Err(EngineError::NotFound)), "{name}");
        assert!(matches!(blobs.stream(&key).await, Err(EngineError::NotFound)), "{name}");
    }
}

#[tokio::test]
async fn large_blobs_go_up_in_parts_and_come_down_as_a_stream_alike() {
    let stores = stores("large").await;
    // 12 MiB: three parts on S3 (5 MiB each at least), twelve on the folder.
    let data: Vec<u8> = (0..12u32 << 20).map(|i| (i % 251) as u8).collect();
    for (name, blobs) in stores.both() {
        let key = Blobs::new_key();
        let mut writer = blobs.writer(&key).await.unwrap();
        for piece in data.chunks(64 * 1024) {
            writer.write(piece).await.unwrap();
        }
        assert!(!blobs.exists(&key).await.unwrap(), "{name}: nothing visible before it is finished");
        writer.finish().await.unwrap();
        let streamed: Vec<Bytes> = blobs.stream(&key).await.unwrap().try_collect().await.unwrap();
        assert!(streamed.len() > 1, "{name}: streamed in chunks, not as one buffer");
        assert_eq!(streamed.concat(), data, "{name}");

        // An aborted upload leaves nothing under its key.
        let aborted = Blobs::new_key();
        let mut writer = blobs.writer(&aborted).await.unwrap();
        for piece in data.chunks(1 << 20).take(7) {
            writer.write(piece).await.unwrap();
        }
        writer.abort().await;
        assert!(!blobs.exists(&aborted).await.unwrap(), "{name}");
    }
}

/// A writer dropped half way (its request went away) aborts on its own: the parts S3 already
/// holds for it are gone too, not left as an unfinished multipart upload nobody lists.
#[tokio::test]
async fn a_writer_dropped_half_way_leaves_no_parts_behind() {
    let stores = stores("dropped").await;
    let before = stores._server.stored_files();
    let key = Blobs::new_key();
    let mut writer = stores.s3.writer(&key).await.unwrap();
    for piece in vec![7u8; 12 << 20].chunks(1 << 20) {
        writer.write(piece).await.unwrap();
    }
    assert!(
        wait_for(Duration::from_secs(10), || async { stores._server.stored_files() > before }).await,
        "parts were uploaded"
    );
    drop(writer);
    assert!(
        wait_for(Duration::from_secs(10), || async { stores._server.stored_files() == before }).await,
        "{} files left",
        stores._server.stored_files()
    );
    assert!(!stores.s3.exists(&key).await.unwrap());
}

#[tokio::test]
async fn the_orphan_sweep_lists_documents_in_batches_alike() {
    let stores = stores("listing").await;
    for (name, blobs) in stores.both() {
        for n in 0..7 {
            blobs.put(&Blobs::new_key(), Bytes::from(format!("document {n}"))).await.unwrap();
        }
        assert_eq!(listed(blobs, 3).await, [3, 3, 1], "{name}");
        let earlier = chrono::Utc::now() - chrono::Duration::minutes(1);
        assert_eq!(blobs.documents_before(earlier, 3).count().await, 0, "{name}: none stored before then");
    }
}

#[tokio::test]
async fn a_refused_upload_leaves_nothing_behind_alike() {
    let stores = stores("refused").await;
    for (name, blobs) in stores.both() {
        // 6 MiB of text past a 5 MiB cap: refused mid-stream, after a part went up on S3.
        let chunks = (0..96).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'a'; 64 * 1024])));
        let refused = intake::receive(blobs, UploadCheck::new(Some("big.txt"), 5 << 20), futures::stream::iter(chunks));
        let refused = tokio::time::timeout(Duration::from_secs(30), refused).await.expect("in time");
        assert!(matches!(refused, Err(EngineError::TooLarge { .. })), "{name}: {refused:?}");
        assert_eq!(listed(blobs, 10).await.iter().sum::<usize>(), 0, "{name}: no blob");
        // An accepted one is stored whole.
        let text = "Plain words.\n".repeat(1000);
        let chunks = text.as_bytes().chunks(4096).map(|c| Ok::<_, std::io::Error>(Bytes::copy_from_slice(c)));
        let stored = intake::receive(blobs, UploadCheck::new(Some("ok.txt"), 5 << 20), futures::stream::iter(chunks))
            .await
            .unwrap();
        assert_eq!(blobs.get(&stored.key).await.unwrap().as_ref(), text.as_bytes(), "{name}");
    }
}

#[tokio::test]
async fn a_wrong_secret_is_refused_by_the_s3_server() {
    let server = S3Server::start("sluice-documents").await;
    let mut options = server.options();
    for (k, v) in &mut options {
        if k == "aws_secret_access_key" {
            *v = "not-the-secret".into();
        }
    }
    let blobs = Blobs::from_url_with(&server.url("sluice"), options).unwrap();
    let refused = blobs.put(&Blobs::new_key(), Bytes::from_static(b"x")).await;
    assert!(matches!(refused, Err(EngineError::Storage(_))), "signatures are checked: {refused:?}");
}
