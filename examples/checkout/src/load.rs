//! The built-in load generator: a closed loop of a few concurrent clients sending a
//! mix of requests, a few of them pathological (large carts), with a progress bar.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::shop::sample_cart;
use crate::stop::Stop;

/// What a load run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Requests sent.
    pub requests: u64,
    /// Responses other than 2xx, and transport errors.
    pub errors: u64,
    /// Large-cart checkouts among them.
    pub large_carts: u64,
}

/// Lines of a pathological cart: slow for a code reason (in a release build, about
/// 0.8 s on the machines this was written on; unoptimised builds use fewer).
pub const LARGE_CART_LINES: usize = if cfg!(debug_assertions) { 100 } else { 600 };

/// Drives `target` (for example `http://127.0.0.1:3000`) for `duration` with
/// `concurrency` clients, or until `stop`: then the clients send nothing more and
/// wait for the answers to what they sent. The mix: 70 % `POST /checkout` with 2–12
/// lines, 3 % with [`LARGE_CART_LINES`] lines (slow for a code reason), 22 % `GET
/// /cart/{id}`, 5 % `GET /health`.
pub async fn run(
    target: &str,
    duration: Duration,
    concurrency: usize,
    progress: bool,
    stop: Stop,
) -> LoadReport {
    let requests = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let large = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + duration;
    let bar = if progress {
        let b = indicatif::ProgressBar::new(duration.as_secs().max(1));
        b.set_style(
            indicatif::ProgressStyle::with_template("load {bar:30} {pos}/{len}s {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let (target, requests, errors, large, stop) = (
            target.trim_end_matches('/').to_owned(),
            requests.clone(),
            errors.clone(),
            large.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
            let mut n = worker as u64 * 1_000_003;
            while Instant::now() < end && !stop.is_stopped() {
                n += 1;
                // About 3 % large carts, the first one early in every client's run
                // (so even a short run has some); the rest of the mix by hash.
                let k = n - worker as u64 * 1_000_003;
                let pick = n * 2_654_435_761 % 100;
                let req = if k % 33 == 3 {
                    large.fetch_add(1, Ordering::Relaxed);
                    checkout_request(&target, LARGE_CART_LINES, n)
                } else if pick < 72 {
                    checkout_request(&target, 2 + (n % 11) as usize, n)
                } else if pick < 95 {
                    http::Request::get(format!("{target}/cart/cart-{}", n % 500))
                        .body(Full::new(Bytes::new()))
                        .expect("request")
                } else {
                    http::Request::get(format!("{target}/health"))
                        .body(Full::new(Bytes::new()))
                        .expect("request")
                };
                requests.fetch_add(1, Ordering::Relaxed);
                match client.request(req).await {
                    Ok(resp) => {
                        let ok = resp.status().is_success();
                        let _ = resp.into_body().collect().await;
                        if !ok {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                            _ = stop.stopped() => {}
                        }
                    }
                }
            }
        }));
    }
    let ticker = {
        let (bar, requests, stop) = (bar.clone(), requests.clone(), stop.clone());
        tokio::spawn(async move {
            let start = Instant::now();
            while Instant::now() < end && !stop.is_stopped() {
                tokio::time::sleep(Duration::from_millis(250)).await;
                bar.set_position(start.elapsed().as_secs());
                bar.set_message(format!("{} requests", requests.load(Ordering::Relaxed)));
            }
        })
    };
    for t in tasks {
        let _ = t.await;
    }
    ticker.abort();
    bar.finish_and_clear();
    LoadReport {
        requests: requests.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        large_carts: large.load(Ordering::Relaxed),
    }
}

fn checkout_request(target: &str, lines: usize, seed: u64) -> http::Request<Full<Bytes>> {
    let cart = sample_cart(&format!("cart-{seed}"), lines, seed);
    http::Request::post(format!("{target}/checkout"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(&cart).expect("json"),
        )))
        .expect("request")
}
