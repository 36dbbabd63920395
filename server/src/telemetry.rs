//! Logging.

use crate::cli::LogFormat;

/// Log to stdout through `tracing`, filtered by `filter` (EnvFilter syntax; `info` if invalid),
/// as text or as one JSON object a line (with the fields of the spans a line is in: a worker's
/// job id, attempt and user id; a request's method, route and request id).
pub fn init_tracing(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(false).try_init(),
    };
}
