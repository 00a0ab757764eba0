//! The example under its built-in load (4 clients, in the process, as
//! `cargo run -p checkout` runs it), in two phases of equal length:
//!
//! 1. the load alone, while a prober asks `GET /health` and the viewer's
//!    `api/traces` every 50 ms;
//! 2. the same, plus 4 viewer clients asking the differential flamegraph of the
//!    slowest checkout in a loop.
//!
//! Prints the app's requests per second in each phase (and their ratio), the
//! latencies of `/health` and the viewer (p50/p99/max), and the diffs served.
//!
//! `cargo bench -p checkout --bench under_load -- [--seconds 15] [--json]`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use checkout::stop::Stop;
use checkout::{load, telemetry};
use http_body_util::{BodyExt, Empty};
use spanprof::Profiler;

async fn get(url: &str) -> (u16, Bytes) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    match client.get(url.parse().expect("a URL")).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.map(|b| b.to_bytes());
            (status, body.unwrap_or_default())
        }
        Err(_) => (0, Bytes::new()),
    }
}

/// Runs `work` in a loop on a thread with its own runtime until `stop`.
fn on_own_thread<F, Fut>(stop: Arc<AtomicBool>, work: F) -> std::thread::JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            while !stop.load(Ordering::Relaxed) {
                work().await;
            }
        });
    })
}

#[derive(Debug, Default)]
struct Latencies(std::sync::Mutex<Vec<Duration>>);

impl Latencies {
    fn add(&self, d: Duration) {
        self.0.lock().unwrap().push(d);
    }

    /// (p50, p99, max) in ms, and the count.
    fn summary(&self) -> (f64, f64, f64, usize) {
        let mut v = self.0.lock().unwrap().clone();
        v.sort();
        let at = |p: usize| {
            v.get((v.len() * p / 100).min(v.len().saturating_sub(1)))
                .map_or(0.0, |d| d.as_secs_f64() * 1e3)
        };
        (at(50), at(99), at(100), v.len())
    }
}

struct Phase {
    requests_per_s: f64,
    errors: u64,
    health: (f64, f64, f64, usize),
    viewer: (f64, f64, f64, usize),
    diffs: u64,
    diff_ms: (f64, f64, f64, usize),
}

fn phase(
    rt: &tokio::runtime::Runtime,
    api: &str,
    viewer: &str,
    secs: u64,
    diff_url: Option<String>,
) -> Phase {
    let stop = Arc::new(AtomicBool::new(false));
    let (health, traces, diff_lat) = (
        Arc::new(Latencies::default()),
        Arc::new(Latencies::default()),
        Arc::new(Latencies::default()),
    );
    let diffs = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    {
        let (h, t) = (health.clone(), traces.clone());
        let (hu, tu) = (
            format!("{api}/health"),
            format!("{viewer}api/traces?limit=20"),
        );
        threads.push(on_own_thread(stop.clone(), move || {
            let (h, t, hu, tu) = (h.clone(), t.clone(), hu.clone(), tu.clone());
            async move {
                let s = Instant::now();
                get(&hu).await;
                h.add(s.elapsed());
                let s = Instant::now();
                get(&tu).await;
                t.add(s.elapsed());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    if let Some(url) = diff_url {
        for _ in 0..4 {
            let (url, diffs, lat) = (url.clone(), diffs.clone(), diff_lat.clone());
            threads.push(on_own_thread(stop.clone(), move || {
                let (url, diffs, lat) = (url.clone(), diffs.clone(), lat.clone());
                async move {
                    let s = Instant::now();
                    if get(&url).await.0 == 200 {
                        diffs.fetch_add(1, Ordering::Relaxed);
                        lat.add(s.elapsed());
                    }
                }
            }));
        }
    }
    let started = Instant::now();
    let r = rt.block_on(load::run(
        api,
        Duration::from_secs(secs),
        4,
        false,
        Stop::never(),
    ));
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    Phase {
        requests_per_s: r.requests as f64 / elapsed,
        errors: r.errors,
        health: health.summary(),
        viewer: traces.summary(),
        diffs: diffs.load(Ordering::Relaxed),
        diff_ms: diff_lat.summary(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: u64 = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let json = args.iter().any(|a| a == "--json");

    let profiler = Profiler::builder().start().expect("profiler");
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder.enable_all().build().expect("runtime");
    let quiet = telemetry::Telemetry {
        log_filter: None,
        ..Default::default()
    };
    let (shop, _provider) = rt
        .block_on(checkout::start_local(profiler.clone(), &quiet))
        .expect("start");
    let api = format!("http://{}", shop.api);
    let viewer = shop.viewer_url();
    // Warm up, and leave traces for the viewer to draw.
    rt.block_on(load::run(
        &api,
        Duration::from_secs(5),
        4,
        false,
        Stop::never(),
    ));
    profiler.flush();
    let slowest = shop
        .spans
        .traces(Some("POST /checkout"), 1)
        .first()
        .map(|t| t.root_span_id.clone())
        .expect("a checkout trace");
    let alone = phase(&rt, &api, &viewer, secs, None);
    let with_viewer = phase(
        &rt,
        &api,
        &viewer,
        secs,
        Some(format!("{viewer}diff/{slowest}?minutes=5")),
    );
    let ratio = with_viewer.requests_per_s / alone.requests_per_s.max(1e-9);
    let row = |p: &Phase| {
        serde_json::json!({
            "requests_per_s": p.requests_per_s,
            "errors": p.errors,
            "health_ms_p50_p99_max": [p.health.0, p.health.1, p.health.2],
            "health_answers": p.health.3,
            "viewer_ms_p50_p99_max": [p.viewer.0, p.viewer.1, p.viewer.2],
            "viewer_answers": p.viewer.3,
            "diffs": p.diffs,
            "diff_ms_p50_p99_max": [p.diff_ms.0, p.diff_ms.1, p.diff_ms.2],
        })
    };
    if json {
        println!(
            "{}",
            serde_json::json!({
                "seconds": secs,
                "load_alone": row(&alone),
                "with_4_diff_clients": row(&with_viewer),
                "throughput_ratio": ratio,
            })
        );
    } else {
        for (name, p) in [("load alone", &alone), ("+ 4 diff clients", &with_viewer)] {
            println!(
                "{name:18} {:7.1} req/s ({} errors)  /health p50 {:.1} p99 {:.1} max {:.1} ms  viewer p50 {:.1} p99 {:.1} max {:.1} ms  diffs {} (p50 {:.0} ms)",
                p.requests_per_s,
                p.errors,
                p.health.0,
                p.health.1,
                p.health.2,
                p.viewer.0,
                p.viewer.1,
                p.viewer.2,
                p.diffs,
                p.diff_ms.0
            );
        }
        println!(
            "throughput with the viewer busy: {:.0} % of alone",
            ratio * 100.0
        );
    }
    drop(rt);
    profiler.stop();
}
