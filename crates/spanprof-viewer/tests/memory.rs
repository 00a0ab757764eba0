//! The viewer serves what the profiler and its own span store hold, with their
//! bounds, so that an operator can tell a store filling up to its bound from a
//! leak; the span store stays within its bound however many traces arrive.

mod support;

use std::time::Duration;

use opentelemetry::trace::{Span as _, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::Value;
use spanprof_viewer::{MAX_SPANS_PER_TRACE, RecentSpans, Viewer};
use support::{assert_status, get, profiler, serve};

async fn memory(addr: std::net::SocketAddr) -> Value {
    let answer = get(addr, "/debug/spanprof/api/memory", &addr.to_string(), &[]).await;
    assert_status(&answer, 200, "api/memory");
    serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{e}: {}", answer.body))
}

fn num(v: &Value, path: &str) -> u64 {
    path.split('.')
        .fold(v, |v, key| &v[key])
        .as_u64()
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_viewer_serves_memory_with_its_bounds() {
    let profiler = profiler();
    let spans = RecentSpans::new(100_000).with_max_spans(2 * MAX_SPANS_PER_TRACE);
    let provider = SdkTracerProvider::builder()
        .with_span_processor(spans.processor(None))
        .build();
    let tracer = provider.tracer("test");
    let addr = serve(Viewer::new(profiler.clone(), spans.clone())).await;

    // Some CPU in a span, so that the store and the caches hold something.
    let busy = spanprof_core::SpanLabels::builder()
        .trace_id(7)
        .span_id(7)
        .span_name("busy")
        .build();
    let _g = busy.enter();
    let start = std::time::Instant::now();
    let mut x = 0u64;
    while start.elapsed() < Duration::from_millis(300) {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
    }
    drop(_g);
    profiler.flush();

    // Far more spans than the bound, in traces of 10.
    for _ in 0..500 {
        let root = tracer.start("request");
        let cx = opentelemetry::Context::current_with_span(root);
        for _ in 0..9 {
            tracer.start_with_context("step", &cx).end();
        }
        cx.span().end();
    }

    let m = memory(addr).await;
    eprintln!("{m:#}");
    let p = profiler.memory_stats();
    assert!(num(&m, "profiler.total_bytes") > 0, "{m}");
    assert_eq!(num(&m, "profiler.bound_bytes"), p.bound_bytes() as u64);
    assert!(num(&m, "profiler.total_bytes") <= num(&m, "profiler.bound_bytes"));
    assert_eq!(
        num(&m, "profiler.store.max_bytes"),
        p.store_max_bytes as u64
    );
    assert!(num(&m, "profiler.store.bytes") > 0, "{m}");
    assert!(num(&m, "profiler.stack_cache.max_bytes") > 0, "{m}");
    assert!(num(&m, "profiler.names.max_names") > 0, "{m}");

    assert_eq!(
        num(&m, "recent_spans.max_spans"),
        2 * MAX_SPANS_PER_TRACE as u64
    );
    let held = num(&m, "recent_spans.spans");
    assert!(
        held <= 2 * MAX_SPANS_PER_TRACE as u64 && held >= MAX_SPANS_PER_TRACE as u64,
        "{m}"
    );
    assert_eq!(
        num(&m, "recent_spans.traces_evicted") + num(&m, "recent_spans.traces"),
        500,
        "{m}"
    );
    assert!(num(&m, "recent_spans.bytes") >= held * 100, "{m}");

    assert!(num(&m, "process.rss_bytes") > 1 << 20, "{m}");
    assert!(num(&m, "process.rss_anon_bytes") > 0, "{m}");
}
