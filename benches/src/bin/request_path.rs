//! What spanprof's request path costs the thread that serves a request, with the
//! CPU caches warm and cold: the JSON API's `POST /api/orders` called in this process
//! (no network) through the user's stack (`TraceLayer`, `tracing-opentelemetry`, the
//! SDK's batch processor) and through the same stack with spanprof as docs/layer.md
//! sets it up, labels only (no sampler, so no signal lands in the timing).
//!
//! Each round times `--requests` requests of each mode one at a time, warm (back to
//! back) and cold (`--evict-mib` MiB read between two requests, as a server's other
//! work would evict them), each mode taking each place in turn. A round's figure for a
//! mode is the median of its requests' times; the metric is the median of the
//! per-round differences, spanprof minus stack, in ns a request: what
//! the request path adds with its tables and code in cache, and without them. Their
//! difference is the part an instruction count cannot see.
//!
//! `--modes` (comma-separated; default `labels-only,stack-again`) picks what runs
//! beside `stack`: `labels-only`, modes that leave one piece of it out
//! (`no-span-layer`, `no-hooks`, `no-processor`), and `stack-again`, a second
//! `stack` (the A/A control). The default eviction, 4 MiB, is twice the machine's L2:
//! what a request's own work does to the lines it does not share with the next one.
//!
//! `cargo run --release -p spanprof-bench --bin request_path -- [--rounds 15] [--requests 1000] [--evict-mib 4] [--modes labels-only,no-span-layer,stack-again]`

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Instant;

use axum::Router;
use http_body_util::BodyExt;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use spanprof::tower::{
    ProfileCorrelationLayer, RoutePolicy, SpanProfileLayer, SpanProfileProcessor,
};
use spanprof_bench::{arg, print_json};
use spanprof_workloads::service;
use tower::ServiceExt;
use tower_http::trace::TraceLayer;
use tracing_subscriber::prelude::*;

/// One mode: its subscriber, runtime and router.
struct Mode {
    dispatch: tracing::Dispatch,
    rt: tokio::runtime::Runtime,
    app: Router,
    _provider: SdkTracerProvider,
}

impl Mode {
    /// Serves one request; returns its time on this thread in ns.
    fn request(&self, body: &bytes::Bytes) -> u64 {
        let request = http::Request::post(service::ORDERS_ROUTE)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(body.clone()))
            .expect("request");
        let app = self.app.clone();
        let t = Instant::now();
        let n = tracing::dispatcher::with_default(&self.dispatch, || {
            self.rt.block_on(async move {
                let response = app
                    .oneshot(request)
                    .await
                    .unwrap_or_else(|e: Infallible| match e {});
                response
                    .into_body()
                    .collect()
                    .await
                    .expect("body")
                    .to_bytes()
                    .len()
            })
        });
        let ns = t.elapsed().as_nanos() as u64;
        black_box(n);
        ns
    }
}

fn stack() -> Mode {
    let provider = SdkTracerProvider::builder()
        .with_span_processor(service::batch_processor())
        .build();
    let dispatch = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("request_path")))
        .into();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let app = service::routes().layer(TraceLayer::new_for_http());
    Mode {
        dispatch,
        rt,
        app,
        _provider: provider,
    }
}

/// The stack with spanprof, labels only; `mode` may leave one piece out
/// (`no-span-layer`: `SpanProfileLayer`; `no-hooks`: the runtime hooks;
/// `no-processor`: `SpanProfileProcessor`, the user's batch processor instead).
fn with_spanprof(profiler: &spanprof::Profiler, mode: &str) -> Mode {
    let provider = if mode == "no-processor" {
        SdkTracerProvider::builder()
            .with_span_processor(service::batch_processor())
            .build()
    } else {
        SdkTracerProvider::builder()
            .with_span_processor(SpanProfileProcessor::batch(service::DiscardingExporter))
            .build()
    };
    let dispatch = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("request_path")))
        .with((mode != "no-span-layer").then(SpanProfileLayer::new))
        .into();
    let layer = ProfileCorrelationLayer::builder()
        .default_policy(RoutePolicy::new().sample_rate(0.0))
        .profiler(profiler.clone())
        .build()
        .expect("layer");
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all();
    if mode != "no-hooks" {
        spanprof::install_runtime_hooks(&mut builder);
    }
    let rt = builder.build().expect("runtime");
    let layers = tower::ServiceBuilder::new()
        .layer(TraceLayer::new_for_http())
        .layer(layer);
    let app = service::routes().layer(layers);
    Mode {
        dispatch,
        rt,
        app,
        _provider: provider,
    }
}

/// Reads `buf` a line at a time: what the caches held is gone.
fn evict(buf: &[u8]) {
    let mut sum = 0u8;
    for line in buf.chunks(64) {
        sum = sum.wrapping_add(line[0]);
    }
    black_box(sum);
}

/// Median ns a request of `mode` over `n` requests (robust to a preemption landing
/// in one), `evict` between two when given.
fn time(mode: &Mode, bodies: &[bytes::Bytes], n: usize, evict_buf: Option<&[u8]>) -> f64 {
    let mut each: Vec<f64> = (0..n)
        .map(|i| {
            if let Some(buf) = evict_buf {
                evict(buf);
            }
            mode.request(&bodies[i % bodies.len()]) as f64
        })
        .collect();
    median(&mut each)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The modes `--modes` names (comma-separated), `stack` first.
const MODES: [&str; 6] = [
    "stack",
    "labels-only",
    "no-span-layer",
    "no-hooks",
    "no-processor",
    "stack-again",
];

fn main() {
    let rounds: usize = arg("--rounds").map_or(15, |v| v.parse().expect("--rounds"));
    let n: usize = arg("--requests").map_or(1000, |v| v.parse().expect("--requests"));
    let evict_mib: usize = arg("--evict-mib").map_or(4, |v| v.parse().expect("--evict-mib"));
    let names: Vec<String> = arg("--modes").map_or(
        vec!["labels-only".to_owned(), "stack-again".to_owned()],
        |v| v.split(',').map(str::to_owned).collect(),
    );
    for m in &names {
        assert!(
            MODES[1..].contains(&m.as_str()),
            "--modes: unknown mode {m} (one of {:?})",
            &MODES[1..]
        );
    }
    let profiler = spanprof::Profiler::builder()
        .sampling(spanprof::Sampling::LabelsOnly)
        .start()
        .expect("profiler");
    let mut modes = vec![stack()];
    modes.extend(names.iter().map(|m| match m.as_str() {
        "stack-again" => stack(),
        m => with_spanprof(&profiler, m),
    }));
    let bodies: Vec<bytes::Bytes> = (0..64)
        .map(|seed| {
            serde_json::to_vec(&service::sample_order(seed))
                .expect("order")
                .into()
        })
        .collect();
    let buf = vec![1u8; evict_mib << 20];
    // Warm-up: every mode's code, tables and pools.
    for m in &modes {
        time(m, &bodies, n, None);
    }
    let mut results = serde_json::Map::new();
    for (cache, evict_buf) in [("warm", None), ("cold", Some(&buf[..]))] {
        let mut per_mode = serde_json::Map::new();
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        for round in 0..rounds {
            // Each mode takes each place in turn.
            for k in 0..modes.len() {
                let i = (k + round) % modes.len();
                let t = time(&modes[i], &bodies, n, evict_buf);
                times[i].push(t);
            }
        }
        let stack_ns = times[0].clone();
        per_mode.insert(
            "stack".to_owned(),
            serde_json::json!({ "ns": median(&mut times[0].clone()).round() }),
        );
        for (name, t) in names.iter().zip(&times[1..]) {
            let mut over: Vec<f64> = t.iter().zip(&stack_ns).map(|(a, b)| a - b).collect();
            let (lo, hi) = over
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
            per_mode.insert(
                name.clone(),
                serde_json::json!({
                    "ns": median(&mut t.clone()).round(),
                    "over_stack_ns": median(&mut over).round(),
                    "over_stack_range_ns": [lo.round(), hi.round()],
                }),
            );
        }
        results.insert(cache.to_owned(), serde_json::Value::Object(per_mode));
    }
    profiler.stop();
    print_json(serde_json::json!({
        "bench": "request_path",
        "rounds": rounds,
        "requests": n,
        "evict_mib": evict_mib,
        "results": results,
    }));
}
