//! The viewer's heavy answers (flamegraphs, diffs, profiles) are computed off the
//! runtime that serves them, and concurrent `/debug/spanprof/profile?seconds=`
//! windows are capped.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use spanprof_core::{Hotness, Profiler, SpanLabels};
use spanprof_viewer::{RecentSpans, Viewer};

async fn fetch(url: &str) -> (http::StatusCode, String) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    let resp = client.get(url.parse().unwrap()).await.expect("GET");
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Two functions calling each other by the bits of `path`: 2^depth distinct stacks.
#[inline(never)]
fn left(depth: u32, path: u64) -> u64 {
    branch(depth, path)
}

#[inline(never)]
fn right(depth: u32, path: u64) -> u64 {
    branch(depth, path)
}

#[inline(always)]
fn branch(depth: u32, path: u64) -> u64 {
    if depth == 0 {
        return burn(path);
    }
    let r = if path & 1 == 0 {
        left(depth - 1, path >> 1)
    } else {
        right(depth - 1, path >> 1)
    };
    black_box(r)
}

#[inline(never)]
fn burn(seed: u64) -> u64 {
    let mut h = seed;
    for _ in 0..20_000 {
        h = black_box(h.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
    h
}

/// Fills the store with one hot span of `GET /heavy` with thousands of distinct
/// stacks; returns its span id.
fn heavy_span(profiler: &Profiler) -> u64 {
    let span_id = 0x00c0_ffee_0000_0001;
    let labels = SpanLabels::builder()
        .trace_id(0x1234)
        .span_id(span_id)
        .span_name("GET /heavy")
        .route("GET /heavy")
        .hot(Hotness::Sampled)
        .build();
    std::thread::spawn(move || {
        let _reg = spanprof_core::register_current_thread();
        let _g = labels.enter();
        let end = Instant::now() + Duration::from_secs(3);
        let mut path = 0u64;
        while Instant::now() < end {
            path = path.wrapping_add(0x9e37_79b9_7f4a_7c15);
            black_box(left(14, path));
        }
    })
    .join()
    .unwrap();
    profiler.flush();
    let stacks = profiler
        .store()
        .span(span_id)
        .map_or(0, |p| p.samples.len());
    assert!(stacks > 500, "{stacks} distinct stacks");
    span_id
}

/// Serves the viewer and `GET /ping` on a current-thread runtime of its own thread.
fn serve_on_one_thread(profiler: &Profiler) -> SocketAddr {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Viewer::new(profiler.clone(), RecentSpans::new(10))
        .router()
        .route("/ping", get(|| async { "pong" }));
    std::thread::spawn(move || rt.block_on(async { axum::serve(listener, app).await.unwrap() }));
    addr
}

#[test]
fn a_heavy_diff_does_not_hold_up_the_runtime_serving_it() {
    let profiler = Profiler::builder().start().expect("profiler");
    let span = heavy_span(&profiler);
    let addr = serve_on_one_thread(&profiler);
    let client = tokio::runtime::Runtime::new().unwrap();
    client.block_on(async {
        let diff = tokio::spawn(async move {
            fetch(&format!(
                "http://{addr}/debug/spanprof/diff/{span:016x}?minutes=5"
            ))
            .await
        });
        // Pings one after another until the diff answers; those that complete
        // while it is still being computed are counted.
        let mut answered_during = 0;
        let mut pings = 0;
        while !diff.is_finished() {
            let (status, _) = fetch(&format!("http://{addr}/ping")).await;
            assert_eq!(status, 200);
            pings += 1;
            if !diff.is_finished() {
                answered_during += 1;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (status, svg) = diff.await.unwrap();
        eprintln!("{answered_during} of {pings} pings answered while the diff was computed");
        assert_eq!(status, 200, "{svg}");
        assert!(
            svg.contains("offload::left"),
            "the diff draws the span's code"
        );
        assert!(
            answered_during >= 3,
            "{answered_during} of {pings} pings answered while the diff was computed"
        );
    });
    profiler.stop();
}

#[test]
fn concurrent_profile_windows_are_capped() {
    let profiler = Profiler::builder().start().expect("profiler");
    let addr = serve_on_one_thread(&profiler);
    let base = format!("http://{addr}/debug/spanprof/profile");
    let client = tokio::runtime::Runtime::new().unwrap();
    client.block_on(async {
        let open: Vec<_> = (0..spanprof_viewer::MAX_CONCURRENT_WINDOWS)
            .map(|_| {
                let url = format!("{base}?seconds=3");
                tokio::spawn(async move { fetch(&url).await })
            })
            .collect();
        // They are open (each for 3 s); one more is refused, and says why.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let (status, body) = fetch(&format!("{base}?seconds=1")).await;
        assert_eq!(status, 429, "{} bytes", body.len());
        assert!(body.contains("windows are already open"), "{body}");
        assert_eq!(spanprof_viewer::debug_endpoint_stats().windows_refused, 1);
        for o in open {
            let (status, body) = o.await.unwrap();
            assert_eq!(status, 200, "{} bytes", body.len());
        }
        // Once they are closed, a new window is served.
        let (status, body) = fetch(&format!("{base}?seconds=1")).await;
        assert_eq!(status, 200, "{} bytes", body.len());
        assert_eq!(spanprof_viewer::debug_endpoint_stats().windows_open, 0);
    });
    profiler.stop();
}
