//! The README's "Using it", compiled as written (`integration-tests/tests/readme` keeps
//! the README's copy identical to this file).

use axum::{Router, routing::get};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider};
use spanprof::viewer::{DEFAULT_MAX_TRACES, Exposure, RecentSpans, Viewer, ViewerThread}; // +viewer
use spanprof::{ProfileCorrelationLayer, Profiler, SpanProfileLayer, SpanProfileProcessor}; // +spanprof
use tower::ServiceBuilder;
use tower_http::trace::{DefaultMakeSpan, TraceLayer};
use tracing_subscriber::{EnvFilter, filter::LevelFilter, prelude::*};

// `#[tokio::main]` with spanprof's runtime hooks: every runtime thread sampled and,
// with `--cfg tokio_unstable`, tasks a request spawns labelled as the request.
#[spanprof::main] // +spanprof
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The profiler: 99 Hz for every request, 1 kHz for hot ones (SPANPROF_BASELINE_HZ,
    // SPANPROF_HIGH_HZ override the defaults).
    let profiler = Profiler::builder().with_env()?.start()?; // +spanprof

    // Traces to OTLP (OTEL_EXPORTER_OTLP_ENDPOINT, default http://localhost:4317;
    // nothing listening there only costs a log line). spanprof's processor writes
    // pyroscope.profile.id and spanprof.* onto the spans samples landed in; the
    // viewer's recorder keeps the recent ones.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()?;
    let batch = BatchSpanProcessor::builder(exporter).build();
    let spans = RecentSpans::new(DEFAULT_MAX_TRACES); // +viewer
    let recorder = spans.processor(Some(Box::new(batch))); // +viewer
    let provider = SdkTracerProvider::builder()
        // The service.name of traces and profiles alike.
        .with_resource(Resource::builder().with_service_name("shop").build())
        .with_span_processor(SpanProfileProcessor::new(recorder)) // +spanprof
        .build();
    // Logs filtered by RUST_LOG; traces and profiles by their own filter, so that a
    // strict RUST_LOG does not remove the spans (docs/layer.md, "Log filters").
    let logs = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_filter(logs))
        .with(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("shop"))
                .and_then(SpanProfileLayer::new()) // +spanprof
                .with_filter(LevelFilter::INFO),
        )
        .init();

    // The viewer, on a loopback port (VIEWER_ADDR, default 127.0.0.1:6060), thread and
    // runtime of its own.
    let viewer_addr = address("VIEWER_ADDR", "127.0.0.1:6060").parse()?; // +viewer
    let viewer = Viewer::new(profiler.clone(), spans); // +viewer
    let viewer = ViewerThread::start(viewer, viewer_addr, Exposure::LoopbackOnly)?; // +viewer
    println!("viewer http://{}/debug/spanprof/", viewer.local_addr()); // +viewer

    // The one layer in the service, inside TraceLayer, in one ServiceBuilder (axum
    // boxes each route once per `.layer` call). TraceLayer's spans are DEBUG by
    // default: make them INFO.
    let app = Router::new().route("/hash", get(hash)).layer(
        ServiceBuilder::new()
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO)),
            )
            .layer(ProfileCorrelationLayer::new()), // +spanprof
    );
    let listener = tokio::net::TcpListener::bind(address("ADDR", "127.0.0.1:3000")).await?;
    println!(
        "service http://{}/hash (Ctrl-C stops)",
        listener.local_addr()?
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    provider.shutdown()?;
    viewer.stop(); // +viewer
    Ok(())
}

/// The address in environment variable `var`, else `default`.
fn address(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// Some CPU work for the profile to show.
async fn hash() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for i in 0..2_000_000u64 {
        h = (h ^ i).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}\n")
}
