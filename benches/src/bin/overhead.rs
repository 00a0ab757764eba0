//! Overhead on a real service: an axum service with the checkout example's handler
//! mix, under a closed-loop load generator (a separate process) on loopback, in
//! alternating rounds within one run: (a) no spanprof, (b) the layer and the 99 Hz
//! baseline, (c) the layer, the baseline and 10 % of requests hot at 1 kHz. Also the
//! server's own CPU time per request in each mode (steadier than throughput when the
//! load generator competes for the same 2 cores).
//!
//! `cargo run --release -p spanprof-bench --bin overhead -- --json [--rounds 5] [--round-secs 3]`

use std::process::Command;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use spanprof::tower::{ProfileCorrelationLayer, RoutePolicy};
use spanprof_bench::{arg, print_json};

async fn checkout_handler() -> String {
    let cart = checkout::shop::sample_cart("bench", 4, 7);
    let lines = checkout::shop::validate_line_items(&cart.items).unwrap_or_default();
    let discount = checkout::shop::apply_discounts(&lines, cart.coupon.as_deref());
    let priced = checkout::shop::price(&cart.cart_id, lines, discount);
    checkout::shop::format_response(&priced)
}

async fn cart_handler() -> String {
    let cart = checkout::shop::sample_cart("bench", 2, 3);
    let lines = checkout::shop::validate_line_items(&cart.items).unwrap_or_default();
    checkout::shop::format_response(&checkout::shop::price(&cart.cart_id, lines, 0))
}

fn app(layer: Option<ProfileCorrelationLayer>) -> Router {
    let r = Router::new()
        .route("/checkout", get(checkout_handler))
        .route("/cart/{id}", get(cart_handler));
    match layer {
        Some(l) => r.layer(l),
        None => r,
    }
}

/// The load generator (run as a child process): prints `requests p50_us p99_us`.
fn client(base: &str, secs: f64, concurrency: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let lat = rt.block_on(async {
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut tasks = Vec::new();
        for c in 0..concurrency {
            let base = base.to_owned();
            tasks.push(tokio::spawn(async move {
                let client: Client<_, Empty<Bytes>> =
                    Client::builder(TokioExecutor::new()).build_http();
                let mut lat = Vec::new();
                let mut n = c;
                while Instant::now() < end {
                    n += 1;
                    let url = if n % 3 == 0 {
                        format!("{base}/cart/{n}")
                    } else {
                        format!("{base}/checkout")
                    };
                    let t = Instant::now();
                    let resp = client.get(url.parse().unwrap()).await.expect("request");
                    resp.into_body().collect().await.expect("body");
                    lat.push(t.elapsed().as_nanos() as u64);
                }
                lat
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    let mut lat = lat;
    lat.sort_unstable();
    let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q) as usize] as f64 / 1e3;
    println!("{} {} {}", lat.len(), p(0.5), p(0.99));
}

fn median_minmax(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    (s[s.len() / 2], s[0], s[s.len() - 1])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--client") {
        client(&args[2], args[3].parse().unwrap(), args[4].parse().unwrap());
        return;
    }
    let rounds: usize = arg("--rounds").map_or(5, |s| s.parse().expect("--rounds N"));
    let secs: f64 = arg("--round-secs").map_or(3.0, |s| s.parse().expect("--round-secs S"));
    checkout::shop::warm_up();

    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder.worker_threads(2).enable_all().build().unwrap();
    // The profiler is started and stopped per round; the layers keep no profiler.
    let probe = spanprof::Profiler::builder().start().expect("profiler");
    let layer = |rate: f64| {
        ProfileCorrelationLayer::builder()
            .default_policy(RoutePolicy::new().sample_rate(rate).never_slow())
            .profiler(probe.clone())
            .build()
            .unwrap()
    };
    let (l_base, l_hot) = (layer(0.0), layer(0.1));
    probe.stop();
    let urls: Vec<String> = rt.block_on(async {
        let mut urls = Vec::new();
        for a in [app(None), app(Some(l_base)), app(Some(l_hot))] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            urls.push(format!("http://{}", listener.local_addr().unwrap()));
            tokio::spawn(async move { axum::serve(listener, a).await.unwrap() });
        }
        urls
    });
    let exe = std::env::current_exe().unwrap();
    let names = ["none", "baseline", "hot10"];
    let (mut rps, mut p99, mut cpu) = (
        [vec![], vec![], vec![]],
        [vec![], vec![], vec![]],
        [vec![], vec![], vec![]],
    );
    for round in 0..rounds * 3 {
        let mode = round % 3;
        let profiler = (mode > 0).then(|| {
            spanprof::Profiler::builder()
                .baseline_hz(99)
                .high_hz(1000)
                .start()
                .expect("profiler")
        });
        let cpu0 = spanprof::process_cpu_time();
        let out = Command::new(&exe)
            .args(["--client", &urls[mode], &secs.to_string(), "4"])
            .output()
            .expect("run the load generator");
        let cpu_used = (spanprof::process_cpu_time() - cpu0).as_secs_f64();
        if let Some(p) = profiler {
            p.stop();
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let f: Vec<f64> = text
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        rps[mode].push(f[0] / secs);
        p99[mode].push(f[2]);
        cpu[mode].push(cpu_used * 1e6 / f[0]);
        if !args.iter().any(|a| a == "--json") {
            eprintln!(
                "{}: {:.0} req/s, p99 {:.0} µs, {:.1} µs CPU/req",
                names[mode],
                f[0] / secs,
                f[2],
                cpu_used * 1e6 / f[0]
            );
        }
    }
    let m = |v: &Vec<f64>| median_minmax(v);
    let (rn, rb, rh) = (m(&rps[0]), m(&rps[1]), m(&rps[2]));
    let (pn, pb, ph) = (m(&p99[0]), m(&p99[1]), m(&p99[2]));
    let (cn, cb, ch) = (m(&cpu[0]), m(&cpu[1]), m(&cpu[2]));
    print_json(serde_json::json!({
        "rps_none": rn.0, "rps_none_min_max": [rn.1, rn.2],
        "rps_baseline": rb.0, "rps_baseline_min_max": [rb.1, rb.2],
        "rps_hot10": rh.0, "rps_hot10_min_max": [rh.1, rh.2],
        "ratio_baseline": rb.0 / rn.0,
        "ratio_hot10": rh.0 / rn.0,
        "p99_us_none": pn.0, "p99_us_baseline": pb.0, "p99_us_hot10": ph.0,
        "p99_ratio_baseline": pb.0 / pn.0,
        "p99_ratio_hot10": ph.0 / pn.0,
        "cpu_us_per_req_none": cn.0, "cpu_us_per_req_baseline": cb.0, "cpu_us_per_req_hot10": ch.0,
        "cpu_per_req_ratio_baseline": cb.0 / cn.0,
        "cpu_per_req_ratio_hot10": ch.0 / cn.0,
        "rounds": rounds, "round_secs": secs,
    }));
}
