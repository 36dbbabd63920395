//! Logging.

/// Log to stderr through `tracing`, filtered by `filter` (EnvFilter syntax; `info` if invalid).
pub fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}
