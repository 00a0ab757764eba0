//! What spanprof costs a small unit of work that is not an HTTP request: a ~20 µs
//! command of a service shaped like tokio-rs/mini-redis (connection tasks, a `run`
//! span per connection, an `#[instrument]`-style `apply` span per command, no Tower),
//! profiled with `SpanProfileLayer::profile_roots("apply", …)`.
//!
//! One process per mode, all running at once (the machine's other load falls on
//! every mode alike), each executing commands at a fixed rate for `--rounds` rounds
//! of `--round-secs`: 8 connection tasks, fed by a pacer, each command two polls
//! (work, a yield, a little more work). The metric is the process's CPU time per
//! command; ratios to `stack` are paired by round, and `us_over_stack` is the
//! difference in µs of CPU per command, the figure a user compares with the cost
//! of their own commands.
//!
//! - `stack`: a `tracing` registry with `tracing-opentelemetry` and the SDK's batch
//!   span processor in front of an exporter that discards;
//! - `baseline`: the stack plus spanprof as docs/layer.md sets up a service without
//!   Tower (profiler at 99 Hz, runtime hooks, `SpanProfileLayer` with
//!   `profile_roots("apply", …)`, `SpanProfileProcessor::batch`), no command hot (as
//!   `overhead`'s `baseline`);
//! - `default`: the same with `RoutePolicy::new()` (5 % of commands hot at 1 kHz,
//!   promoted after 1 s);
//! - `labels-only`: `baseline` with `Sampling::LabelsOnly` (no sampler);
//! - `stack-again`: a second `stack` (the A/A control).
//!
//! `cargo run --release -p spanprof-bench --bin command -- --json [--rounds 20] [--round-secs 2] [--rate 4000]`

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use spanprof::tower::{RoutePolicy, SpanProfileLayer};
use spanprof_bench::{arg, flag, median, print_json, tracer_provider};
use tracing::Instrument;
use tracing_subscriber::prelude::*;

const MODES: [&str; 5] = ["stack", "baseline", "default", "labels-only", "stack-again"];

/// Connection tasks per process.
const CONNECTIONS: usize = 8;

fn main() {
    if let Some(mode) = arg("--serve") {
        return serve(&mode);
    }
    let rounds: usize = arg("--rounds").map_or(20, |v| v.parse().expect("--rounds"));
    let secs: f64 = arg("--round-secs").map_or(2.0, |v| v.parse().expect("--round-secs"));
    let rate: f64 = arg("--rate").map_or(3000.0, |v| v.parse().expect("--rate"));
    let exe = std::env::current_exe().expect("own executable");
    // Every process does the same work per command: the loop's speed measured once,
    // here.
    let per_us = iterations_per_us().to_string();
    let mut children: Vec<_> = MODES
        .iter()
        .map(|mode| {
            Command::new(&exe)
                .args(["--serve", mode, "--rounds", &rounds.to_string()])
                .args([
                    "--round-secs",
                    &secs.to_string(),
                    "--rate",
                    &rate.to_string(),
                ])
                .args(["--iterations-per-us", &per_us])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("start the {mode} process: {e}"))
        })
        .collect();
    // Per mode and round: (CPU ns, commands).
    let rows: Vec<Vec<(f64, f64)>> = children
        .iter_mut()
        .map(|c| {
            BufReader::new(c.stdout.take().expect("piped"))
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| {
                    let mut f = l.split_whitespace();
                    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
                })
                .collect()
        })
        .collect();
    for c in &mut children {
        let _ = c.wait();
    }
    let per_cmd: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| r.iter().map(|&(ns, n)| ns / n.max(1.0) / 1e3).collect())
        .collect();
    let mut out = serde_json::Map::new();
    out.insert("rounds".into(), rounds.into());
    out.insert("rate_per_s".into(), rate.into());
    for (i, mode) in MODES.iter().enumerate() {
        out.insert(format!("cpu_per_cmd_us_{mode}"), median(&per_cmd[i]).into());
        if i == 0 {
            continue;
        }
        let ratios: Vec<f64> = per_cmd[i]
            .iter()
            .zip(&per_cmd[0])
            .map(|(m, s)| m / s)
            .collect();
        let diffs: Vec<f64> = per_cmd[i]
            .iter()
            .zip(&per_cmd[0])
            .map(|(m, s)| m - s)
            .collect();
        let (lo, hi) = quartiles(&ratios);
        out.insert(format!("ratio_{mode}"), median(&ratios).into());
        out.insert(format!("ratio_{mode}_q1"), lo.into());
        out.insert(format!("ratio_{mode}_q3"), hi.into());
        out.insert(format!("us_over_stack_{mode}"), median(&diffs).into());
    }
    if flag("--json") {
        print_json(serde_json::Value::Object(out));
    } else {
        for (k, v) in out {
            println!("{k}: {v}");
        }
    }
}

/// The first and third quartiles.
fn quartiles(v: &[f64]) -> (f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    (v[v.len() / 4], v[(3 * v.len() / 4).min(v.len() - 1)])
}

/// One command: ~20 µs of CPU over two polls (the handler's work, a yield as if
/// waiting for the socket, the reply).
#[tracing::instrument(level = "info", skip_all)]
async fn apply(key: u64) -> u64 {
    let mut h = work(key, 14);
    tokio::task::yield_now().await;
    h ^= work(h, 6);
    h
}

/// About `us` µs of CPU (a hash chain; the iteration count measured once).
fn work(seed: u64, us: u64) -> u64 {
    let mut x = seed | 1;
    for _ in 0..us * iterations_per_us() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x)
}

fn iterations_per_us() -> u64 {
    static PER_US: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PER_US.get_or_init(|| {
        if let Some(given) = arg("--iterations-per-us") {
            return given.parse().expect("--iterations-per-us");
        }
        let n = 20_000_000u64;
        let t = Instant::now();
        let mut x = 1u64;
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        std::hint::black_box(x);
        (n as f64 / (t.elapsed().as_secs_f64() * 1e6)).max(1.0) as u64
    })
}

fn serve(mode: &str) {
    let rounds: usize = arg("--rounds").map_or(20, |v| v.parse().expect("--rounds"));
    let secs: f64 = arg("--round-secs").map_or(2.0, |v| v.parse().expect("--round-secs"));
    let rate: f64 = arg("--rate").map_or(3000.0, |v| v.parse().expect("--rate"));
    iterations_per_us();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(2).enable_all();
    let spanprof = matches!(mode, "baseline" | "default" | "labels-only");
    let policy = if mode == "default" {
        RoutePolicy::new()
    } else {
        RoutePolicy::new().sample_rate(0.0)
    };
    let provider = tracer_provider(spanprof);
    let _profiler = spanprof.then(|| {
        spanprof::Profiler::builder()
            .sampling(if mode == "labels-only" {
                spanprof::Sampling::LabelsOnly
            } else {
                spanprof::Sampling::InProcess
            })
            .start()
            .expect("profiler")
    });
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("command")))
        .with(spanprof.then(|| SpanProfileLayer::new().profile_roots("apply", policy)))
        .init();
    if spanprof {
        spanprof::install_runtime_hooks(&mut builder);
    }
    let rt = builder.build().expect("runtime");
    rt.block_on(async {
        let senders: Vec<_> = (0..CONNECTIONS)
            .map(|c| {
                let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(1024);
                tokio::spawn(
                    async move {
                        let mut acc = 0u64;
                        while let Some(key) = rx.recv().await {
                            acc ^= apply(key).await;
                        }
                        std::hint::black_box(acc);
                    }
                    .instrument(tracing::info_span!("run", connection = c)),
                );
                tx
            })
            .collect();
        // Warm-up, then the rounds.
        pace(&senders, rate, 1.0).await;
        for _ in 0..rounds {
            let cpu = spanprof::stats::process_cpu_time();
            let n = pace(&senders, rate, secs).await;
            let ns = (spanprof::stats::process_cpu_time() - cpu).as_nanos();
            println!("{ns} {n}");
        }
    });
    drop(rt);
    let _ = provider.shutdown();
}

/// Sends commands at `rate` a second for `secs` seconds, round robin; returns how
/// many were sent.
async fn pace(senders: &[tokio::sync::mpsc::Sender<u64>], rate: f64, secs: f64) -> u64 {
    let start = tokio::time::Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent = 0u64;
    loop {
        let now = tick.tick().await;
        if now >= end {
            return sent;
        }
        let due = ((now - start).as_secs_f64() * rate) as u64;
        while sent < due {
            let c = &senders[sent as usize % senders.len()];
            if c.send(sent).await.is_err() {
                return sent;
            }
            sent += 1;
        }
    }
}
