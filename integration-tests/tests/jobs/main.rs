//! Work outside requests: a job consumer beside an axum server, profiled by
//! `SpanProfileLayer::profile_roots`; the warning when CPU-heavy work runs under a span
//! nothing profiles; and `#[spanprof::main]`'s runtime.

#[path = "../support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
use spanprof::{Profiler, RoutePolicy, SpanProfileLayer, SpanProfileProcessor};
use tracing::Instrument;
use tracing_subscriber::prelude::*;

/// Burns about `ms` of this thread's CPU: the job's own work.
#[inline(never)]
fn crunch_job(ms: u64) -> u64 {
    let start = spanprof::stats::thread_cpu_time();
    let mut x = 0u64;
    while spanprof::stats::thread_cpu_time() - start < Duration::from_millis(ms) {
        x = std::hint::black_box(spanprof_workloads::BURNERS[0].1(20_000).wrapping_add(x));
    }
    x
}

/// The work of a task a job spawns.
#[inline(never)]
fn crunch_subtask(ms: u64) -> u64 {
    let start = spanprof::stats::thread_cpu_time();
    let mut x = 0u64;
    while spanprof::stats::thread_cpu_time() - start < Duration::from_millis(ms) {
        x = std::hint::black_box(spanprof_workloads::BURNERS[1].1(20_000).wrapping_add(x));
    }
    x
}

/// Serves an axum app with the documented layers while a consumer takes `jobs` jobs
/// from a channel, each in a `job` span, each spawning a subtask. On a runtime from
/// `#[spanprof::main]`.
#[spanprof::main(worker_threads = 2)]
async fn serve_and_consume(jobs: u64) -> u64 {
    use axum::{Router, routing::get};
    let app = Router::new()
        .route("/hash", get(|| async { "hashed" }))
        .layer(
            tower::ServiceBuilder::new()
                .layer(
                    tower_http::trace::TraceLayer::new_for_http().make_span_with(
                        tower_http::trace::DefaultMakeSpan::new().level(tracing::Level::INFO),
                    ),
                )
                .layer(spanprof::ProfileCorrelationLayer::new()),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(8);
    let consumer = tokio::spawn(async move {
        let mut done = 0;
        while let Some(job) = rx.recv().await {
            let span = tracing::info_span!("job", job);
            async {
                crunch_job(150);
                tokio::task::yield_now().await;
                tokio::spawn(async { crunch_subtask(60) }).await.unwrap();
            }
            .instrument(span)
            .await;
            done += 1;
        }
        done
    });
    for job in 0..jobs {
        tx.send(job).await.unwrap();
        let (status, _) = support::web::http_get(&format!("http://{addr}/hash"), &[]).await;
        assert_eq!(status, 200);
    }
    drop(tx);
    let done = consumer.await.unwrap();
    server.abort();
    done
}

#[test]
fn a_job_consumer_beside_an_axum_server_profiles_each_job() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(SpanProfileProcessor::new(SimpleSpanProcessor::new(
            exporter.clone(),
        )))
        .build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("jobs")))
        .with(SpanProfileLayer::new().profile_roots("job", RoutePolicy::new().sample_rate(1.0)))
        .init();
    let profiler = Profiler::builder().high_hz(1000).start().expect("profiler");
    assert_eq!(serve_and_consume(6), 6);
    profiler.flush();
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let jobs: Vec<_> = spans.iter().filter(|s| s.name == "job").collect();
    assert_eq!(jobs.len(), 6, "every job span exported");
    let store = profiler.store();
    let (mut job_samples, mut labelled) = (0u64, 0u64);
    for span in &jobs {
        let id = support::web::span_id(span);
        assert_eq!(
            support::web::attr(span, spanprof::tower::ATTR_PROFILE_ID),
            Some(format!("{id:016x}").into()),
            "a job span links its profile"
        );
        let attr_samples = support::web::attr_i64(span, spanprof::tower::ATTR_CPU_SAMPLES);
        let profile = store.span_tree(id).expect("the job's samples");
        let in_store: u64 = profile.samples.iter().map(|s| s.count).sum();
        assert_eq!(
            attr_samples as u64, in_store,
            "spanprof.cpu_samples is exact"
        );
        // The subtask the job spawned carries the job's labels (tokio's task hooks).
        let subtask: u64 = profile
            .samples
            .iter()
            .filter(|s| {
                s.stack
                    .iter()
                    .any(|f| f.function.contains("crunch_subtask"))
            })
            .map(|s| s.count)
            .sum();
        if cfg!(tokio_unstable) {
            assert!(subtask > 0, "the job's subtask inherited its labels");
        }
    }
    // Of every sample in the jobs' own code, the share labelled with a job span.
    let job_ids: Vec<u64> = jobs.iter().map(|s| support::web::span_id(s)).collect();
    let all = store.process(Duration::from_secs(3600));
    for s in &all.samples {
        if s.stack.iter().any(|f| f.function.contains("crunch_job")) {
            job_samples += s.count;
            if s.labels
                .as_ref()
                .is_some_and(|l| job_ids.contains(&l.root_span_id))
            {
                labelled += s.count;
            }
        }
    }
    profiler.stop();
    assert!(
        job_samples >= 300,
        "only {job_samples} samples in crunch_job"
    );
    assert!(
        labelled * 100 >= job_samples * 99,
        "{labelled} of {job_samples} samples in the jobs' code carry a job's labels"
    );
}

/// Whether a task spawned inside labelled work sees its parent's labels, and how many
/// workers the runtime has.
async fn inheritance() -> (bool, usize) {
    use spanprof::WithSpanLabels;
    let labels = spanprof::SpanLabels::builder()
        .span_id(42)
        .span_name("parent")
        .build();
    let seen = async {
        tokio::spawn(async { spanprof::current_labels().map(|l| l.span_id()) })
            .await
            .unwrap()
    }
    .with_span_labels(labels)
    .await;
    (
        seen == Some(42),
        tokio::runtime::Handle::current().metrics().num_workers(),
    )
}

#[spanprof::main(worker_threads = 3)]
async fn with_the_macro() -> (bool, usize) {
    inheritance().await
}

fn by_hand() -> (bool, usize) {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.worker_threads(3);
    spanprof::install_runtime_hooks(&mut b);
    b.enable_all().build().unwrap().block_on(inheritance())
}

#[test]
fn the_macros_runtime_is_the_hand_built_one() {
    // With tokio_unstable a spawned task inherits its parent's labels through the
    // hooks; the worker count asked for is kept.
    assert_eq!(with_the_macro(), (cfg!(tokio_unstable), 3));
    assert_eq!(with_the_macro(), by_hand());
}

#[spanprof::main(flavor = "current_thread")]
async fn nightly_reports(logs: Arc<Mutex<Vec<String>>>) -> usize {
    // Each report in a span of its own, outside any request; nothing profiles it.
    for _ in 0..50 {
        let span = tracing::info_span!("nightly_report");
        async {
            crunch_job(100);
        }
        .instrument(span)
        .await;
        if logs
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("nightly_report"))
        {
            break;
        }
    }
    // A few more after the warning: it is given once.
    for _ in 0..3 {
        async {
            crunch_job(100);
        }
        .instrument(tracing::info_span!("nightly_report"))
        .await;
    }
    logs.lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("no profile covers them"))
        .count()
}

#[test]
fn cpu_heavy_work_under_a_span_nothing_profiles_is_reported_once() {
    let logs: Arc<Mutex<Vec<String>>> = Arc::default();
    let provider = SdkTracerProvider::builder().build();
    tracing_subscriber::registry()
        .with(support::LogCapture(logs.clone()))
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("jobs")))
        .with(SpanProfileLayer::new())
        .init();
    let profiler = Profiler::builder()
        .baseline_hz(500)
        .start()
        .expect("profiler");
    let warnings = nightly_reports(logs.clone());
    profiler.stop();
    let logs = logs.lock().unwrap();
    let warning = logs
        .iter()
        .find(|l| l.contains("no profile covers them"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(warnings, 1, "{logs:#?}");
    assert!(warning.starts_with("WARN"), "{warning}");
    assert!(warning.contains("`nightly_report`"), "{warning}");
    assert!(
        warning.contains("profile_roots(\"nightly_report\""),
        "{warning}"
    );
}
