//! Writes each profiled span's figures onto it as it ends, so a trace viewer links a
//! span to its profile (`pyroscope.profile.id`) and shows where its time went.

use std::time::Duration;

use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};

use crate::{ProfileScope, registry};

/// `pyroscope.profile.id`: the span's own 16-hex span id, set on spans whose id is
/// the `span_id` label of their samples (local roots, or every span with
/// [`ProfileScope::AllSpans`]). Grafana Tempo's "traces to profiles" looks for it.
pub const ATTR_PROFILE_ID: &str = "pyroscope.profile.id";
/// Wall time spent inside polls of the span's work, ns (exact).
pub const ATTR_BUSY_NS: &str = "spanprof.busy_ns";
/// The span's duration minus its busy time, ns: time spent waiting.
pub const ATTR_IDLE_NS: &str = "spanprof.idle_ns";
/// Number of polls of the span's work (exact).
pub const ATTR_POLLS: &str = "spanprof.polls";
/// The longest single poll, ns (exact).
pub const ATTR_MAX_POLL_NS: &str = "spanprof.max_poll_ns";
/// CPU samples taken in the span's work (for a local root: in its whole tree).
pub const ATTR_CPU_SAMPLES: &str = "spanprof.cpu_samples";
/// CPU time estimate of those samples, ns (each sample weighted by its period).
pub const ATTR_CPU_NS: &str = "spanprof.cpu_ns";
/// `sampled` or `slow` when the span was profiled at the high rate; absent otherwise.
pub const ATTR_HOT: &str = "spanprof.hot";

/// A [`SpanProcessor`] that adds spanprof's attributes to every profiled span as it
/// ends and passes it on to `next` (your exporting processor).
///
/// ```
/// use opentelemetry_sdk::trace::{SdkTracerProvider, SimpleSpanProcessor, InMemorySpanExporter};
/// use spanprof_tower::SpanProfileProcessor;
///
/// let exporter = InMemorySpanExporter::default();
/// let provider = SdkTracerProvider::builder()
///     .with_span_processor(SpanProfileProcessor::new(SimpleSpanProcessor::new(exporter)))
///     .build();
/// # drop(provider);
/// ```
#[derive(Debug)]
pub struct SpanProfileProcessor<P> {
    next: P,
}

impl<P> SpanProfileProcessor<P> {
    /// Wraps the processor that exports spans.
    pub fn new(next: P) -> Self {
        registry::enable();
        SpanProfileProcessor { next }
    }
}

impl<P: SpanProcessor> SpanProcessor for SpanProfileProcessor<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.next.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        let id = u64::from_be_bytes(span.span_context.span_id().to_bytes());
        if let Some(labels) = registry::take(id) {
            let duration = span
                .end_time
                .duration_since(span.start_time)
                .unwrap_or(Duration::ZERO)
                .as_nanos() as u64;
            let stats = labels.poll_stats();
            let own_id = registry::scope() == ProfileScope::AllSpans
                || labels.root_span_id() == labels.span_id();
            let profile_id = own_id.then(|| KeyValue::new(ATTR_PROFILE_ID, labels.span_id_hex()));
            let hot = labels
                .hotness()
                .as_str()
                .map(|hot| KeyValue::new(ATTR_HOT, hot));
            let figures = profile_id
                .into_iter()
                .chain([
                    KeyValue::new(ATTR_BUSY_NS, stats.busy_ns as i64),
                    KeyValue::new(ATTR_IDLE_NS, duration.saturating_sub(stats.busy_ns) as i64),
                    KeyValue::new(ATTR_POLLS, stats.polls as i64),
                    KeyValue::new(ATTR_MAX_POLL_NS, stats.max_poll_ns as i64),
                    KeyValue::new(ATTR_CPU_SAMPLES, labels.cpu_samples() as i64),
                    KeyValue::new(ATTR_CPU_NS, labels.cpu_ns() as i64),
                ])
                .chain(hot);
            // One allocation of the final length, not a doubling: the span usually
            // holds a dozen attributes already. (Whether the growth costs more in the
            // allocator was measured: it does not, docs/overhead-history.md, 7. and 12.)
            span.attributes.reserve_exact(figures.size_hint().0);
            span.attributes.extend(figures);
        }
        self.next.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.next.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.next.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.next.set_resource(resource);
    }
}
