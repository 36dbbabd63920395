//! A real S3-compatible server on loopback, for tests of the S3 half of blob storage:
//! `s3s-fs` (the S3 REST protocol, AWS signature V4 checked, over a folder). Not a mock of the
//! client: `object_store` talks HTTP to it exactly as it would to S3 or MinIO.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;

/// The access key the server accepts (with [`SECRET_KEY`]); any other signature is refused.
pub const ACCESS_KEY: &str = "SLUICETESTACCESSKEY";
pub const SECRET_KEY: &str = "sluice-test-secret-key-0123456789";

/// A running server with one empty bucket; stopped and its folder removed when dropped.
pub struct S3Server {
    pub addr: SocketAddr,
    pub bucket: String,
    root: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl S3Server {
    /// Start a server on a free loopback port with the bucket `bucket`.
    pub async fn start(bucket: &str) -> S3Server {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let root = std::env::temp_dir().join(format!(
            "sluice-s3-{}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos()
        ));
        std::fs::create_dir_all(root.join(bucket)).expect("the bucket's folder");
        let fs = s3s_fs::FileSystem::new(&root).expect("an S3 file system");
        let mut builder = s3s::service::S3ServiceBuilder::new(fs);
        builder.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = builder.build();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let task = tokio::spawn(async move {
            let http = Builder::new(TokioExecutor::new());
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                let connection = http.serve_connection(TokioIo::new(socket), service.clone()).into_owned();
                tokio::spawn(async move {
                    let _ = connection.await;
                });
            }
        });
        S3Server { addr, bucket: bucket.to_string(), root, task }
    }

    /// The blob store URL for Sluice: this bucket, under `prefix`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }

    /// What the `AWS_*` variables would say to reach it (lower-cased, as `object_store` takes them).
    pub fn options(&self) -> Vec<(String, String)> {
        [
            ("aws_endpoint", format!("http://{}", self.addr)),
            ("aws_access_key_id", ACCESS_KEY.to_string()),
            ("aws_secret_access_key", SECRET_KEY.to_string()),
            ("aws_region", "us-east-1".to_string()),
            ("aws_allow_http", "true".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Files under the bucket's folder (parts of unfinished multipart uploads included), for
    /// checking that nothing was left behind.
    pub fn stored_files(&self) -> usize {
        fn count(dir: &std::path::Path) -> usize {
            std::fs::read_dir(dir)
                .map(|entries| {
                    entries.filter_map(|e| e.ok()).map(|e| if e.path().is_dir() { count(&e.path()) } else { 1 }).sum()
                })
                .unwrap_or(0)
        }
        count(&self.root)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
