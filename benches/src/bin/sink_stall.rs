//! Request latency of a service whose profile sink's server stalls, against the same
//! service with no sink, measured side by side in alternating rounds.
//!
//! `cargo run --release -p spanprof-bench --bin sink_stall -- --json [--rounds 6] [--round-secs 2]`
//!
//! The sink (Pyroscope push every 100 ms) points at a server that accepts connections
//! and never answers: every send waits for its timeout. Requests must not notice.

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use spanprof::export::{ProfileSource, PyroscopeConfig, PyroscopeExporter};
use spanprof::tower::{ProfileCorrelationLayer, RoutePolicy};
use spanprof_bench::{arg, flag, print_json};
use spanprof_workloads::BURNERS;

async fn handler() -> String {
    BURNERS[0].1(20_000).to_string()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

async fn round(url: &str, secs: f64, concurrency: usize) -> Vec<Duration> {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let client: Client<_, Empty<Bytes>> =
                Client::builder(TokioExecutor::new()).build_http();
            let mut lat = Vec::new();
            while Instant::now() < end {
                let t = Instant::now();
                let resp = client.get(url.parse().unwrap()).await.expect("request");
                resp.into_body().collect().await.expect("body");
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = arg("--rounds").map_or(6, |s| s.parse().expect("--rounds N"));
    let secs: f64 = arg("--round-secs").map_or(2.0, |s| s.parse().expect("--round-secs S"));
    let profiler = spanprof::Profiler::builder().start().expect("profiler");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (url, stall_addr) = rt.block_on(async {
        let layer = ProfileCorrelationLayer::builder()
            .default_policy(RoutePolicy::new().sample_rate(0.1))
            .build()
            .unwrap();
        let app = Router::new().route("/work", get(handler)).layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        // The stalled server: accepts, holds the connection, never answers.
        let stall = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stall_addr = stall.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = stall.accept().await {
                held.push(s);
            }
        });
        (format!("http://{addr}/work"), stall_addr)
    });
    let mut p50 = [Vec::new(), Vec::new()];
    let mut p99 = [Vec::new(), Vec::new()];
    let mut rps = [Vec::new(), Vec::new()];
    let mut sink_stats = None;
    for r in 0..rounds * 2 {
        let with_sink = r % 2 == 1;
        let exporter = with_sink.then(|| {
            let mut cfg = PyroscopeConfig::new(format!("http://{stall_addr}"));
            cfg.interval = Duration::from_millis(100);
            PyroscopeExporter::start(cfg, ProfileSource::profiler(&profiler)).unwrap()
        });
        let mut lat = rt.block_on(round(&url, secs, 4));
        lat.sort();
        let m = usize::from(with_sink);
        p50[m].push(percentile(&lat, 0.5));
        p99[m].push(percentile(&lat, 0.99));
        rps[m].push(lat.len() as f64 / secs);
        if let Some(e) = exporter {
            sink_stats = Some(e.stats());
            e.shutdown(Duration::ZERO);
        }
    }
    let (p50n, p50s) = (median(&mut p50[0]), median(&mut p50[1]));
    let (p99n, p99s) = (median(&mut p99[0]), median(&mut p99[1]));
    let (rn, rs) = (median(&mut rps[0]), median(&mut rps[1]));
    let stats = sink_stats.unwrap_or_default();
    if !flag("--json") {
        eprintln!("sink stats (last round): {stats:?}");
    }
    print_json(serde_json::json!({
        "p50_us_no_sink": p50n,
        "p50_us_stalled_sink": p50s,
        "p99_us_no_sink": p99n,
        "p99_us_stalled_sink": p99s,
        "rps_no_sink": rn,
        "rps_stalled_sink": rs,
        "p50_ratio": p50s / p50n,
        "p99_ratio": p99s / p99n,
        "rps_ratio": rs / rn,
        "sink_sent_last_round": stats.sent,
        "sink_pending_last_round": stats.pending,
        "sink_dropped_queue_full_last_round": stats.dropped_queue_full,
        "rounds": rounds,
    }));
    profiler.stop();
}
