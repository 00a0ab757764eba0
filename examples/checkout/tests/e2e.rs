//! End to end: the example on loopback ports under its own load; through the
//! viewer's JSON API, a slow `POST /checkout` trace whose span profile shows the code
//! that made it slow, with the inventory call as a child span from the other service;
//! then the viewer in headless Chromium.

use std::time::Duration;

use checkout::{load, telemetry};
use serde_json::Value;
use spanprof::Profiler;

/// GET `url`: status, content type and body.
async fn get(url: &str) -> (http::StatusCode, String, bytes::Bytes) {
    use http_body_util::{BodyExt, Empty};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let resp = client.get(url.parse().unwrap()).await.expect("GET");
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (
        status,
        content_type,
        resp.into_body().collect().await.unwrap().to_bytes(),
    )
}

async fn get_json(url: &str) -> Value {
    let (status, _, body) = get(url).await;
    assert!(status.is_success(), "{url}: {status}");
    serde_json::from_slice(&body).expect("JSON")
}

/// Asks two URLs in turn, every 50 ms, from a thread of its own; records how long
/// each answer took.
struct Probe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(Vec<Duration>, Vec<Duration>)>,
}

impl Probe {
    fn start(a: String, b: String) -> Probe {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let (mut la, mut lb) = (Vec::new(), Vec::new());
                while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                    for (url, into) in [(&a, &mut la), (&b, &mut lb)] {
                        let t = std::time::Instant::now();
                        let (status, _, _) = get(url).await;
                        assert!(status.is_success(), "{url}: {status}");
                        into.push(t.elapsed());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                la.sort();
                lb.sort();
                (la, lb)
            })
        });
        Probe { stop, thread }
    }

    /// Sorted latencies of each URL.
    fn stop(self) -> (Vec<Duration>, Vec<Duration>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("probe thread")
    }
}

/// The `p`th percentile of sorted `v`.
fn percentile(v: &[Duration], p: usize) -> Duration {
    v.get((v.len() * p / 100).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

#[test]
fn slow_checkout_shows_its_code_in_the_api_and_the_browser() {
    let profiler = Profiler::builder().start().expect("profiler");
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder.worker_threads(2).enable_all().build().unwrap();
    let quiet = telemetry::Telemetry {
        log_filter: None,
        ..Default::default()
    };
    let (shop, _provider) = rt
        .block_on(checkout::start_local(profiler.clone(), &quiet))
        .expect("start");
    // While the load runs, /health and the viewer are asked from another thread
    // (its own runtime, as an outside client would).
    let probe = Probe::start(
        format!("http://{}/health", shop.api),
        format!("{}api/traces?limit=20", shop.viewer_url()),
    );
    // 10 s of load, and more (up to 40 s) on a machine so busy that it served fewer
    // than 50 requests: the checks below need traffic, not a rate.
    let mut report = load::LoadReport::default();
    for _ in 0..4 {
        let r = rt.block_on(load::run(
            &format!("http://{}", shop.api),
            Duration::from_secs(10),
            4,
            false,
            checkout::stop::Stop::never(),
        ));
        report.requests += r.requests;
        report.errors += r.errors;
        report.large_carts += r.large_carts;
        if report.requests > 50 && report.large_carts > 0 {
            break;
        }
    }
    let (health, viewer) = probe.stop();
    assert!(report.requests > 50 && report.large_carts > 0, "{report:?}");
    assert_eq!(report.errors, 0, "{report:?}");
    // A generous bound (release builds answer within tens of milliseconds): the slow
    // checkouts do not starve the health check or the viewer.
    for (what, latencies) in [("/health", &health), ("the viewer", &viewer)] {
        let p99 = percentile(latencies, 99);
        eprintln!(
            "{what} under load: {} answers, p50 {:?}, p99 {p99:?}, max {:?}",
            latencies.len(),
            percentile(latencies, 50),
            latencies.last().copied().unwrap_or_default()
        );
        assert!(
            latencies.len() > 20 && p99 < Duration::from_secs(1),
            "{what} under load: {} answers, p99 {p99:?}, max {:?}",
            latencies.len(),
            latencies.last().unwrap()
        );
    }
    profiler.flush();
    let base = format!("http://{}/debug/spanprof", shop.viewer);

    rt.block_on(async {
        let traces = get_json(&format!(
            "{base}/api/traces?route=POST%20/checkout&limit=20"
        ))
        .await;
        let traces = traces.as_array().unwrap();
        assert!(!traces.is_empty());
        let slowest = &traces[0];
        assert_eq!(slowest["root"], "POST /checkout");
        let durations: Vec<u64> = traces
            .iter()
            .map(|t| t["duration_ns"].as_u64().unwrap())
            .collect();
        assert!(
            durations.windows(2).all(|w| w[0] >= w[1]),
            "slowest first: {durations:?}"
        );
        // Profiled at the high rate: promoted for being slow, or picked by the 10 % rate.
        assert!(
            slowest["hot"] == "slow" || slowest["hot"] == "sampled",
            "the slowest checkout was profiled at the high rate: {slowest}"
        );
        assert!(
            traces.iter().any(|t| t["hot"] == "slow"),
            "some checkout was promoted for being slow"
        );
        let trace_id = slowest["trace_id"].as_str().unwrap();
        let root_id = slowest["root_span_id"].as_str().unwrap();

        // Its profile: the code that made it slow among its top functions.
        let top = get_json(&format!("{base}/api/spans/{root_id}/top?by=total&n=30")).await;
        let names: Vec<&str> = top["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["function"].as_str().unwrap())
            .collect();
        assert!(
            names.iter().all(|f| !f.starts_with('[')
                && !f.contains("tokio::runtime::")
                && !f.contains("spanprof_")),
            "by total, without the runtime, spanprof's wrapper and module stand-ins: {names:?}"
        );
        let culprit = names
            .iter()
            .find(|f| f.ends_with("check_price_rules") || f.ends_with("CartSerializer::to_json"))
            .unwrap_or_else(|| panic!("top functions of the slow checkout: {names:?}"));

        // The differential flamegraph against the route's recent profile.
        let (status, content_type, svg) = get(&format!("{base}/diff/{root_id}?minutes=5")).await;
        assert_eq!(status, 200);
        assert_eq!(content_type, "image/svg+xml");
        let svg = String::from_utf8_lossy(&svg);
        // The culprit is wide enough in this span's profile to be drawn.
        assert!(
            svg.contains("<svg") && svg.contains(*culprit),
            "diff flamegraph lacks {culprit}"
        );

        // The inventory call is a child span from the other service, same trace.
        let trace = get_json(&format!("{base}/api/traces/{trace_id}")).await;
        let spans = trace["spans"].as_array().unwrap();
        let by_id = |id: &str| spans.iter().find(|s| s["span_id"] == id);
        let inventory = spans
            .iter()
            .find(|s| s["service"] == "inventory")
            .unwrap_or_else(|| panic!("no inventory span in {trace}"));
        assert_eq!(inventory["name"], "POST /inventory.Inventory/Reserve");
        let mut cur = inventory.clone();
        let mut hops = 0;
        while cur["span_id"] != root_id {
            let parent = cur["parent_span_id"].as_str().unwrap();
            cur = by_id(parent)
                .unwrap_or_else(|| panic!("broken parent chain at {cur}"))
                .clone();
            hops += 1;
            assert!(hops < 10);
        }
        assert!(
            spans.iter().any(|s| s["service"] == "payments"),
            "payments span in the trace"
        );

        // The slowness that is not CPU: a large cart's payment goes through the
        // legacy review's synchronous call, a long poll on the payments span, with
        // the time blocked inside it when the span was profiled at the high rate.
        let pays = get_json(&format!("{base}/api/spans?name=POST%20/pay&limit=50")).await;
        let pays = pays.as_array().unwrap();
        let slowest = &pays[0];
        assert!(
            slowest["long_polls"].as_i64().unwrap_or(0) >= 1,
            "the slowest POST /pay has no long poll: {slowest}"
        );
        // A reviewed payment holds its worker for the review's 40 ms; an ordinary one
        // can have a long poll too on a loaded machine (10 ms off CPU in one poll),
        // so the reviewed ones are told by their time inside polls.
        for pay in pays.iter().filter(|p| p["cpu_source"] == "thread_clock") {
            if pay["busy_ns"].as_i64().unwrap_or(0) >= 40_000_000 {
                assert!(
                    pay["blocked_ns"].as_i64().unwrap_or(0) >= 30_000_000
                        && pay["long_polls"].as_i64().unwrap_or(0) >= 1,
                    "a reviewed payment blocked less than 30 ms, or without a long poll: {pay}"
                );
            }
        }
    });

    // The viewer in headless Chromium.
    let browser_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("browser");
    let artifacts =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("viewer.png");
    let out = std::process::Command::new("node")
        .arg(browser_dir.join("viewer.mjs"))
        .arg(format!("{base}/"))
        .arg(&shot)
        .current_dir(&browser_dir)
        .output()
        .expect("node must be installed; scripts/test installs playwright-core and chromium");
    assert!(
        out.status.success(),
        "browser test failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(shot.exists());
    drop(rt);
    profiler.stop();
}
