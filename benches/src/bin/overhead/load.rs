//! The load generator (`overhead load`, a process of its own) and the run's side of
//! it.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use spanprof_workloads::service;

use crate::cli::LoadArgs;

/// One run of the load generator: requests answered, latency percentiles (µs),
/// errors, and requests not sent because too many were outstanding.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOutcome {
    pub requests: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: f64,
    pub skipped: f64,
}

/// Most requests in flight before the open-loop generator skips a send.
const MAX_IN_FLIGHT: usize = 512;

fn request(workload: &str, bodies: &[Bytes], base: &str, n: u64) -> http::Request<Full<Bytes>> {
    let (method, path, body) = match workload {
        "json" => (
            "POST",
            service::ORDERS_ROUTE.to_owned(),
            bodies[n as usize % bodies.len()].clone(),
        ),
        _ if n.is_multiple_of(3) => ("GET", format!("/cart/{n}"), Bytes::new()),
        _ => ("GET", "/checkout".to_owned(), Bytes::new()),
    };
    http::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap()
}

/// `load --url U --workload W --secs S (--rate R | --concurrency C)`: prints
/// `requests p50_us p99_us errors skipped`.
pub fn load(args: &LoadArgs) {
    let base = args.url.clone();
    let workload = args.workload.clone();
    let (secs, rate, conc) = (args.secs, args.rate, args.concurrency);
    let bodies: Arc<Vec<Bytes>> = Arc::new(spanprof_bench::order_bodies());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = rt.block_on(async move {
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let lat = Arc::new(Mutex::new(Vec::<u64>::new()));
        let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let send = {
            let (client, lat, errors, bodies) =
                (client.clone(), lat.clone(), errors.clone(), bodies.clone());
            let (base, workload) = (base.clone(), workload.clone());
            move |n: u64, since: Instant| {
                let req = request(&workload, &bodies, &base, n);
                let (client, lat, errors) = (client.clone(), lat.clone(), errors.clone());
                async move {
                    let ok = match client.request(req).await {
                        Ok(resp) => {
                            let ok = resp.status().is_success();
                            resp.into_body().collect().await.is_ok() && ok
                        }
                        Err(_) => false,
                    };
                    if ok {
                        lat.lock().unwrap().push(since.elapsed().as_nanos() as u64);
                    } else {
                        errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        };
        let start = Instant::now();
        let end = start + Duration::from_secs_f64(secs);
        let mut skipped = 0u64;
        if rate > 0.0 {
            let total = (rate * secs) as u64;
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..total {
                let due = start + Duration::from_secs_f64(i as f64 / rate);
                if Instant::now() < due {
                    tokio::time::sleep_until(due.into()).await;
                }
                while tasks.try_join_next().is_some() {}
                if tasks.len() >= MAX_IN_FLIGHT {
                    skipped += 1;
                    continue;
                }
                tasks.spawn(send(i, due));
            }
            let drain = tokio::time::timeout(Duration::from_secs(10), async {
                while tasks.join_next().await.is_some() {}
            });
            let _ = drain.await;
        } else {
            let mut tasks = tokio::task::JoinSet::new();
            for c in 0..conc {
                let send = send.clone();
                tasks.spawn(async move {
                    let mut n = c as u64;
                    while Instant::now() < end {
                        send(n, Instant::now()).await;
                        n += conc as u64;
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
        }
        let mut lat = std::mem::take(&mut *lat.lock().unwrap());
        lat.sort_unstable();
        let p = |q: f64| {
            lat.get(((lat.len().max(1) - 1) as f64 * q) as usize)
                .map_or(0.0, |&v| v as f64 / 1e3)
        };
        format!(
            "{} {} {} {} {}",
            lat.len(),
            p(0.5),
            p(0.99),
            errors.load(std::sync::atomic::Ordering::Relaxed),
            skipped
        )
    });
    println!("{out}");
}

pub fn run_load(
    exe: &std::path::Path,
    url: &str,
    workload: &str,
    secs: f64,
    how: (&str, f64),
) -> LoadOutcome {
    let out = Command::new(exe)
        .args([
            "load",
            "--url",
            url,
            "--workload",
            workload,
            "--secs",
            &secs.to_string(),
        ])
        .args([how.0, &how.1.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .expect("run the load generator");
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<f64> = text
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(f64::NAN))
        .collect();
    assert_eq!(f.len(), 5, "load generator said {text:?}");
    LoadOutcome {
        requests: f[0],
        p50_us: f[1],
        p99_us: f[2],
        errors: f[3],
        skipped: f[4],
    }
}
