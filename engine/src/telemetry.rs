//! A job's place in a trace. The upload's trace context is stored with the job (`traceparent`,
//! W3C format), and each attempt's span joins it (child of the upload, and linked to it), so an
//! operator sees upload -> queue wait -> attempt -> provider call as one story. Without an
//! exporter (the server's `--otlp-endpoint`) spans have no trace context and nothing is stored.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::Context;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The current span's trace context as a `traceparent`, when traces are being exported.
pub fn current_trace_parent() -> Option<String> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let span = span.span_context();
    span.is_valid().then(|| format!("00-{}-{}-{:02x}", span.trace_id(), span.span_id(), span.trace_flags().to_u8()))
}

static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Said once by a process that exports traces: only then do attempts look up their upload's
/// trace (a query per attempt that is wasted otherwise).
pub fn set_exporting() {
    EXPORTING.store(true, Ordering::Relaxed);
}

/// Whether this process exports traces.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Pure: a `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`) as a remote span context; None when
/// it is malformed or names the invalid (all-zero) trace or span.
pub fn parse_trace_parent(value: &str) -> Option<SpanContext> {
    let mut fields = value.split('-');
    let (version, trace, span, flags) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    if fields.next().is_some() || version != "00" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// Make `span` (an attempt) part of its job's upload trace: its child, with a link to it.
/// Call it before anything reads the span's context (that starts the span, fixing its parent).
pub fn join_upload_trace(span: &tracing::Span, trace_parent: &str) {
    let Some(upload) = parse_trace_parent(trace_parent) else { return };
    let _ = span.set_parent(Context::new().with_remote_span_context(upload.clone()));
    span.add_link(upload);
}

#[cfg(test)]
mod tests {
    use super::parse_trace_parent;

    #[test]
    fn trace_parents_parse_only_when_well_formed() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = parse_trace_parent(good).unwrap();
        assert_eq!(context.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.span_id().to_string(), "00f067aa0ba902b7");
        assert!(context.is_remote() && context.is_sampled());
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse_trace_parent(bad).is_none(), "{bad}");
        }
    }
}
