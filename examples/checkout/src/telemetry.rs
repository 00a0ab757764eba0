//! Tracing, OpenTelemetry and spanprof wiring: spans go to the viewer's recent-span
//! store (and, if `OTEL_EXPORTER_OTLP_ENDPOINT` is set, to an OTLP collector over
//! gRPC) through spanprof's span processor, which adds each span's profile id and
//! figures.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider, SpanProcessor};
use spanprof::tower::{SpanProfileLayer, SpanProfileProcessor};
use spanprof_viewer::RecentSpans;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::prelude::*;

/// Installs the global tracing subscriber and returns the tracer provider.
pub fn init(spans: &RecentSpans, service_name: &str, log: bool) -> SdkTracerProvider {
    let otlp: Option<Box<dyn SpanProcessor>> = match std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Ok(endpoint) if !endpoint.is_empty() => {
            match opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .build()
            {
                Ok(exporter) => {
                    eprintln!("traces: OTLP/gRPC to {endpoint}");
                    Some(Box::new(BatchSpanProcessor::builder(exporter).build()))
                }
                Err(e) => {
                    eprintln!("traces: OTLP exporter not started: {e}");
                    None
                }
            }
        }
        _ => None,
    };
    let provider = SdkTracerProvider::builder()
        .with_resource(
            Resource::builder()
                .with_service_name(service_name.to_owned())
                .build(),
        )
        .with_span_processor(SpanProfileProcessor::new(spans.processor(otlp)))
        .build();
    let tracer = provider.tracer("checkout");
    let fmt = log.then(|| {
        tracing_subscriber::fmt::layer()
            .with_target(false)
            .with_filter(tracing_subscriber::EnvFilter::new(
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,spanprof=info".into()),
            ))
    });
    let _ = tracing_subscriber::registry()
        .with(SpanProfileLayer::new())
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .with(fmt)
        .try_init();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    provider
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            http::header::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// The server span of a request to `service`: named `METHOD route`, child of the
/// caller's `traceparent`, with a `service.name` attribute (the three services share
/// one process and one tracer provider here).
pub fn server_span<B>(req: &http::Request<B>, service: &'static str) -> tracing::Span {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| {
            // gRPC and payments paths are templates already; an unmatched API path
            // could hold ids, so it is not used.
            if service == "checkout" {
                "(unmatched)".to_owned()
            } else {
                req.uri().path().to_owned()
            }
        });
    let span = tracing::info_span!(
        "request",
        otel.name = %format!("{} {}", req.method(), route),
        otel.kind = "server",
        service.name = service,
        http.route = %route,
    );
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(req.headers()));
    let _ = span.set_parent(parent);
    span
}

/// Writes the current span's context into outgoing headers.
pub fn inject(headers: &mut http::HeaderMap) {
    let cx = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
}

/// The profiling layer of the two backend services (inventory, payments): every
/// call labelled, 10 % of traces and every call past 100 ms profiled at the high
/// rate.
pub fn backend_layer() -> std::io::Result<spanprof::tower::ProfileCorrelationLayer> {
    spanprof::tower::ProfileCorrelationLayer::builder()
        .default_policy(
            spanprof::tower::RoutePolicy::new()
                .sample_rate(0.1)
                .slow_after(std::time::Duration::from_millis(100)),
        )
        .build()
        .map_err(std::io::Error::other)
}
