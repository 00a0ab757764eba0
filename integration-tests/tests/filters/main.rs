//! A service whose own `tracing` filter hides what spanprof needs, as most services
//! run in production (`RUST_LOG` unset or `warn`): a global filter at ERROR disables
//! the spans `profile_roots` picks (they are never created, so nothing is labelled)
//! and spanprof's own warnings. spanprof then says so in exactly one line on stderr,
//! at start; set up as docs/layer.md says (the filter on the fmt layer alone), the
//! same service is labelled and says nothing.
//!
//! Each case runs in a child process of this test binary (a process has one global
//! subscriber), shaped like a mini-redis: a `#[tokio::main]`-less runtime with the
//! hooks, commands in `apply` spans picked by `profile_roots`.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
use spanprof::{RoutePolicy, SpanProfileLayer, SpanProfileProcessor};
use tracing::Instrument;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::prelude::*;

/// The child's case, when this binary runs as one.
const CASE: &str = "SPANPROF_FILTERS_CASE";

/// Runs the test `child` of this binary as a child process with `case`; returns its
/// stderr's spanprof lines and the number of samples it labelled `apply`.
fn run_child(case: &str) -> (Vec<String>, u64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads", "1"])
        .env(CASE, case)
        .env_remove("RUST_LOG")
        .output()
        .expect("run the child");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let labelled = stdout
        .lines()
        .find_map(|l| l.split("APPLY_SAMPLES ").nth(1))
        .unwrap_or_else(|| panic!("no count in:\n{stdout}\n{stderr}"))
        .trim()
        .parse()
        .unwrap();
    let lines = stderr
        .lines()
        .filter(|l| l.contains("spanprof"))
        .map(str::to_owned)
        .collect();
    (lines, labelled)
}

#[test]
fn an_error_only_filter_gets_one_line_on_stderr_and_the_documented_one_a_profile() {
    let (hidden, labelled) = run_child("global-error");
    assert_eq!(hidden.len(), 1, "one line, at start: {hidden:#?}");
    let line = &hidden[0];
    for needle in ["filter", "apply", "with_filter", "docs/layer.md"] {
        assert!(line.contains(needle), "{needle:?} not in {line}");
    }
    assert_eq!(labelled, 0, "the apply spans are never created");

    // The same with a span directive beside it, which makes the filter's answer for
    // every callsite below ERROR "sometimes", spanprof's warnings among them; and
    // again with the profiler started after the subscriber, whose start checks the
    // filter on this thread, which leaves "sometimes" to the collector thread.
    for case in [
        "global-error-with-span-directive",
        "span-directive-profiler-after-subscriber",
    ] {
        let (hidden, labelled) = run_child(case);
        assert_eq!(hidden.len(), 1, "{case}: one line: {hidden:#?}");
        assert!(
            hidden[0].contains("hides spanprof's warnings"),
            "{case}: {}",
            hidden[0]
        );
        assert_eq!(labelled, 0, "{case}: the apply spans are never created");
    }

    // A span directive that enables the roots inside the spans that hold them: a
    // correct set-up, whatever a check outside those spans would be told.
    let (said, labelled) = run_child("span-directive-roots-inside");
    // Warnings are shown here: only the filter's own are wrong (a build without
    // `tokio_unstable` is rightly told so).
    let about_the_filter: Vec<_> = said
        .iter()
        .filter(|l| l.contains("tracing filter") || l.contains("profile_roots"))
        .collect();
    assert!(
        about_the_filter.is_empty(),
        "roots enabled inside `run`: {about_the_filter:#?}"
    );
    assert!(labelled > 0, "apply spans profiled inside `run`");

    let (said, labelled) = run_child("per-layer");
    assert!(said.is_empty(), "the documented set-up: {said:#?}");
    assert!(
        labelled > 0,
        "apply spans profiled once the filter is the fmt layer's"
    );
}

/// spanprof's set-up checks ask the subscriber what it would show (its warnings, the
/// spans `profile_roots` picks), on the thread that builds the layer. With per-layer
/// filters, asking through `Dispatch::enabled` leaves tracing-subscriber's
/// per-thread filter state set, and the thread's next span that every filter
/// enables skips each layer whose filter disabled what was asked about: a
/// request's server span, or a step of it, is lost, and its children start traces
/// of their own.
#[test]
fn building_the_layer_loses_no_span_of_a_per_layer_filtered_tracer() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads", "1"])
        .env(CASE, "filtered-tracer")
        .env_remove("RUST_LOG")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let seen = |what: &str| {
        stdout
            .lines()
            .find_map(|l| l.split(what).nth(1))
            .unwrap_or_else(|| panic!("no {what} list in:\n{stdout}\n{stderr}"))
            .trim()
            .to_owned()
    };
    assert_eq!(
        seen("EXPORTED "),
        "job,first,second",
        "the spans the OpenTelemetry layer's filter keeps, in the order they ended"
    );
    assert_eq!(
        seen("OPENED "),
        "first,second",
        "the spans the other layer's filter keeps"
    );
}

/// Burns about `ms` ms of CPU.
fn burn(ms: u64) -> u64 {
    let start = spanprof::stats::thread_cpu_time();
    let mut x = 1u64;
    while spanprof::stats::thread_cpu_time() - start < Duration::from_millis(ms) {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

#[test]
fn child() {
    let Ok(case) = std::env::var(CASE) else {
        return; // Only as a child of the test above.
    };
    if case == "filtered-tracer" {
        return filtered_tracer();
    }
    let start = || spanprof::Profiler::builder().start().expect("profiler");
    let early = (case != "span-directive-profiler-after-subscriber").then(start);
    let (_, provider) = traced();
    let tracer = provider.tracer("filters");
    let roots = || SpanProfileLayer::new().profile_roots("apply", RoutePolicy::new());
    match case.as_str() {
        // As a service does with `EnvFilter::from_default_env()` and RUST_LOG unset
        // (or set to error and a span directive).
        "global-error"
        | "global-error-with-span-directive"
        | "span-directive-profiler-after-subscriber"
        | "span-directive-roots-inside" => tracing_subscriber::registry()
            .with(EnvFilter::new(match case.as_str() {
                "global-error" => "error",
                "span-directive-roots-inside" => "warn,[run]=info",
                _ => "error,[handle]=debug",
            }))
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .with(tracing_opentelemetry::layer().with_tracer(tracer))
            .with(roots())
            .init(),
        // docs/layer.md: the filter on the fmt layer alone.
        "per-layer" => tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(EnvFilter::new("error")),
            )
            .with(tracing_opentelemetry::layer().with_tracer(tracer))
            .with(roots())
            .init(),
        other => panic!("unknown case {other}"),
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder.worker_threads(2).enable_all().build().unwrap();
    let profiler = early.unwrap_or_else(start);
    // The commands, inside a `run` span where the case's filter enables them there.
    let run = if case == "span-directive-roots-inside" {
        tracing::info_span!("run")
    } else {
        tracing::Span::none()
    };
    rt.block_on(
        async {
            let deadline = Instant::now() + Duration::from_millis(1500);
            let mut acc = 0u64;
            while Instant::now() < deadline {
                acc ^= async { burn(5) }
                    .instrument(tracing::info_span!("apply"))
                    .await;
                tokio::task::yield_now().await;
            }
            std::hint::black_box(acc);
        }
        .instrument(run),
    );
    drop(rt);
    profiler.flush();
    let apply = profiler
        .store()
        .process(Duration::from_secs(60))
        .samples
        .iter()
        .filter(|s| s.labels.as_ref().is_some_and(|l| &*l.span_name == "apply"))
        .map(|s| s.count)
        .sum::<u64>();
    profiler.stop();
    println!("APPLY_SAMPLES {apply}");
}

/// The child of `building_the_layer_loses_no_span_of_a_per_layer_filtered_tracer`:
/// prints the names of the spans each filtered layer saw.
fn filtered_tracer() {
    let (exporter, provider) = traced();
    let tracer = provider.tracer("filters");
    let opened = Opened::default();
    tracing_subscriber::registry()
        .with(opened.clone().with_filter(EnvFilter::new("app=info")))
        .with(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .and_then(SpanProfileLayer::new().profile_roots("job", RoutePolicy::new()))
                .with_filter(EnvFilter::new("app=info,jobs=info")),
        )
        .init();
    let profiler = spanprof::Profiler::builder().start().expect("profiler");
    // A root callsite registers (a background job's span, traced but not kept by
    // the other layer), to be checked against the filters with the layer's checks.
    drop(tracing::info_span!(target: "jobs", "job"));
    // Built where a service builds it: on the thread that then serves. No thread is
    // registered with the profiler, so its collector takes no sample and runs no
    // check of its own: the build checks `job`, on this thread.
    let _layer = spanprof::ProfileCorrelationLayer::builder()
        .build()
        .expect("layer");
    drop(tracing::info_span!(target: "app", "first"));
    drop(tracing::info_span!(target: "app", "second"));
    provider.force_flush().expect("flush");
    let exported: Vec<String> = exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .map(|s| s.name.into_owned())
        .collect();
    profiler.stop();
    println!("EXPORTED {}", exported.join(","));
    println!("OPENED {}", opened.0.lock().unwrap().join(","));
}

/// A tracer provider whose spans end in memory, through spanprof's processor.
fn traced() -> (InMemorySpanExporter, SdkTracerProvider) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(SpanProfileProcessor::new(SimpleSpanProcessor::new(
            exporter.clone(),
        )))
        .build();
    (exporter, provider)
}

/// A layer that notes the name of each span it is told of.
#[derive(Clone, Default)]
struct Opened(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Opened {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        self.0
            .lock()
            .unwrap()
            .push(attrs.metadata().name().to_owned());
    }
}
