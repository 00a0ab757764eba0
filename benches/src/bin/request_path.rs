//! What spanprof's request path costs the thread that serves a request, with the
//! CPU caches warm and cold: the JSON API's `POST /api/orders` called in this process
//! (no network) through the user's stack (`TraceLayer`, `tracing-opentelemetry`, the
//! SDK's batch processor) and through the same stack with spanprof as docs/layer.md
//! sets it up, labels only (no sampler, so no signal lands in the timing). Each
//! request runs as a task of its own on a current-thread runtime, as a connection's
//! task does in a server, so the runtime hooks run around its polls.
//!
//! Each round times `--requests` requests of each mode one at a time: warm, a mode's
//! requests back to back, the modes taking each place in turn; cold, the modes taking
//! turns request by request in a new shuffled order each time, with memory read
//! before each request (as a server's other work would evict what the request used).
//! A round's figure for a mode is the median of its requests' wall times; the metric
//! is the median of the per-round differences, each mode minus `stack`, in ns a
//! request.
//!
//! `--modes` (comma-separated; default `labels-only,stack-again`) picks what runs
//! beside `stack`: `labels-only`; modes that leave one piece of it out
//! (`no-span-layer`, `no-hooks`, `no-processor`); `lookup-layer`, which puts in
//! `SpanProfileLayer`'s place a layer that makes one span lookup per callback and
//! nothing else; and `stack-again`, a second `stack` (the A/A control).
//!
//! The cold rounds read one byte of every 4 160 bytes of 256 MiB before each request:
//! a page each (the data TLB emptied) at the next line of its page each time (every
//! cache set reached: the L2 emptied). The code TLB is left as it was. `--evict-stride
//! 64 --evict-mib 4` reads every line of 4 MiB instead: the L2 alone. The JSON names
//! the transparent huge page setting, under which `always` would map the buffer with
//! few TLB entries.
//!
//! `cargo run --release -p spanprof-bench --bin request_path -- [--rounds 15] [--requests 1000] [--evict-mib 256] [--evict-stride 4160] [--modes labels-only,no-span-layer,stack-again]`

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Instant;

use axum::Router;
use http_body_util::BodyExt;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use spanprof::tower::{ProfileCorrelationLayer, RoutePolicy, SpanProfileLayer};
use spanprof_bench::{arg, median, order_bodies, print_json, tracer_provider};
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
    /// Serves one request (built before the clock starts); returns its wall time in
    /// ns.
    fn request(&self, body: &bytes::Bytes) -> u64 {
        let request = http::Request::post(service::ORDERS_ROUTE)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(body.clone()))
            .expect("request");
        let app = self.app.clone();
        let t = Instant::now();
        let n = tracing::dispatcher::with_default(&self.dispatch, || {
            // A task of its own, as a server's connection task: the runtime hooks
            // run around its polls.
            self.rt.block_on(async move {
                tokio::spawn(async move {
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
                .await
                .expect("request task")
            })
        });
        let ns = t.elapsed().as_nanos() as u64;
        black_box(n);
        ns
    }
}

/// The user's stack alone: `TraceLayer` and `tracing-opentelemetry` with the SDK's batch
/// processor, on a runtime without spanprof's hooks.
fn stack() -> Mode {
    let provider = tracer_provider(false);
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
/// `no-processor`: `SpanProfileProcessor`, the user's batch processor instead) or
/// put [`Lookups`] in `SpanProfileLayer`'s place (`lookup-layer`).
fn with_spanprof(profiler: &spanprof::Profiler, mode: &str) -> Mode {
    let provider = tracer_provider(mode != "no-processor");
    let dispatch = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("request_path")))
        .with((!matches!(mode, "no-span-layer" | "lookup-layer")).then(SpanProfileLayer::new))
        .with((mode == "lookup-layer").then_some(Lookups))
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

/// A layer that makes one lookup of the span in its extensions at every enter, exit
/// and close, and does nothing else: what any layer that keeps state in spans costs
/// (`lookup-layer`, in `SpanProfileLayer`'s place).
struct Lookups;

/// Never inserted: the lookups miss, as they do for a span without labels.
struct Unset;

impl<S> tracing_subscriber::Layer<S> for Lookups
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_enter(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            black_box(span.extensions_mut().get_mut::<Unset>().is_some());
        }
    }

    fn on_exit(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            black_box(span.extensions_mut().get_mut::<Unset>().is_some());
        }
    }

    fn on_close(&self, id: tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            black_box(span.extensions().get::<Unset>().is_some());
        }
    }
}

/// Reads a byte of every `stride` bytes of `buf`. With a stride of a page and a
/// line, each read is on a page of its own and at the next line of its page, so that
/// the reads reach every set of the caches: what the data TLB and the L2 held is gone.
fn evict(buf: &[u8], stride: usize) {
    let buf = black_box(buf);
    let mut sum = 0u8;
    for line in buf.chunks(stride) {
        sum = sum.wrapping_add(line[0]);
    }
    black_box(sum);
}

/// A permutation of `0..n`, shuffled by `seed` (xorshift and Fisher–Yates).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

/// Median ns a request of each mode in round `r` of `n` requests each. Warm: each
/// mode's requests back to back, the modes taking each place in turn by round. Cold:
/// the modes take turns request by request, in a new shuffled order each time (so no
/// mode always follows the same one), each request after `evict`.
fn round(
    modes: &[Mode],
    bodies: &[bytes::Bytes],
    n: usize,
    r: usize,
    evict_buf: Option<(&[u8], usize)>,
) -> Vec<f64> {
    let mut each: Vec<Vec<f64>> = vec![Vec::with_capacity(n); modes.len()];
    match evict_buf {
        None => {
            for k in 0..modes.len() {
                let m = (k + r) % modes.len();
                for i in 0..n {
                    each[m].push(modes[m].request(&bodies[i % bodies.len()]) as f64);
                }
            }
        }
        Some((buf, stride)) => {
            for i in 0..n {
                for m in shuffled(modes.len(), (r * n + i) as u64) {
                    evict(buf, stride);
                    each[m].push(modes[m].request(&bodies[i % bodies.len()]) as f64);
                }
            }
        }
    }
    each.iter().map(|t| median(t)).collect()
}

/// A positive number from `--name`, or `default`.
fn positive(name: &str, default: usize) -> usize {
    let v = arg(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}: a positive whole number, not {v}"))
    });
    assert!(v > 0, "{name}: a positive whole number, not 0");
    v
}

/// The modes `--modes` names (comma-separated), `stack` first.
const MODES: [&str; 7] = [
    "stack",
    "labels-only",
    "no-span-layer",
    "no-hooks",
    "no-processor",
    "stack-again",
    "lookup-layer",
];

/// Times the modes and prints the figures as JSON.
fn main() {
    let rounds = positive("--rounds", 15);
    let n = positive("--requests", 1000);
    let evict_mib = positive("--evict-mib", 256);
    let stride = positive("--evict-stride", 4096 + 64);
    let names: Vec<String> = arg("--modes").map_or(
        vec!["labels-only".to_owned(), "stack-again".to_owned()],
        |v| v.split(',').map(str::to_owned).collect(),
    );
    for (i, m) in names.iter().enumerate() {
        assert!(
            MODES[1..].contains(&m.as_str()),
            "--modes: unknown mode {m} (one of {:?})",
            &MODES[1..]
        );
        assert!(!names[..i].contains(m), "--modes: {m} given twice");
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
    let bodies = order_bodies();
    let buf = vec![1u8; evict_mib << 20];
    // Warm-up: every mode's code, tables and pools.
    round(&modes, &bodies, n, 0, None);
    let mut results = serde_json::Map::new();
    for (cache, evict_buf) in [("warm", None), ("cold", Some((&buf[..], stride)))] {
        let mut per_mode = serde_json::Map::new();
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        for r in 0..rounds {
            for (t, m) in times
                .iter_mut()
                .zip(round(&modes, &bodies, n, r, evict_buf))
            {
                t.push(m);
            }
        }
        let stack_ns = times[0].clone();
        per_mode.insert(
            "stack".to_owned(),
            serde_json::json!({ "ns": median(&times[0]).round() }),
        );
        for (name, t) in names.iter().zip(&times[1..]) {
            let over: Vec<f64> = t.iter().zip(&stack_ns).map(|(a, b)| a - b).collect();
            let (lo, hi) = over
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
            per_mode.insert(
                name.clone(),
                serde_json::json!({
                    "ns": median(t).round(),
                    "over_stack_ns": median(&over).round(),
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
        "evict_stride": stride,
        "transparent_hugepage": std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .ok()
            .and_then(|s| Some(s.split('[').nth(1)?.split(']').next()?.to_owned())),
        "results": results,
    }));
}
