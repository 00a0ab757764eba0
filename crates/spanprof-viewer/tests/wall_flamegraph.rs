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

#[tokio::test(flavor = "multi_thread")]
async fn a_hot_spans_wall_clock_flamegraph_shows_where_it_blocked() {
    let profiler = profiler();
    let addr = serve(viewer()).await;
    let labels = SpanLabels::builder()
        .trace_id(0x51)
        .span_id(0x51)
        .span_name("lookup")
        .hot(Hotness::Sampled)
        .build();
    std::thread::spawn(move || {
        let mut timer = PollTimer::new(None);
        timer.poll(&labels, blocking_lookup);
    })
    .join()
    .unwrap();
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
