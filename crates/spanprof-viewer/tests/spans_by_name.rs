//! The viewer ranks spans by name, not only whole traces: "the slowest `apply`
//! spans" of a long connection trace (one `run` span holding thousands of
//! commands, as a Redis-like server has) are found even when the trace has more
//! spans than the viewer keeps, and the trace is still listed under its real root.

mod support;

use std::time::{Duration, SystemTime};

use opentelemetry::trace::{Span as _, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::Value;
use spanprof_viewer::{MAX_SPANS_PER_TRACE, RecentSpans, Viewer};
use support::{assert_status, get, profiler, serve};

/// Commands in the connection's trace: far more than the viewer keeps of one trace.
const COMMANDS: usize = 2_500;
/// The planted slow commands (index, duration); every other one takes 10–19 µs.
const SLOW: [(usize, Duration); 3] = [
    (100, Duration::from_millis(50)),
    (1_500, Duration::from_millis(80)),
    (2_400, Duration::from_millis(65)),
];

/// Records a connection trace (`run` with `COMMANDS` `apply` children, ended as a
/// server ends them: each command as it completes, the connection last) and a
/// second trace holding one 70 ms `apply`. Returns the connection's trace id.
fn record(spans: &RecentSpans) -> String {
    let provider = SdkTracerProvider::builder()
        .with_span_processor(spans.processor(None))
        .build();
    let tracer = provider.tracer("test");
    let t0 = SystemTime::now() - Duration::from_secs(10);
    let run = tracer
        .span_builder("run")
        .with_start_time(t0)
        .start(&tracer);
    let trace_id = run.span_context().trace_id().to_string();
    let cx = opentelemetry::Context::current_with_span(run);
    let mut at = t0;
    for i in 0..COMMANDS {
        let took = SLOW
            .iter()
            .find(|(n, _)| *n == i)
            .map_or(Duration::from_micros(10 + (i as u64 * 7) % 10), |(_, d)| *d);
        let mut apply = tracer
            .span_builder("apply")
            .with_start_time(at)
            .start_with_context(&tracer, &cx);
        apply.end_with_timestamp(at + took);
        at += took + Duration::from_micros(5);
    }
    cx.span().end_with_timestamp(t0 + Duration::from_secs(3));

    let other = tracer
        .span_builder("apply")
        .with_start_time(t0)
        .start(&tracer);
    let mut other = other;
    other.end_with_timestamp(t0 + Duration::from_millis(70));
    provider.force_flush().expect("flush");
    trace_id
}

async fn json(addr: std::net::SocketAddr, target: &str) -> Value {
    let answer = get(addr, target, &addr.to_string(), &[]).await;
    assert_status(&answer, 200, target);
    serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{target}: {e}: {}", answer.body))
}

fn durations_ms(rows: &Value) -> Vec<u64> {
    rows.as_array()
        .expect("an array")
        .iter()
        .map(|s| s["duration_ns"].as_u64().expect("duration_ns") / 1_000_000)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_viewer_lists_the_slowest_spans_of_a_name_inside_one_long_trace() {
    let spans = RecentSpans::new(10);
    let trace_id = record(&spans);
    let addr = serve(Viewer::new(profiler(), spans)).await;

    // Inside the connection's trace: its three slow commands, slowest first,
    // though they came among 2 500 and the last arrived after the 512th span.
    let target = format!("/debug/spanprof/api/spans?name=apply&trace_id={trace_id}&limit=3");
    let rows = json(addr, &target).await;
    assert_eq!(durations_ms(&rows), [80, 65, 50], "{rows}");
    for row in rows.as_array().unwrap() {
        assert_eq!(row["name"], "apply");
        assert_eq!(row["trace_id"], trace_id.as_str());
    }

    // Across traces: the other trace's 70 ms command takes its place.
    let rows = json(addr, "/debug/spanprof/api/spans?name=apply&limit=4").await;
    assert_eq!(durations_ms(&rows), [80, 70, 65, 50], "{rows}");

    // The trace is listed under its real root, with what was left out counted.
    let traces = json(addr, "/debug/spanprof/api/traces").await;
    let t = traces
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["trace_id"] == trace_id.as_str())
        .unwrap_or_else(|| panic!("trace {trace_id} not listed: {traces}"));
    assert_eq!(t["root"], "run", "{t}");
    assert_eq!(t["duration_ns"].as_u64(), Some(3_000_000_000), "{t}");
    assert_eq!(t["spans"].as_u64(), Some(MAX_SPANS_PER_TRACE as u64), "{t}");
    assert_eq!(
        t["spans_left_out"].as_u64(),
        Some((COMMANDS + 1 - MAX_SPANS_PER_TRACE) as u64),
        "{t}"
    );

    // A name nobody uses is an empty list, and the name is required.
    let rows = json(addr, "/debug/spanprof/api/spans?name=nobody").await;
    assert_eq!(rows.as_array().map(Vec::len), Some(0), "{rows}");
    let answer = get(addr, "/debug/spanprof/api/spans", &addr.to_string(), &[]).await;
    assert_status(&answer, 400, "api/spans without a name");
    assert!(answer.body.contains("name"), "{:?}", answer.body);
}
