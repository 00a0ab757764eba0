//! The README's "Using it", compiled as written (`integration-tests/tests/readme` keeps
//! the README's copy identical to this file).

use axum::{Router, routing::get};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider};
use spanprof::viewer::{DEFAULT_MAX_TRACES, RecentSpans, Viewer, ViewerThread};
use spanprof::{ProfileCorrelationLayer, Profiler, SpanProfileLayer, SpanProfileProcessor};
use tower::ServiceBuilder;
use tower_http::trace::{DefaultMakeSpan, TraceLayer};
use tracing_subscriber::{EnvFilter, prelude::*};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. Build the runtime yourself: `#[tokio::main]` cannot install spanprof's hooks
    //    (per-thread samplers; with `--cfg tokio_unstable`, spawned tasks inherit labels).
    //    install_runtime_hooks replaces on_thread_start/stop set before it.
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    builder.enable_all().build()?.block_on(serve())
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    // 2. The profiler: 99 Hz for every request, 1 kHz for hot ones (SPANPROF_BASELINE_HZ,
    //    SPANPROF_HIGH_HZ override the defaults).
    let profiler = Profiler::builder().with_env()?.start()?;

    // 3. Traces: spans end with pyroscope.profile.id and spanprof.* attributes, go to the
    //    viewer's recent spans, then to OTLP (OTEL_EXPORTER_OTLP_ENDPOINT, default
    //    http://localhost:4317; nothing listening there only costs a log line).
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()?;
    let spans = RecentSpans::new(DEFAULT_MAX_TRACES);
    let provider = SdkTracerProvider::builder()
        // The service.name of traces and profiles alike.
        .with_resource(Resource::builder().with_service_name("shop").build())
        .with_span_processor(SpanProfileProcessor::new(spans.processor(Some(Box::new(
            BatchSpanProcessor::builder(exporter).build(),
        )))))
        .build();
    tracing_subscriber::registry()
        .with(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with(tracing_subscriber::fmt::layer())
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("shop")))
        .with(SpanProfileLayer::new())
        .init();

    // 4. The viewer, on a loopback port (VIEWER_ADDR, default 127.0.0.1:6060), thread
    //    and runtime of its own.
    let viewer = ViewerThread::start(
        Viewer::new(profiler.clone(), spans),
        address("VIEWER_ADDR", "127.0.0.1:6060").parse()?,
        false,
    )?;
    println!("viewer http://{}/debug/spanprof/", viewer.local_addr());

    // 5. The one layer in the service, inside TraceLayer, in one ServiceBuilder (axum
    //    boxes each route once per `.layer` call). TraceLayer's spans are DEBUG by
    //    default: make them INFO.
    let app = Router::new().route("/hash", get(hash)).layer(
        ServiceBuilder::new()
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO)),
            )
            .layer(ProfileCorrelationLayer::new()),
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
    viewer.stop();
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
