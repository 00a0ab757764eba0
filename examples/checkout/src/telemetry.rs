//! Tracing, OpenTelemetry and spanprof wiring: spans go to the viewer's recent-span
//! store (and, with an OTLP endpoint, to a collector over gRPC or HTTP, as
//! `OTEL_EXPORTER_OTLP_PROTOCOL` says) through spanprof's span processor, which adds
//! each span's profile id and figures. They are sent by spanprof's OTLP span
//! exporter, which queues them while the collector is away (retrying with backoff,
//! bounded by bytes), so a collector outage loses no span.
//!
//! Only the application's spans are made and exported: the trace filter
//! ([`DEFAULT_TRACE_FILTER`], `CHECKOUT_TRACE_FILTER` to change it) keeps the
//! `checkout` crate's spans at `info` — a checkout is eight spans across the three
//! services — and leaves out the hundred-odd spans per request that h2, tonic and
//! hyper make at `debug`/`trace`. Logs (`RUST_LOG`, default [`DEFAULT_LOG_FILTER`])
//! go to stderr, with colours only when stderr is a terminal and `NO_COLOR` is unset.

use std::io::IsTerminal;

use opentelemetry::propagation::{Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider, SpanProcessor};
use spanprof::export::{OtlpProtocol, OtlpSpanExporter, OtlpSpansConfig, SpanDeliveryHandle};
use spanprof::tower::{SpanProfileLayer, SpanProfileProcessor};
use spanprof_viewer::RecentSpans;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::prelude::*;

/// The spans made and exported unless `CHECKOUT_TRACE_FILTER` says otherwise (an
/// `EnvFilter`, like `RUST_LOG`; for example `checkout=info,tower_http=debug`).
pub const DEFAULT_TRACE_FILTER: &str = "checkout=info";
/// The logs written unless `RUST_LOG` says otherwise.
pub const DEFAULT_LOG_FILTER: &str = "warn,spanprof=info";

/// How spans travel to an OTLP collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceProtocol {
    /// OTLP/gRPC (`grpc`, the default; port 4317 by convention).
    #[default]
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`; port 4318, path `/v1/traces`).
    HttpProtobuf,
}

impl TraceProtocol {
    /// The value of `OTEL_EXPORTER_OTLP_*PROTOCOL` for it.
    pub fn as_str(self) -> &'static str {
        match self {
            TraceProtocol::Grpc => "grpc",
            TraceProtocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// How tracing is set up.
#[derive(Debug, Clone)]
pub struct Telemetry {
    /// The OpenTelemetry `service.name` of traces and profiles. From
    /// `OTEL_SERVICE_NAME`, else `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, else
    /// `checkout`.
    pub service_name: String,
    /// Where spans are exported over OTLP (none: the viewer only). From
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as it is), else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (with `/v1/traces` added for OTLP/HTTP).
    pub otlp_endpoint: Option<String>,
    /// OTLP/gRPC or OTLP/HTTP. From `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, else gRPC.
    pub otlp_protocol: TraceProtocol,
    /// Which spans are made and exported ([`DEFAULT_TRACE_FILTER`]; `CHECKOUT_TRACE_FILTER`).
    pub trace_filter: String,
    /// Which logs go to stderr ([`DEFAULT_LOG_FILTER`]; `RUST_LOG`); `None`: no logs.
    pub log_filter: Option<String>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            service_name: "checkout".into(),
            otlp_endpoint: None,
            otlp_protocol: TraceProtocol::Grpc,
            trace_filter: DEFAULT_TRACE_FILTER.into(),
            log_filter: Some(DEFAULT_LOG_FILTER.into()),
        }
    }
}

impl Telemetry {
    /// From the environment variables named on each field. An unknown protocol is an
    /// error naming its variable.
    pub fn from_env() -> Result<Self, String> {
        Telemetry::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`Telemetry::from_env`], reading variables through `var`.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let var = |k: &str| var(k).filter(|v| !v.is_empty());
        let d = Telemetry::default();
        let (protocol_var, protocol) = [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ]
        .into_iter()
        .find_map(|k| var(k).map(|v| (k, v)))
        .unwrap_or(("", "grpc".to_owned()));
        let otlp_protocol = match protocol.as_str() {
            "grpc" => TraceProtocol::Grpc,
            "http/protobuf" => TraceProtocol::HttpProtobuf,
            other => {
                return Err(format!(
                    "{protocol_var} `{other}`: the checkout example sends spans over `grpc` or `http/protobuf`"
                ));
            }
        };
        let otlp_endpoint = match var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            Some(e) => Some(e),
            None => var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|e| match otlp_protocol {
                TraceProtocol::Grpc => e,
                TraceProtocol::HttpProtobuf => format!("{}/v1/traces", e.trim_end_matches('/')),
            }),
        };
        Ok(Telemetry {
            service_name: spanprof::env_service_name(var).unwrap_or(d.service_name),
            otlp_endpoint,
            otlp_protocol,
            trace_filter: var("CHECKOUT_TRACE_FILTER").unwrap_or(d.trace_filter),
            log_filter: Some(var("RUST_LOG").unwrap_or(DEFAULT_LOG_FILTER.into())),
        })
    }
}

fn filter(name: &str, directives: &str) -> Result<EnvFilter, String> {
    EnvFilter::try_new(directives).map_err(|e| format!("{name} `{directives}`: {e}"))
}

/// The tracer provider, and what became of the spans sent over OTLP.
#[derive(Debug)]
pub struct Tracing {
    /// The provider (shut it down at the end: the last spans are exported then).
    pub provider: SdkTracerProvider,
    /// With an OTLP endpoint: the span exporter's counters (sent, retried, dropped,
    /// pending) and the deadline of its flush at shutdown. An outage is logged once
    /// as it begins and once as it ends.
    pub exports: Option<SpanDeliveryHandle>,
}

/// Installs the global tracing subscriber and returns the tracer provider. Errors
/// name the setting at fault (a filter that does not parse, an endpoint the OTLP
/// exporter refuses).
pub fn init(spans: &RecentSpans, t: &Telemetry) -> Result<Tracing, String> {
    let trace_filter = filter("CHECKOUT_TRACE_FILTER", &t.trace_filter)?;
    let log_filter = t
        .log_filter
        .as_deref()
        .map(|f| filter("RUST_LOG", f))
        .transpose()?;
    let (otlp, exports): (Option<Box<dyn SpanProcessor>>, _) = match &t.otlp_endpoint {
        Some(endpoint) => {
            let protocol = match t.otlp_protocol {
                TraceProtocol::Grpc => OtlpProtocol::Grpc,
                TraceProtocol::HttpProtobuf => OtlpProtocol::HttpProtobuf,
            };
            let exporter = OtlpSpanExporter::start(OtlpSpansConfig::new(endpoint, protocol))
                .map_err(|e| {
                    format!(
                        "OTEL_EXPORTER_OTLP_ENDPOINT `{}`: {e}",
                        spanprof::export::redact_url(endpoint)
                    )
                })?;
            let handle = exporter.handle();
            (
                Some(Box::new(BatchSpanProcessor::builder(exporter).build())),
                Some(handle),
            )
        }
        None => (None, None),
    };
    let provider = SdkTracerProvider::builder()
        .with_resource(
            Resource::builder()
                .with_service_name(t.service_name.clone())
                .build(),
        )
        .with_span_processor(SpanProfileProcessor::new(spans.processor(otlp)))
        .build();
    let tracer = provider.tracer("checkout");
    let colours = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let logs = log_filter.map(|f| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(colours)
            .with_filter(f)
    });
    // spanprof's layer sees the spans OpenTelemetry's does: the application's. It comes
    // after OpenTelemetry's, which has attached an entered span's context by then.
    let traces = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .and_then(SpanProfileLayer::new())
        .with_filter(trace_filter);
    let _ = tracing_subscriber::registry()
        .with(traces)
        .with(logs)
        .try_init();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    Ok(Tracing { provider, exports })
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

/// The server span of a request to `service`: named `METHOD route` (`route` a
/// template such as `/cart/{id}`, never a raw path: names must stay few and free of
/// ids and secrets), a child of the caller's `traceparent` if that is well formed
/// (W3C's rules, [`spanprof::tower::extract_trace_context`]), with a `service.name`
/// attribute (the three services share one process and one tracer provider here).
pub fn server_span<B>(req: &http::Request<B>, service: &'static str, route: &str) -> tracing::Span {
    let span = tracing::info_span!(
        "request",
        otel.name = %format!("{} {}", req.method(), route),
        otel.kind = "server",
        service.name = service,
        http.route = %route,
    );
    let _ = span.set_parent(spanprof::tower::extract_trace_context(req.headers()));
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
