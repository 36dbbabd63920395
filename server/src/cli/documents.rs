//! Uploads and the documents they store: sizes and uploads at once, where the bytes live, and
//! the sandboxed reader's walls (turned into the store and the reader's `SandboxConfig`).

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use engine::documents::sandbox::{RunAs, SandboxConfig};
use engine::documents::Blobs;

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Uploads and documents")]
pub struct DocumentArgs {
    /// Largest upload accepted, in bytes.
    #[arg(long, env = "SLUICE_MAX_UPLOAD_BYTES", default_value_t = 50 * 1024 * 1024, global = true)]
    pub max_upload_bytes: u64,
    /// Uploads read at once; more get 503 with Retry-After before their body is read.
    #[arg(long, env = "SLUICE_MAX_CONCURRENT_UPLOADS", default_value_t = 32, global = true)]
    pub max_concurrent_uploads: usize,
    /// Uploads one client address may have in progress at once, whatever the accounts (several
    /// free accounts on one address share it); past it, 429.
    #[arg(long, env = "SLUICE_MAX_UPLOADS_PER_ADDRESS", default_value_t = 16, global = true)]
    pub max_uploads_per_address: usize,
    /// Blob storage: unset = a folder under the data folder; or a URL like s3://bucket/prefix
    /// (credentials and endpoint from AWS_* variables).
    #[arg(long, env = "SLUICE_BLOB_STORE", global = true)]
    pub blob_store: Option<String>,
    /// Address space of the sandboxed document reader, in MiB.
    #[arg(long, env = "SLUICE_EXTRACT_MEMORY_MIB", default_value_t = 1024, global = true)]
    pub extract_memory_mib: u64,
    /// CPU seconds the document reader may use per document.
    #[arg(long, env = "SLUICE_EXTRACT_CPU_SECS", default_value_t = 30, global = true)]
    pub extract_cpu_secs: u64,
    /// Wall-clock seconds the document reader may take per document.
    #[arg(long, env = "SLUICE_EXTRACT_WALL_SECS", default_value_t = 60, global = true)]
    pub extract_wall_secs: u64,
    /// Document readers running at once per process (0: one per core).
    #[arg(long, env = "SLUICE_EXTRACT_READERS", default_value_t = 0, global = true)]
    pub extract_readers: usize,
    /// Address space of all document readers running at once, in MiB.
    #[arg(long, env = "SLUICE_EXTRACT_MEMORY_BUDGET_MIB", default_value_t = 4096, global = true)]
    pub extract_memory_budget_mib: u64,
    /// The unprivileged user the document reader becomes when the server runs as root.
    #[arg(long, env = "SLUICE_EXTRACT_USER", default_value = "nobody", global = true)]
    pub extract_user: String,
}

impl DocumentArgs {
    /// The document reader: this same binary's hidden `extract` command, with the configured limits.
    pub fn sandbox_config(&self) -> anyhow::Result<SandboxConfig> {
        let program = std::env::current_exe().context("finding this program to start the document reader")?;
        let mut sandbox = SandboxConfig::new(program, vec!["extract".into()]);
        sandbox.memory_bytes = self.extract_memory_mib << 20;
        sandbox.cpu_secs = self.extract_cpu_secs;
        sandbox.wall_clock = Duration::from_secs(self.extract_wall_secs);
        let readers = match self.extract_readers {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            n => n,
        };
        sandbox.limit_readers(readers, self.extract_memory_budget_mib << 20);
        if engine::documents::sandbox::running_as_root() {
            // Root: never let a document be parsed by uid 0; no such user is no start.
            let user = RunAs::lookup(&self.extract_user).with_context(|| {
                format!("the document reader's user {:?} does not exist (--extract-user)", self.extract_user)
            })?;
            anyhow::ensure!(user.uid != 0 && user.gid != 0, "--extract-user must not be root");
            sandbox.run_as = Some(user);
        }
        Ok(sandbox)
    }

    /// Blob storage: a folder under the data folder, or the configured URL.
    pub fn blobs(&self, data_dir: &Path) -> anyhow::Result<Blobs> {
        Ok(match &self.blob_store {
            Some(url) => Blobs::from_url(url)?,
            None => Blobs::local(&data_dir.join("blobs"))?,
        })
    }
}
