//! Where a slow span's time went when it was not CPU: a request's duration split into
//! CPU inside its polls, blocked inside its polls, runnable but not yet polled, and
//! waiting; and a poll that holds a worker too long reported once, on the span and
//! in the log. A real axum server over loopback, a real client, the OpenTelemetry
//! SDK's in-memory exporter behind spanprof's batching span processor (the
//! pipeline a service runs: its attributes are written as each batch is exported).

#[path = "../support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::trace::{BatchConfigBuilder, InMemorySpanExporter, SdkTracerProvider};
use spanprof_tower::{
    ProfileCorrelationLayer, RoutePolicy, SpanProfileLayer, SpanProfileProcessor,
};
use spanprof_workloads::BURNERS;
use support::LogCapture;
use support::web::{attr, attr_i64, burn_blocking, http_get, server_span};
use tower_http::trace::TraceLayer;
use tracing_subscriber::prelude::*;

/// What each handler arranges.
const ARRANGED: Duration = Duration::from_millis(100);

struct Telemetry {
    exporter: InMemorySpanExporter,
    logs: Arc<Mutex<Vec<String>>>,
    provider: SdkTracerProvider,
}

/// tracing + tracing-opentelemetry + spanprof's layer, exporting to memory through
/// spanprof's span processor, and every event captured (nextest runs each test in a
/// process of its own).
fn telemetry() -> &'static Telemetry {
    static T: OnceLock<Telemetry> = OnceLock::new();
    T.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(SpanProfileProcessor::batch_with_config(
                exporter.clone(),
                BatchConfigBuilder::default()
                    .with_scheduled_delay(Duration::from_millis(20))
                    .build(),
            ))
            .build();
        let logs = Arc::new(Mutex::new(Vec::new()));
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("offcpu")))
            .with(SpanProfileLayer::new())
            .with(LogCapture(logs.clone()))
            .try_init()
            .expect("install the tracing subscriber");
        Telemetry {
            exporter,
            logs,
            provider,
        }
    })
}

async fn cpu() -> String {
    burn_blocking(ARRANGED.as_millis() as u64, BURNERS[0].1).to_string()
}

async fn block() -> &'static str {
    std::thread::sleep(ARRANGED);
    "slept"
}

async fn block_50() -> &'static str {
    std::thread::sleep(Duration::from_millis(50));
    "slept"
}

/// A synchronous lookup inside an async handler: 60 ms blocked, no CPU.
#[inline(never)]
fn blocking_lookup() -> &'static str {
    std::thread::sleep(Duration::from_millis(60));
    std::hint::black_box("found")
}

async fn lookup() -> &'static str {
    blocking_lookup()
}

async fn timer() -> &'static str {
    tokio::time::sleep(ARRANGED).await;
    "waited"
}

/// Woken at once, but both workers are then busy with other tasks for `ARRANGED`:
/// two tasks that meet (so that each holds a worker), wake this one, and hold their
/// workers.
async fn ready() -> &'static str {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let arrived = Arc::new(AtomicUsize::new(0));
    let mut tx = Some(tx);
    for _ in 0..2 {
        let (arrived, tx) = (arrived.clone(), tx.take());
        tokio::spawn(async move {
            arrived.fetch_add(1, Ordering::SeqCst);
            let give_up = Instant::now() + Duration::from_secs(2);
            while arrived.load(Ordering::SeqCst) < 2 && Instant::now() < give_up {
                std::hint::spin_loop();
            }
            if let Some(tx) = tx {
                let _ = tx.send(());
            }
            std::thread::sleep(ARRANGED);
        });
    }
    rx.await.unwrap();
    "ready"
}

async fn quick() -> String {
    burn_blocking(1, BURNERS[1].1).to_string()
}

/// The server, its profiler sampling hot polls by wall-clock time at `wall_hz`.
async fn serve_with(wall_hz: u32) -> String {
    telemetry();
    // Runs until the process ends (each test is a process of its own).
    let _profiler = spanprof::Profiler::builder()
        .wall_hz(wall_hz)
        .start()
        .expect("start the profiler");
    let layer = ProfileCorrelationLayer::builder()
        .default_policy(RoutePolicy::new().sample_rate(1.0))
        .route("GET /cold_lookup", RoutePolicy::new().sample_rate(0.0))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/cpu", get(cpu))
        .route("/block", get(block))
        .route("/block50", get(block_50))
        .route("/timer", get(timer))
        .route("/ready", get(ready))
        .route("/quick", get(quick))
        .route("/lookup", get(lookup))
        .route("/cold_lookup", get(lookup))
        .layer(layer)
        .layer(TraceLayer::new_for_http().make_span_with(server_span));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

async fn serve() -> String {
    serve_with(spanprof::defaults::DEFAULT_WALL_HZ).await
}

/// The one exported span of `GET {route}` (after one request to it).
async fn span_of(base: &str, route: &str) -> SpanData {
    let (status, _) = http_get(&format!("{base}{route}"), &[]).await;
    assert_eq!(status, 200, "{route}");
    let name = format!("GET {route}");
    for _ in 0..500 {
        let spans: Vec<SpanData> = telemetry()
            .exporter
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .filter(|s| s.name == name)
            .collect();
        if let [span] = &spans[..] {
            return span.clone();
        }
        assert!(spans.len() < 2, "{name}: {} spans", spans.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no span {name}");
}

/// The four parts of a span's duration, in ms, and the duration.
fn split(span: &SpanData) -> ([f64; 4], f64) {
    let ms = |key| attr_i64(span, key) as f64 / 1e6;
    let parts = [
        ms("spanprof.cpu_ns"),
        ms("spanprof.blocked_ns"),
        ms("spanprof.sched_delay_ns"),
        ms("spanprof.wait_ns"),
    ];
    let duration = span
        .end_time
        .duration_since(span.start_time)
        .unwrap()
        .as_secs_f64()
        * 1e3;
    (parts, duration)
}

#[track_caller]
fn assert_near(what: &str, got: f64, want: f64, span: &SpanData) {
    assert!(
        (got - want).abs() <= want * 0.10,
        "{what} of {}: {got:.1} ms, arranged {want:.1} ms; attributes {:?}",
        span.name,
        span.attributes
    );
}

#[track_caller]
fn assert_small(what: &str, got: f64, span: &SpanData) {
    let bound = ARRANGED.as_secs_f64() * 1e3 * 0.10;
    assert!(
        got <= bound,
        "{what} of {}: {got:.1} ms, arranged ~0; attributes {:?}",
        span.name,
        span.attributes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spans_duration_is_split_into_cpu_blocked_scheduled_and_waiting() {
    // Wall-clock samples wake a thread blocked in a poll; on a loaded machine the
    // wait for a CPU after each wake-up reads as scheduling delay. This test checks
    // the split itself, so it runs without them.
    let base = serve_with(0).await;
    let want = ARRANGED.as_secs_f64() * 1e3;
    // CPU inside its one poll, read from the thread's CPU clock.
    let s = span_of(&base, "/cpu").await;
    let ([cpu, blocked, sched, wait], _) = split(&s);
    assert_eq!(
        attr(&s, "spanprof.cpu_source").map(|v| v.as_str().into_owned()),
        Some("thread_clock".to_owned())
    );
    assert_near("cpu", cpu, want, &s);
    assert_small("blocked", blocked, &s);
    assert_small("wait", wait, &s);
    // On a busy machine the OS preempts the burning thread: runnable, not running,
    // which is scheduling delay, not blocking.
    eprintln!("GET /cpu: preempted for {sched:.1} ms");
    // Blocked inside a poll: a worker held, no CPU.
    let s = span_of(&base, "/block").await;
    let ([cpu, blocked, sched, wait], _) = split(&s);
    assert_near("blocked", blocked, want, &s);
    assert_small("cpu", cpu, &s);
    assert_small("scheduling delay", sched, &s);
    assert_small("wait", wait, &s);
    // Waiting on a timer: not runnable, no worker held.
    let s = span_of(&base, "/timer").await;
    let ([cpu, blocked, sched, wait], _) = split(&s);
    assert_near("wait", wait, want, &s);
    assert_small("cpu", cpu, &s);
    assert_small("blocked", blocked, &s);
    assert_small("scheduling delay", sched, &s);
    // Runnable while both workers are busy with other tasks.
    let s = span_of(&base, "/ready").await;
    let ([cpu, blocked, sched, wait], _) = split(&s);
    assert_near("scheduling delay", sched, want, &s);
    assert_small("cpu", cpu, &s);
    assert_small("blocked", blocked, &s);
    // Until both spawned tasks have started the request truly waits (not runnable):
    // on a loaded machine that takes a few ms more (14 ms seen in CI).
    assert!(
        wait <= want * 0.3,
        "wait of {}: {wait:.1} ms, arranged a few ms; attributes {:?}",
        s.name,
        s.attributes
    );
    // Each split sums to the span's duration.
    for route in ["/cpu", "/block", "/timer", "/ready"] {
        let name = format!("GET {route}");
        let s = telemetry()
            .exporter
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .find(|s| s.name == name)
            .unwrap();
        let (parts, duration) = split(&s);
        let sum: f64 = parts.iter().sum();
        assert!(
            (sum - duration).abs() < 0.01,
            "{name}: {parts:?} sum to {sum:.3} ms, duration {duration:.3} ms"
        );
    }
}

/// The events spanprof logged at WARN.
fn warnings() -> Vec<String> {
    telemetry()
        .logs
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("WARN") && l.contains("held its worker"))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_blocking_poll_is_reported_once_on_its_span_and_in_the_log() {
    let base = serve().await;
    let s = span_of(&base, "/block50").await;
    let events: Vec<_> = s
        .events
        .iter()
        .filter(|e| e.name == "spanprof.long_poll")
        .collect();
    assert_eq!(events.len(), 1, "{:?}", s.events);
    let event = events[0];
    let field = |key: &str| {
        event
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.clone())
            .unwrap_or_else(|| panic!("{key} missing in {event:?}"))
    };
    let duration_ns = match field("duration_ns") {
        opentelemetry::Value::I64(v) => v,
        other => panic!("duration_ns = {other:?}"),
    };
    assert!(duration_ns >= 50_000_000, "{event:?}");
    assert_eq!(field("off_cpu").as_str(), "true", "{event:?}");
    // The top frames sampled inside the poll, leaf first: the blocking call, under
    // the handler that made it.
    let stack: Vec<String> = match field("stack") {
        opentelemetry::Value::Array(opentelemetry::Array::String(frames)) => {
            frames.iter().map(|f| f.to_string()).collect()
        }
        other => panic!("stack = {other:?}"),
    };
    let handler = stack
        .iter()
        .position(|f| f.starts_with("offcpu::block_50"))
        .unwrap_or_else(|| panic!("no frame of the handler in {stack:#?}"));
    assert!(
        stack[..handler].iter().any(|f| f.contains("sleep")),
        "the blocking call is not above the handler in {stack:#?}"
    );
    assert_eq!(attr_i64(&s, "spanprof.long_polls"), 1);
    // The warning waits for the poll's wall-clock samples, and names where it blocked:
    // the handler's own code under the sleep.
    let mut warned = warnings();
    for _ in 0..100 {
        if !warned.is_empty() {
            break;
        }
        spanprof::Profiler::current().unwrap().flush();
        tokio::time::sleep(Duration::from_millis(20)).await;
        warned = warnings();
    }
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(warned[0].contains("/block50"), "{warned:#?}");
    assert!(
        warned[0].contains(", in offcpu::block_50") && warned[0].contains("main.rs:"),
        "the warning names no frame of the handler: {warned:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_without_long_polls_logs_nothing() {
    let base = serve().await;
    for _ in 0..20 {
        let (status, _) = http_get(&format!("{base}/quick"), &[]).await;
        assert_eq!(status, 200);
    }
    telemetry().provider.force_flush().expect("flush the spans");
    let spans = telemetry().exporter.get_finished_spans().unwrap();
    assert!(spans.iter().any(|s| s.name == "GET /quick"));
    for s in spans.iter().filter(|s| s.name == "GET /quick") {
        assert!(
            s.events.iter().all(|e| e.name != "spanprof.long_poll"),
            "{s:?}"
        );
        assert_eq!(attr_i64(s, "spanprof.long_polls"), 0);
    }
    assert_eq!(warnings(), Vec::<String>::new());
}

/// The span's profile (CPU and wall-clock samples) as a pprof file, after the
/// collector has taken every sample so far.
fn span_pprof(span: &SpanData, file: &str) -> (spanprof::Profile, std::path::PathBuf) {
    let profiler = spanprof::Profiler::current().expect("the layer started a profiler");
    profiler.flush();
    let id = u64::from_be_bytes(span.span_context.span_id().to_bytes());
    let profile = profiler
        .store()
        .span(id)
        .unwrap_or_else(|| spanprof::Profile::empty(10_000_000));
    let path = support::artifact_dir().join(file);
    std::fs::write(&path, spanprof::pprof::encode_gzip(&profile)).unwrap();
    (profile, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_spans_time_blocked_in_a_poll_has_its_stack_in_the_wall_profile() {
    let base = serve().await;
    let s = span_of(&base, "/lookup").await;
    let (profile, path) = span_pprof(&s, "offcpu-lookup.pb.gz");
    let wall_ns: u64 = profile.samples.iter().map(|x| x.wall_ns).sum();
    // Samples of 10 ms from a random phase through the time inside the polls (60 ms
    // of sleep, more when a loaded machine preempts the thread): that time, within
    // two and a half samples.
    let busy_ns = attr_i64(&s, "spanprof.busy_ns") as u64;
    assert!(
        wall_ns >= 40_000_000 && wall_ns.abs_diff(busy_ns) <= 25_000_000,
        "wall time of GET /lookup: {wall_ns} ns, inside its polls {busy_ns} ns; {profile:?}"
    );
    // Read back by pprof itself: the wall samples' stacks hold the blocking call,
    // under which the thread slept in the kernel.
    let path = path.to_str().unwrap();
    let top = support::go_pprof(&["-sample_index=wall", "-top", "-cum", "-nodecount=200", path]);
    let row = top
        .lines()
        .find(|l| l.contains("offcpu::blocking_lookup"))
        .unwrap_or_else(|| panic!("no blocking_lookup in the wall profile:\n{top}"));
    let cum_ns = support::total_ns(&format!(
        "Total samples = {}",
        row.split_whitespace().nth(3).unwrap()
    ));
    // The rest of the poll (a few ms on a loaded machine that preempts the thread
    // after its sleep, dropping the request there) takes a 10 ms sample now and then:
    // all but one sample are the blocking call's.
    assert!(
        cum_ns + 10_000_000 >= wall_ns,
        "blocking_lookup holds {cum_ns} of {wall_ns} ns:\n{top}"
    );
    let flat = support::top_function(&support::go_pprof(&["-sample_index=wall", "-top", path]));
    assert!(
        flat.contains("sleep"),
        "the wall profile's top frame is {flat}, not the sleep:\n{top}"
    );
    // The CPU profile of the same span has (next to) nothing there: it was off CPU.
    let cpu_ns: u64 = profile.samples.iter().map(|x| x.cpu_ns).sum();
    assert!(cpu_ns <= 20_000_000, "cpu of GET /lookup: {cpu_ns} ns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_work_gets_no_wall_clock_samples() {
    let base = serve().await;
    let s = span_of(&base, "/cold_lookup").await;
    let (profile, _) = span_pprof(&s, "offcpu-cold-lookup.pb.gz");
    assert!(
        profile.samples.iter().all(|x| x.wall_ns == 0),
        "{profile:?}"
    );
}
