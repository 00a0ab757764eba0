//! A labelled axum service built with the feature `otel-thread-ctx`, for the tests
//! that read it from outside (`tests/otel_ctx`).
//!
//! `otel_ctx_service SPANS_FILE [labels-only|in-process]`: prints `port N` once it
//! listens, serves until its standard input closes, then writes every exported span
//! to SPANS_FILE, one per line: trace id, span id, start and end (Unix ns), name.
//!
//! Routes: `GET /work/{n}` (CPU in the request future, in an inner span `crunch` and
//! in a task it spawns and awaits, each over several polls), `GET /fork` (forks a
//! child that sleeps 5 s; answers its pid).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use axum::Router;
use axum::extract::{MatchedPath, Path};
use axum::routing::get;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{BatchConfigBuilder, SdkTracerProvider, SpanData, SpanExporter};
use spanprof::{
    ProfileCorrelationLayer, Profiler, Sampling, SpanProfileLayer, SpanProfileProcessor,
};
use tokio::io::AsyncReadExt;
use tracing::Instrument;
use tracing_subscriber::prelude::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let spans_file = args.get(1).expect("SPANS_FILE").clone();
    let sampling = match args.get(2).map(String::as_str) {
        None | Some("labels-only") => Sampling::LabelsOnly,
        Some("in-process") => Sampling::InProcess,
        Some(other) => panic!("unknown sampling {other}"),
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(serve(spans_file, sampling));
}

async fn serve(spans_file: String, sampling: Sampling) {
    let profiler = Profiler::builder()
        .sampling(sampling)
        .start()
        .expect("profiler");
    let spans = Arc::new(Mutex::new(Vec::<String>::new()));
    let exporter = LineExporter(spans.clone());
    let provider = SdkTracerProvider::builder()
        .with_resource(
            Resource::builder()
                .with_service_name("otel-ctx-test")
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.instance.id",
                    "instance-42",
                ))
                .build(),
        )
        // A large queue: the test compares every read with the spans exported.
        .with_span_processor(SpanProfileProcessor::batch_with_config(
            exporter,
            BatchConfigBuilder::default()
                .with_max_queue_size(1 << 18)
                .with_max_export_batch_size(4096)
                .with_scheduled_delay(Duration::from_millis(100))
                .build(),
        ))
        .build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("otel-ctx-test")))
        .with(SpanProfileLayer::new())
        .init();
    let app = Router::new()
        .route("/work/{n}", get(work))
        .route("/fork", get(fork))
        .layer(
            tower::ServiceBuilder::new()
                .layer(tower_http::trace::TraceLayer::new_for_http().make_span_with(
                    |req: &axum::http::Request<axum::body::Body>| {
                        let route = req
                            .extensions()
                            .get::<MatchedPath>()
                            .map_or("", MatchedPath::as_str);
                        tracing::info_span!("request", otel.name = %format!("{} {route}", req.method()))
                    },
                ))
                .layer(ProfileCorrelationLayer::builder().profiler(profiler.clone()).build().expect("layer")),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    println!("port {}", listener.local_addr().expect("address").port());
    std::io::stdout().flush().expect("stdout");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let mut sink = Vec::new();
            let _ = tokio::io::stdin().read_to_end(&mut sink).await;
        })
        .await
        .expect("serve");
    provider.shutdown().expect("span export");
    let lines = spans.lock().unwrap().join("");
    std::fs::write(&spans_file, lines).expect("spans file");
    profiler.stop();
}

/// About `units` × 10 µs of CPU.
fn burn(units: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for i in 0..units * 4_000 {
        h = std::hint::black_box((h ^ i).wrapping_mul(0x0100_0000_01b3));
    }
    h
}

async fn work(Path(n): Path<u64>) -> String {
    let units = 2 + n % 5;
    let mut h = burn(units);
    tokio::task::yield_now().await;
    h ^= async {
        let a = burn(units);
        tokio::task::yield_now().await;
        a ^ burn(units)
    }
    .instrument(tracing::info_span!("crunch"))
    .await;
    h ^= tokio::spawn(async move {
        let a = burn(units);
        tokio::task::yield_now().await;
        a ^ burn(units)
    })
    .await
    .expect("child task");
    format!("{h:016x}")
}

async fn fork() -> String {
    spanprof_core::testing::fork_sleeping_child(5).to_string()
}

/// Keeps each exported span as a line.
#[derive(Debug)]
struct LineExporter(Arc<Mutex<Vec<String>>>);

impl SpanExporter for LineExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let ns =
            |t: std::time::SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
        let mut spans = self.0.lock().unwrap();
        for s in batch {
            spans.push(format!(
                "{} {} {} {} {}\n",
                s.span_context.trace_id(),
                s.span_context.span_id(),
                ns(s.start_time),
                ns(s.end_time),
                s.name
            ));
        }
        Ok(())
    }
}
