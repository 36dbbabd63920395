//! The web layer's walls: request and header timeouts, slow readers, connections in all and
//! per address, which proxies are believed, and how much one console action may take.

use std::time::Duration;

use clap::Args;

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Web and connections")]
pub struct WebArgs {
    /// Seconds a request other than an upload or a download may take (slow clients too); 408 past it.
    #[arg(long, env = "SLUICE_REQUEST_TIMEOUT_SECS", default_value_t = 30, global = true)]
    pub request_timeout_secs: u64,
    /// Seconds a request's headers may take to arrive, and a kept-alive connection may sit idle.
    #[arg(long, env = "SLUICE_HEADER_READ_TIMEOUT_SECS", default_value_t = 10.0, global = true)]
    pub header_read_timeout_secs: f64,
    /// Seconds a client may take to read 16 KiB of an answer waiting for it (a download's
    /// minimum rate); past it the connection is closed.
    #[arg(long, env = "SLUICE_STALLED_WRITE_TIMEOUT_SECS", default_value_t = 30.0, global = true)]
    pub stalled_write_timeout_secs: f64,
    /// Connections open at once; past it a new one is answered 503 and closed.
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS", default_value_t = 4096, global = true)]
    pub max_connections: usize,
    /// Connections open at once from one client address (IPv4, IPv6 /64; trusted proxies
    /// aside); past it a new one may still ask for /healthz, anything else is answered 503.
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = 256, global = true)]
    pub max_connections_per_address: usize,
    /// Reverse proxies (IP addresses, comma-separated) whose X-Forwarded-For is believed for
    /// the throttles; by default none is, and the peer address counts.
    #[arg(long, env = "SLUICE_TRUSTED_PROXIES", value_delimiter = ',', global = true)]
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// The most jobs one bulk action of the console (cancel, replay or discard what a search
    /// matches) may take; a search matching more is refused with "narrow it".
    #[arg(long, env = "SLUICE_BULK_ACTION_CAP", default_value_t = 10_000, global = true)]
    pub bulk_action_cap: i64,
}

impl WebArgs {
    /// How long a request other than an upload or a download may take.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs.max(1))
    }

    /// How long a request's headers may take, and a kept-alive connection may idle.
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.header_read_timeout_secs.clamp(0.1, 3600.0))
    }

    /// How long a client may take to read 16 KiB of a waiting answer.
    pub fn stalled_write_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.stalled_write_timeout_secs.clamp(0.1, 3600.0))
    }
}
