//! Where the database comes from: `DATABASE_URL`, or the private cluster this process runs
//! (the embedded default).

use crate::cli::Config;

/// How to treat an embedded cluster that may already be running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cluster {
    /// The server owns its cluster: start it (taking over one a killed server left), stop it on close.
    Own,
    /// Operator commands use the cluster a running server has up, without stopping it
    /// afterwards; they start it (and stop it again) only if none runs.
    Borrow,
}

/// The database URL, and the embedded cluster if this process started one.
pub struct Database {
    pub url: String,
    cluster: Option<pgcluster::Cluster>,
}

impl Database {
    /// The configured database, or the embedded cluster in `<data-dir>/postgres`.
    pub async fn open(config: &Config, mode: Cluster) -> anyhow::Result<Database> {
        if let Some(url) = &config.server.database_url {
            return Ok(Database { url: url.expose().to_string(), cluster: None });
        }
        let folder = config.server.data_dir.join("postgres");
        if mode == Cluster::Own {
            tracing::info!(folder = %folder.display(), "starting the embedded Postgres cluster");
        }
        let cluster = tokio::task::spawn_blocking(move || -> anyhow::Result<pgcluster::Cluster> {
            let cluster = match mode {
                Cluster::Own => pgcluster::Cluster::start(&folder)?,
                Cluster::Borrow => pgcluster::Cluster::attach_or_start(&folder)?,
            };
            cluster.create_database("sluice")?;
            Ok(cluster)
        })
        .await??;
        if config.server.data_dir.join("postgres").is_symlink() {
            tracing::info!(
                folder = %cluster.data_dir().display(),
                "the Postgres user cannot reach the data folder (a parent folder is private, like root's home), \
                 so the embedded cluster lives here; the data folder links to it"
            );
        }
        Ok(Database { url: cluster.url("sluice"), cluster: Some(cluster) })
    }

    /// Stop the embedded cluster if this process started it.
    pub async fn close(mut self) {
        if let Some(mut cluster) = self.cluster.take() {
            tracing::info!("stopping the embedded Postgres cluster");
            let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
        }
    }
}
