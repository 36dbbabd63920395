//! Where the server listens and keeps its data.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::Secret;

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Server")]
pub struct ServerArgs {
    /// Address to listen on.
    #[arg(long, env = "SLUICE_BIND", default_value = "127.0.0.1:3000", global = true)]
    pub bind: SocketAddr,
    /// Postgres to use. When unset, a private cluster is started in <data-dir>/postgres.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<Secret>,
    /// Folder for the embedded Postgres cluster and local blobs.
    #[arg(long, env = "SLUICE_DATA_DIR", default_value = ".data", global = true)]
    pub data_dir: PathBuf,
    /// Where cargo-leptos put the site (JS, WASM, CSS, assets).
    #[arg(long, env = "LEPTOS_SITE_ROOT", default_value = "target/site", global = true)]
    pub site_root: String,
}
