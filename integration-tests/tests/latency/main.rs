//! Slow requests against fast ones: one request in twenty to a route takes a slow
//! path. Each sample carries its request's latency class (`span_latency`), so the
//! slow path's samples are in the slow classes; `go tool pprof -tagfocus` on the
//! profile endpoint's answer agrees; the viewer's route page ranks the slow path
//! first. A route with too few requests gets no class, and the page says why. A real
//! axum server and the viewer over loopback, a real client.

#[path = "../support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use spanprof::pprof::proto;
use spanprof_tower::{ProfileCorrelationLayer, RoutePolicy};
use spanprof_viewer::{Exposure, RecentSpans, Viewer};
use support::go_pprof;
use support::web::client;

/// Burns `ms` of this thread's CPU time.
fn burn(ms: u64) {
    let start = spanprof::stats::thread_cpu_time();
    while spanprof::stats::thread_cpu_time() - start < Duration::from_millis(ms) {
        std::hint::black_box(spanprof_workloads::BURNERS[0].1(2_000));
    }
}

/// What one request in twenty does besides the usual.
#[inline(never)]
fn slow_path() {
    burn(12);
    std::hint::black_box(());
}

/// What every request does.
#[inline(never)]
fn fast_path() {
    burn(1);
    std::hint::black_box(());
}

async fn work(headers: http::HeaderMap) -> &'static str {
    if headers.contains_key("x-slow") {
        slow_path();
    }
    fast_path();
    "done"
}

async fn rare() -> &'static str {
    burn(20);
    "rare"
}

/// The service (every request profiled at the high rate) and the viewer.
async fn serve() -> (String, SocketAddr) {
    let profiler = spanprof::Profiler::builder()
        .start()
        .expect("start the profiler");
    let layer = ProfileCorrelationLayer::builder()
        .profiler(profiler.clone())
        .default_policy(RoutePolicy::new().sample_rate(1.0))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/work", get(work))
        .route("/rare", get(rare))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let viewer = spanprof_viewer::serve(
        Viewer::new(profiler, RecentSpans::new(100)),
        "127.0.0.1:0".parse().unwrap(),
        Exposure::LoopbackOnly,
    )
    .await
    .expect("serve the viewer");
    (format!("http://{addr}"), viewer)
}

/// GET `url` with `headers`: status and body bytes.
async fn get_bytes(url: &str, headers: &[(&str, String)]) -> (http::StatusCode, Bytes) {
    let mut req = http::Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let resp = client()
        .request(req.body(Empty::new()).unwrap())
        .await
        .expect("request");
    let status = resp.status();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

/// `n` requests to `path` from two clients at once, each in a sampled trace of its
/// own; request `i` takes the slow path when `slow(i)`.
async fn load(base: &str, path: &str, n: u64, slow: fn(u64) -> bool) {
    let clients: Vec<_> = (0..2)
        .map(|c| {
            let url = format!("{base}{path}");
            tokio::spawn(async move {
                for i in (c..n).step_by(2) {
                    let mut headers = vec![(
                        "traceparent",
                        format!("00-{:032x}-{:016x}-01", 0x1a7e_0000 + i, 0xb0_0000 + i),
                    )];
                    if slow(i) {
                        headers.push(("x-slow", "1".to_owned()));
                    }
                    let (status, _) = get_bytes(&url, &headers).await;
                    assert_eq!(status, 200);
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
}

/// The profile endpoint's `seconds` capture (pprof bytes) taken while `work` runs.
async fn captured(
    viewer: SocketAddr,
    seconds: u64,
    work: impl std::future::Future<Output = ()>,
) -> Bytes {
    let capture = tokio::spawn(async move {
        get_bytes(
            &format!("http://{viewer}/debug/spanprof/profile?seconds={seconds}"),
            &[],
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    work.await;
    let (status, body) = capture.await.unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    body
}

/// The `span_latency` label of `sample`, if any.
fn latency_of<'a>(p: &'a proto::Profile, s: &proto::Sample) -> Option<&'a str> {
    s.label
        .iter()
        .find(|l| p.string_table[l.key as usize] == "span_latency")
        .map(|l| p.string_table[l.str as usize].as_str())
}

/// Whether `function` is on `sample`'s stack.
fn on_stack(p: &proto::Profile, s: &proto::Sample, function: &str) -> bool {
    s.location_id.iter().any(|id| {
        let loc = &p.location[*id as usize - 1];
        loc.line.iter().any(|l| {
            let f = &p.function[l.function_id as usize - 1];
            p.string_table[f.name as usize].ends_with(function)
        })
    })
}

/// The CPU nanoseconds of `sample`.
fn cpu_ns(p: &proto::Profile, s: &proto::Sample) -> i64 {
    let cpu = p
        .sample_type
        .iter()
        .position(|t| p.string_table[t.r#type as usize] == "cpu")
        .expect("a cpu sample type");
    s.value[cpu]
}

/// The cumulative time of the row whose function ends with `function` in a
/// `go tool pprof -top -cum` listing, in ns (0 when absent).
fn cum_ns(top: &str, function: &str) -> u64 {
    let Some(row) = top.lines().find(|l| l.trim_end().ends_with(function)) else {
        return 0;
    };
    support::duration_ns(row.split_whitespace().nth(3).expect("a cum column"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slow_requests_of_a_route_hold_its_slow_path() {
    let (base, viewer) = serve().await;
    let body = captured(viewer, 8, load(&base, "/work", 400, |i| i % 20 == 0)).await;

    // Each sample of a request carries its class; the slow path's are in the slow
    // classes.
    let p = spanprof::pprof::decode(&body).expect("a pprof profile");
    let mut slow_path_by_class: HashMap<String, i64> = HashMap::new();
    for s in &p.sample {
        if on_stack(&p, s, "slow_path") {
            let class = latency_of(&p, s).unwrap_or("none").to_owned();
            *slow_path_by_class.entry(class).or_default() += cpu_ns(&p, s);
        }
    }
    let total: i64 = slow_path_by_class.values().sum();
    let slow: i64 = ["p90-99", "p99+"]
        .iter()
        .filter_map(|c| slow_path_by_class.get(*c))
        .sum();
    assert!(total > 0, "no sample of slow_path");
    assert!(
        slow as f64 >= 0.9 * total as f64,
        "slow_path's CPU by class: {slow_path_by_class:?}"
    );

    // go tool pprof reads the label: selecting the slow classes keeps the slow
    // path, selecting the others leaves almost none of it.
    let path = support::artifact_dir().join("latency-classes.pb.gz");
    std::fs::write(&path, &body).unwrap();
    let file = path.to_str().unwrap();
    let tags = go_pprof(&["-tags", file]);
    assert!(tags.contains("span_latency:"), "{tags}");
    let slow_top = go_pprof(&[
        "-top",
        "-cum",
        "-nodecount=500",
        "-tagfocus=span_latency=p9",
        file,
    ]);
    let fast_top = go_pprof(&[
        "-top",
        "-cum",
        "-nodecount=500",
        "-tagfocus=span_latency=p0-50|p50-90",
        file,
    ]);
    let (in_slow, in_fast) = (
        cum_ns(&slow_top, "slow_path"),
        cum_ns(&fast_top, "slow_path"),
    );
    assert!(
        in_slow > 0 && in_slow as f64 >= 0.9 * (in_slow + in_fast) as f64,
        "slow_path: {in_slow} ns in p90+, {in_fast} ns below\n{slow_top}\n{fast_top}"
    );

    // The route's page ranks the slow path first among what slow requests spend
    // more of their CPU in.
    let url = format!("http://{viewer}/debug/spanprof/api/routes/latency?route=GET%20%2Fwork");
    let (status, body) = get_bytes(&url, &[]).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    // Named by its requests' span name, as the trace list links it: the route.
    assert_eq!(answer["route"], "/work", "{answer}");
    assert!(answer["requests"].as_u64().unwrap() >= 400, "{answer}");
    assert!(answer["note"].is_null(), "{answer}");
    let first = answer["slow_vs_rest"][0]["function"].as_str().unwrap_or("");
    assert!(
        first.ends_with("slow_path"),
        "ranked first: {first}; {answer}"
    );
    let (status, svg) = get_bytes(
        &format!("http://{viewer}/debug/spanprof/routes/flamegraph?route=GET%20%2Fwork"),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&svg));
    assert!(String::from_utf8_lossy(&svg).contains("slow_path"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_with_too_few_requests_gets_no_class_and_says_so() {
    let (base, viewer) = serve().await;
    let body = captured(viewer, 3, load(&base, "/rare", 6, |_| false)).await;
    let p = spanprof::pprof::decode(&body).expect("a pprof profile");
    let route_of = |s: &proto::Sample| {
        s.label
            .iter()
            .find(|l| p.string_table[l.key as usize] == "route")
            .map(|l| p.string_table[l.str as usize].clone())
    };
    let rare: Vec<_> = p
        .sample
        .iter()
        .filter(|s| route_of(s).as_deref() == Some("/rare"))
        .collect();
    assert!(!rare.is_empty(), "no sample of /rare");
    for s in rare {
        assert_eq!(latency_of(&p, s), None, "a class from six requests");
    }
    let url = format!("http://{viewer}/debug/spanprof/api/routes/latency?route=%2Frare");
    let (status, body) = get_bytes(&url, &[]).await;
    assert_eq!(status, 200);
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["requests"], 6, "{answer}");
    let note = answer["note"].as_str().unwrap_or("");
    assert!(note.contains("too few requests"), "{answer}");
    assert!(note.contains("100 needed"), "{answer}");
    // No flamegraph to guess from.
    let (status, _) = get_bytes(
        &format!("http://{viewer}/debug/spanprof/routes/flamegraph?route=%2Frare"),
        &[],
    )
    .await;
    assert_eq!(status, 404);
}
