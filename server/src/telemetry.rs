//! Logging, and optional trace export over OTLP (`--otlp-endpoint`).

use anyhow::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::cli::LogFormat;

/// What is exported as spans: Sluice's own spans (requests, attempts, provider calls, reads).
const TRACE_FILTER: &str = "info,sqlx=off,hyper=off,hyper_util=off,reqwest=off,h2=off,tower=off,opentelemetry=off,opentelemetry_sdk=off,opentelemetry_otlp=off,opentelemetry_http=off";

/// Spans still waiting to be sent; [`Traces::flush`] sends them before the process ends.
pub struct Traces(Option<SdkTracerProvider>);

impl Traces {
    /// Send the spans not yet exported (bounded by the exporter's own timeout).
    pub fn flush(self) {
        if let Some(provider) = self.0 {
            let _ = provider.shutdown();
        }
    }
}

/// Log to stdout through `tracing`, filtered by `filter` (EnvFilter syntax; `info` if invalid),
/// as text or as one JSON object a line (with the fields of the spans a line is in: a worker's
/// job id, attempt and user id; a request's method, route and request id). With
/// `otlp_endpoint`, the same spans are also exported as traces (service `sluice`, `role`).
pub fn init_tracing(
    filter: &str,
    format: LogFormat,
    otlp_endpoint: Option<&str>,
    role: &str,
) -> anyhow::Result<Traces> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| "info".into());
    let log = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().boxed(),
        LogFormat::Json => {
            tracing_subscriber::fmt::layer().json().with_current_span(true).with_span_list(false).boxed()
        }
    };
    let provider = otlp_endpoint.map(|endpoint| exporter(endpoint, role)).transpose()?;
    // Traces have a filter of their own: logging at `warn` must not turn them off, and the
    // exporter's own HTTP calls must not become spans to export.
    let traces = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("sluice"))
            .with_filter(tracing_subscriber::EnvFilter::new(TRACE_FILTER))
    });
    let _ = tracing_subscriber::registry().with(log.with_filter(filter)).with(traces).try_init();
    if provider.is_some() {
        engine::telemetry::set_exporting();
    }
    Ok(Traces(provider))
}

/// Spans in batches to `<endpoint>/v1/traces`, as OTLP JSON over HTTP.
fn exporter(endpoint: &str, role: &str) -> anyhow::Result<SdkTracerProvider> {
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(url.clone())
        .build()
        .with_context(|| format!("trace export to {url}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("sluice")
        .with_attribute(opentelemetry::KeyValue::new("sluice.role", role.to_string()))
        .build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}
