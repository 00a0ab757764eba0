//! Real servers and a real client over loopback, with the OpenTelemetry SDK's
//! in-memory exporter behind spanprof's span processor.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Key, Value};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor, SpanData,
};
use spanprof::{Profile, Profiler};
use spanprof_tower::{SpanProfileLayer, SpanProfileProcessor};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::prelude::*;

pub struct Otel {
    pub exporter: InMemorySpanExporter,
    pub provider: SdkTracerProvider,
}

/// Installs, once per process, tracing + tracing-opentelemetry + spanprof's tracing
/// layer, exporting to memory through spanprof's span processor.
pub fn otel() -> &'static Otel {
    static OTEL: OnceLock<Otel> = OnceLock::new();
    OTEL.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("spanprof-tests")
                    .build(),
            )
            .with_span_processor(SpanProfileProcessor::new(SimpleSpanProcessor::new(
                exporter.clone(),
            )))
            .build();
        let tracer = provider.tracer("spanprof-tests");
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(tracer))
            .with(SpanProfileLayer::new())
            .try_init()
            .expect("install the tracing subscriber");
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        Otel { exporter, provider }
    })
}

/// The profiler the layer started (or a new one).
pub fn profiler() -> Profiler {
    Profiler::current_or_start().expect("profiler")
}

/// A server span for tower-http's `TraceLayer`, child of an incoming `traceparent`.
pub fn server_span<B>(req: &http::Request<B>) -> tracing::Span {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| req.uri().path().to_owned());
    let span = tracing::info_span!(
        "request",
        otel.name = %format!("{} {}", req.method(), route),
        otel.kind = "server",
    );
    let parent = TraceContextPropagator::new()
        .extract(&opentelemetry_http_like::HeaderExtractor(req.headers()));
    let _ = span.set_parent(parent);
    span
}

mod opentelemetry_http_like {
    pub struct HeaderExtractor<'a>(pub &'a http::HeaderMap);
    impl opentelemetry::propagation::Extractor for HeaderExtractor<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(|k| k.as_str()).collect()
        }
    }
}

/// Burns about `ms` of this thread's CPU time in `burn`, in ~1 ms slices with a
/// yield between them, so the request's task moves between workers.
pub async fn burn_async(ms: u64, burn: fn(u64) -> u64) -> u64 {
    let mut acc = 0;
    let mut spent = Duration::ZERO;
    while spent < Duration::from_millis(ms) {
        let t = spanprof::stats::thread_cpu_time();
        let w = Instant::now();
        while w.elapsed() < Duration::from_millis(1) {
            acc ^= burn(2_000);
        }
        spent += spanprof::stats::thread_cpu_time().saturating_sub(t);
        tokio::task::yield_now().await;
    }
    acc
}

/// Burns `ms` of this thread's CPU time in `burn` without yielding (one long poll).
pub fn burn_blocking(ms: u64, burn: fn(u64) -> u64) -> u64 {
    let start = spanprof::stats::thread_cpu_time();
    let mut acc = 0;
    while spanprof::stats::thread_cpu_time() - start < Duration::from_millis(ms) {
        acc ^= burn(2_000);
    }
    acc
}

/// A real HTTP/1 client.
pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// GET `url` with extra headers; returns status and body.
pub async fn http_get(url: &str, headers: &[(&str, &str)]) -> (http::StatusCode, String) {
    let mut req = http::Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client()
        .request(req.body(Empty::new()).unwrap())
        .await
        .expect("request");
    let status = resp.status();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Waits until at least `n` exported spans satisfy `pred`, then returns them.
pub fn wait_spans(n: usize, pred: impl Fn(&SpanData) -> bool) -> Vec<SpanData> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let spans: Vec<SpanData> = otel()
            .exporter
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .filter(|s| pred(s))
            .collect();
        if spans.len() >= n || Instant::now() > deadline {
            return spans;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An attribute of an exported span.
pub fn attr(span: &SpanData, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == Key::from(key.to_owned()))
        .map(|kv| kv.value.clone())
}

/// An integer attribute.
#[track_caller]
pub fn attr_i64(span: &SpanData, key: &str) -> i64 {
    match attr(span, key) {
        Some(Value::I64(v)) => v,
        other => panic!("span {:?}: attribute {key} = {other:?}", span.name),
    }
}

/// The span id as spanprof labels it.
pub fn span_id(span: &SpanData) -> u64 {
    u64::from_be_bytes(span.span_context.span_id().to_bytes())
}

/// Asserts every spanprof attribute is on `span` and the profile id is its own id.
#[track_caller]
pub fn assert_span_attributes(span: &SpanData) {
    let id = format!("{:016x}", span_id(span));
    assert_eq!(
        attr(span, "pyroscope.profile.id").map(|v| v.as_str().into_owned()),
        Some(id),
        "span {:?}",
        span.name
    );
    for key in [
        "spanprof.busy_ns",
        "spanprof.idle_ns",
        "spanprof.polls",
        "spanprof.max_poll_ns",
        "spanprof.cpu_samples",
        "spanprof.cpu_ns",
    ] {
        attr_i64(span, key);
    }
    assert!(attr_i64(span, "spanprof.polls") > 0);
}

/// Asserts `profile`'s top function (by self time) is `expected` and that none of
/// `absent` appears anywhere in it.
#[track_caller]
pub fn assert_top(profile: &Profile, expected: &str, absent: &[&str]) {
    let top = profile.top_functions(3);
    assert!(
        top.first().is_some_and(|f| f.function.ends_with(expected)),
        "top functions {top:?}, expected {expected}"
    );
    for a in absent {
        assert_eq!(profile.cpu_ns_in(a), 0, "{a} in the profile: {top:?}");
    }
}

/// Spans whose name starts with `prefix`.
pub fn named(prefix: &str) -> impl Fn(&SpanData) -> bool + '_ {
    move |s| s.name.starts_with(prefix)
}
