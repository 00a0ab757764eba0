//! A mistyped query is refused with 400 at once, naming the parameter, instead of
//! being ignored: `/debug/spanprof/profile?SECONDS=2` would otherwise be a silent
//! 30 s capture holding one of the process's capture slots.

mod support;

use std::time::{Duration, Instant};

use support::{Answer, assert_status, get, serve, viewer, within};

/// Longest a refusal may take: far below the 30 s default capture.
const QUICK: Duration = Duration::from_secs(5);

async fn ask(addr: std::net::SocketAddr, target: &str) -> (Answer, Duration) {
    let start = Instant::now();
    let answer = within(QUICK, target, get(addr, target, &addr.to_string(), &[])).await;
    (answer, start.elapsed())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mistyped_profile_query_is_refused_at_once_and_takes_no_slot() {
    let addr = serve(viewer()).await;
    for (query, names) in [
        ("SECONDS=2", "\"SECONDS\""),
        ("secs=5", "\"secs\""),
        ("%zz=1", "%zz"),
        ("type=alloc", "alloc"),
        ("seconds=2&seconds=3", "\"seconds\""),
        ("seconds=two", "\"seconds\""),
        ("span_id=00000000deadbeef&seconds=5", "span_id and seconds"),
    ] {
        let target = format!("/debug/spanprof/profile?{query}");
        let (answer, took) = ask(addr, &target).await;
        assert_status(&answer, 400, &target);
        assert!(answer.body.contains(names), "{target}: {:?}", answer.body);
        eprintln!("{target}: 400 in {took:?}: {}", answer.body.trim_end());
    }
    let (answer, _) = ask(addr, "/debug/spanprof/profile?SECONDS=2").await;
    for known in ["seconds", "span_id", "trace_id", "type"] {
        assert!(
            answer.body.contains(known),
            "{:?} lacks {known}",
            answer.body
        );
    }
    let (answer, _) = ask(addr, "/debug/spanprof/profile?type=alloc").await;
    assert!(answer.body.contains("cpu"), "{:?}", answer.body);
    assert_eq!(spanprof_viewer::debug_endpoint_stats().windows_open, 0);

    // No slot was taken: both of the process's capture windows still open, and
    // `type=cpu` is the profile the endpoint serves.
    let windows: Vec<_> = ["seconds=1", "seconds=1&type=cpu"]
        .into_iter()
        .take(spanprof_viewer::MAX_CONCURRENT_WINDOWS)
        .map(|q| {
            tokio::spawn(async move {
                let target = format!("/debug/spanprof/profile?{q}");
                (ask(addr, &target).await.0, target)
            })
        })
        .collect();
    for w in windows {
        let (answer, target) = w.await.unwrap();
        assert_status(&answer, 200, &target);
    }
    assert_eq!(spanprof_viewer::debug_endpoint_stats().windows_refused, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_or_malformed_api_queries_are_refused() {
    let addr = serve(viewer()).await;
    for (target, names) in [
        ("/debug/spanprof/api/traces?limt=5", "\"limt\""),
        ("/debug/spanprof/api/traces?limit=5&rout=x", "\"rout\""),
        ("/debug/spanprof/api/traces?limit=lots", "\"limit\""),
        ("/debug/spanprof/api/traces?route=%zz", "route"),
        ("/debug/spanprof/api/traces?route=%ff", "route"),
        (
            "/debug/spanprof/api/traces/0000000000000000000000000000abcd?limit=1",
            "\"limit\"",
        ),
        (
            "/debug/spanprof/api/spans/00000000deadbeef/top?by=cpu",
            "total",
        ),
        (
            "/debug/spanprof/api/spans/00000000deadbeef/top?count=5",
            "\"count\"",
        ),
        (
            "/debug/spanprof/flamegraph/00000000deadbeef?width=9",
            "\"width\"",
        ),
        ("/debug/spanprof/diff/00000000deadbeef?mins=5", "\"mins\""),
        ("/debug/spanprof/api/spans?name=apply&trace=x", "\"trace\""),
        (
            "/debug/spanprof/api/spans?name=apply&trace_id=abc",
            "\"trace_id\"",
        ),
        ("/debug/spanprof/api/spans?limit=3", "\"name\""),
        ("/debug/spanprof/api/memory?verbose=1", "\"verbose\""),
        (
            "/debug/spanprof/diff/00000000deadbeef?minutes=-1",
            "\"minutes\"",
        ),
        ("/debug/spanprof/api/routes/latency", "\"route\""),
        (
            "/debug/spanprof/api/routes/latency?route=%2Fx&window=5",
            "\"window\"",
        ),
        (
            "/debug/spanprof/routes/flamegraph?route=%2Fx&minutes=soon",
            "\"minutes\"",
        ),
    ] {
        let (answer, _) = ask(addr, target).await;
        assert_status(&answer, 400, target);
        assert!(answer.body.contains(names), "{target}: {:?}", answer.body);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn known_queries_are_answered() {
    let addr = serve(viewer()).await;
    for (target, status) in [
        ("/debug/spanprof/api/traces", 200),
        ("/debug/spanprof/api/traces?", 200),
        ("/debug/spanprof/api/traces?limit=200&route=", 200),
        (
            "/debug/spanprof/api/traces?route=POST+%2Fcheckout&limit=5",
            200,
        ),
        ("/debug/spanprof/api/traces?%72oute=x", 200),
        ("/debug/spanprof/api/spans/00000000deadbeef/top?n=15", 404),
        (
            "/debug/spanprof/api/spans/00000000deadbeef/top?n=5&by=total",
            404,
        ),
        ("/debug/spanprof/diff/00000000deadbeef?minutes=5", 404),
        ("/debug/spanprof/profile?span_id=00000000deadbeef", 404),
        (
            "/debug/spanprof/profile?span_id=00000000deadbeef&type=cpu",
            404,
        ),
        ("/debug/spanprof/api/routes/latency?route=%2Fnone", 200),
        (
            "/debug/spanprof/routes/flamegraph?route=%2Fnone&minutes=5",
            404,
        ),
        ("/debug/spanprof/route?route=%2Fnone", 200),
    ] {
        let (answer, _) = ask(addr, target).await;
        assert_status(&answer, status, target);
    }
}
