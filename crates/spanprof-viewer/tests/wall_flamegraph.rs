//! A hot span's blocked time has a flamegraph: the viewer draws the wall-clock
//! samples of its polls (`?value=wall`), where the thread slept, next to its CPU
//! flamegraph, and refuses a value it does not know.

mod support;

use std::time::Duration;

use spanprof_core::{Hotness, PollTimer, SpanLabels};
use support::{assert_status, get, profiler, serve, viewer};

/// A synchronous call inside a poll: blocked, no CPU.
#[inline(never)]
fn blocking_lookup() {
    std::thread::sleep(Duration::from_millis(80));
}

/// A hot span `id` whose one poll blocks in [`blocking_lookup`], on a thread of its
/// own, with the long-poll threshold given.
fn blocked_span(id: u64, long_poll: Option<Duration>) {
    let labels = SpanLabels::builder()
        .trace_id(u128::from(id))
        .span_id(id)
        .span_name("lookup")
        .hot(Hotness::Sampled)
        .build();
    std::thread::spawn(move || {
        let mut timer = PollTimer::new(None).long_poll(long_poll);
        timer.poll(&labels, blocking_lookup);
    })
    .join()
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hot_spans_wall_clock_flamegraph_shows_where_it_blocked() {
    let profiler = profiler();
    let addr = serve(viewer()).await;
    blocked_span(0x51, None);
    profiler.flush();
    let host = addr.to_string();

    let wall = get(
        addr,
        "/debug/spanprof/flamegraph/0000000000000051?value=wall",
        &host,
        &[],
    )
    .await;
    assert_status(&wall, 200, "the wall-clock flamegraph");
    assert_eq!(wall.header("content-type"), Some("image/svg+xml"));
    assert!(wall.body.contains("blocking_lookup"), "{}", wall.body);
    assert!(wall.body.contains("wall-clock"), "{}", wall.body);

    let bad = get(
        addr,
        "/debug/spanprof/flamegraph/0000000000000051?value=off",
        &host,
        &[],
    )
    .await;
    assert_status(&bad, 400, "an unknown value");
    assert!(bad.body.contains("value"), "{}", bad.body);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_span_with_a_long_poll_shows_its_stack_and_both_flamegraphs() {
    let profiler = profiler();
    let addr = serve(viewer()).await;
    blocked_span(0x52, Some(Duration::from_millis(10)));
    profiler.flush();
    let host = addr.to_string();

    // The span's figures for the page: its off-CPU time (so both flamegraphs are
    // drawn) and the stack its long poll was sampled in, leaf first.
    let top = get(
        addr,
        "/debug/spanprof/api/spans/0000000000000052/top",
        &host,
        &[],
    )
    .await;
    assert_status(&top, 200, "the span's top functions");
    let json: serde_json::Value = serde_json::from_str(&top.body).unwrap();
    assert!(
        json["wall_ns"].as_u64().unwrap_or(0) >= 40_000_000,
        "{json}"
    );
    let stack: Vec<&str> = json["long_poll_stack"]
        .as_array()
        .unwrap_or_else(|| panic!("no long_poll_stack in {json}"))
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    let lookup = stack
        .iter()
        .position(|f| f.contains("blocking_lookup"))
        .unwrap_or_else(|| panic!("no frame of the lookup in {stack:#?}"));
    assert!(
        stack[..lookup].iter().any(|f| f.contains("sleep")),
        "{stack:#?}"
    );

    // The page draws the CPU and the off-CPU flamegraph side by side.
    let page = get(addr, "/debug/spanprof/", &host, &[]).await;
    assert_status(&page, 200, "the page");
    assert!(
        page.body.contains("id=\"flame-wall\""),
        "no second flamegraph frame"
    );
}
