//! What spanprof costs a service, next to what the service already runs.
//!
//! One run starts one server **process** per mode, each on a 2-worker tokio runtime
//! serving the same routes (`spanprof_bench::service`): a light JSON API handler
//! (`POST /api/orders`: parse, validate, price, serialize; about 50 µs of CPU) and the
//! checkout example's handler mix (`GET /checkout`, `GET /cart/{id}`). The modes:
//!
//! - `none`: the bare router;
//! - `stack`: the user's existing stack, tower-http's `TraceLayer` and
//!   `tracing-opentelemetry` with the SDK's batch span processor in front of an
//!   in-process exporter that discards (spans are built, queued and batched; no
//!   encoding, no network);
//! - `baseline`: the stack plus spanprof as its docs set it up (`SpanProfileLayer`,
//!   `SpanProfileProcessor`, `ProfileCorrelationLayer` in one `ServiceBuilder` with
//!   `TraceLayer`, sample rate 0, the 99 Hz baseline, the runtime hooks, a Pyroscope
//!   push every 10 s to a local sink);
//! - `hot10`: the same with 10 % of requests hot at 1 kHz;
//! - `pyroscope`: the stack plus pyroscope-rs 2.1.5's agent at 100 Hz, tagging each
//!   request with `tag_wrapper` and pushing to the same sink (its own package,
//!   `benches/anchors/pyroscope-overhead`, given with `--anchor BINARY`).
//!
//! The load comes from a separate process (this binary, `load`), at a fixed
//! **open-loop** rate: a fraction (`--load`, default 0.6) of the saturation
//! throughput of the `stack` server, measured at start with a closed-loop load. Each
//! round sends that load to every server in turn (the order rotates from round to
//! round) and reads each server's process CPU time before and after; the metric is
//! server CPU time per request, with p50/p99 latency (measured from each request's
//! scheduled send time) beside it. Ratios are paired within a round (mode / stack);
//! the JSON reports their median over rounds and a 95 % bootstrap interval of it.
//!
//! With `--concurrent`, each round loads every server at the same time instead, each
//! at 1/n of the rate (n servers): the machine's other load then falls on every mode
//! alike within a round, which narrows the paired ratios (docs/performance.md).
//!
//! With `--restarts K`, the rounds are split into K segments, each on freshly started
//! server processes (the stack's rate is calibrated once): two identical server
//! processes differ by up to ~1.5 % for their whole life, so a single set of
//! processes biases every round alike. The interval then resamples segments, then
//! rounds within them, and the JSON lists each segment's median
//! (`ratio_MODE_segments`).
//!
//! Every server runs from a copy of its executable of its own (in a temporary
//! directory, removed at the end): processes running one file share its code's pages
//! and cache lines, which biased modes sharing the load generator's file against the
//! others by up to 5 % (`Copies`). `--shared-binary` runs them from the files given,
//! as before.
//!
//! With `--compare BINARY` another build of this binary (an earlier commit's) serves
//! `--compare-mode` (default `baseline`) as one more mode, `compare`: a before/after
//! measured side by side, in the same rounds. `--after BINARY` has another build
//! serve `--compare-mode` itself, so that the same two builds can be run again with
//! their places swapped (the servers' places carry a bias of about 1 %). The JSON then has
//! `after_over_before`: per round, that mode's ratio to the stack over `compare`'s,
//! its median and interval (`_lo`, `_hi`) and each set's median (`_segments`).
//!
//! With `--modes baseline,baseline-nospans,baseline-nohooks` it runs `stack` and the
//! listed modes only (`--modes ablations`: every ablation; an unknown name is an error), including ablations of `baseline` (no tracing integration, no
//! `SpanProfileLayer`, no `SpanProfileProcessor`, no runtime hooks) that show where
//! spanprof's cost per request goes; `benches/scripts/callgrind_servers.py` counts the same
//! servers' instructions per function.
//!
//! `cargo run --release -p spanprof-bench --bin overhead -- --json --anchor benches/anchors/pyroscope-overhead/target/release/anchor-pyroscope-overhead [--rounds 15] [--round-secs 2] [--workloads json,checkout] [--plot docs/overhead.png]`

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use spanprof::ProfileScope;
use spanprof::export::{ProfileSource, PyroscopeConfig, PyroscopeExporter};
use spanprof::tower::{
    ProfileCorrelationLayer, RoutePolicy, SpanProfileLayer, SpanProfileProcessor,
};
use spanprof_bench::{arg, flag, print_json, service};
use tower_http::trace::TraceLayer;
use tracing_subscriber::prelude::*;

/// The modes, in the JSON's order; `stack` is the reference of every ratio.
const MODES: [&str; 5] = ["none", "stack", "baseline", "hot10", "pyroscope"];
/// Ablations of `baseline`, for `--modes` (where spanprof's cost per request goes):
/// without the tracing integration (`SpanProfileLayer` and `SpanProfileProcessor`),
/// without `SpanProfileLayer` only, without `SpanProfileProcessor` only, and without
/// the runtime hooks; and `baseline-sampling`, the profiler (99 Hz, hooks, Pyroscope
/// push) with none of the per-request integration: what sampling alone costs.
/// `baseline-passthrough` is `baseline-sampling` with a layer that does nothing in
/// the correlation layer's place (it wraps the response body as that one does).
/// `baseline-sampling-noperf` is `baseline-sampling` without the per-thread perf
/// events (the CPU timer alone). `baseline-disabled` is `baseline-nospans` with every route disabled (the layer
/// names each request and looks up its policy, then labels nothing).
/// `baseline-49hz` and `baseline-19hz` are `baseline` at a lower baseline rate: what
/// the rate, the one setting that scales sampling's cost, buys.
/// `baseline-twolayers` is `baseline` with `TraceLayer` and the correlation layer in
/// two `Router::layer` calls instead of one `tower::ServiceBuilder` (axum boxes each
/// route's service once per call: three allocations a request).
/// `stack-again` is a second server identical to `stack`: an A/A control of the method.
/// `labels-only` is `baseline` without spanprof's sampler (`Sampling::LabelsOnly`, no
/// push): what a service profiled from outside pays (build with `--features
/// otel-thread-ctx` to include OpenTelemetry's thread context).
const ABLATIONS: [&str; 13] = [
    "labels-only",
    "baseline-sampling",
    "baseline-passthrough",
    "baseline-sampling-noperf",
    "baseline-disabled",
    "baseline-nospans",
    "baseline-nolayer",
    "baseline-noprocessor",
    "baseline-nohooks",
    "baseline-49hz",
    "baseline-19hz",
    "baseline-twolayers",
    "stack-again",
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve") => serve(
            &arg("--mode").expect("--mode"),
            &arg("--sink").expect("--sink"),
        ),
        Some("load") => load(),
        Some("handler-cost") => handler_cost(),
        _ => coordinate(),
    }
}

// ---------------------------------------------------------------- the servers

/// `handler-cost`: prints the JSON handler's own CPU time per call (µs), called in a
/// loop on this thread without HTTP or tracing.
fn handler_cost() {
    let bodies: Vec<Vec<u8>> = (0..64)
        .map(|s| serde_json::to_vec(&service::sample_order(s)).unwrap())
        .collect();
    let n = 20_000;
    let t = spanprof::stats::thread_cpu_time();
    for i in 0..n {
        std::hint::black_box(service::handle_order(&bodies[i % 64]).expect("valid order"));
    }
    let us = (spanprof::stats::thread_cpu_time() - t).as_secs_f64() * 1e6 / n as f64;
    let bytes = bodies.iter().map(Vec::len).sum::<usize>() / bodies.len();
    println!("{us:.1} µs of CPU per call, request body {bytes} bytes");
}

fn process_cpu_ns() -> u64 {
    spanprof::stats::process_cpu_time().as_nanos() as u64
}

fn serve(mode: &str, sink: &str) {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    // OVERHEAD_WORKERS=1 (`callgrind_servers.py --workers 1`): one worker, so that no
    // allocation is freed on another thread and the allocator's paths are the same in
    // every mode; under Callgrind, which runs one thread at a time, two workers make
    // the glibc allocator's slow-path share depend on how the threads were scheduled.
    let workers =
        std::env::var("OVERHEAD_WORKERS").map_or(2, |w| w.parse().expect("OVERHEAD_WORKERS"));
    builder.worker_threads(workers).enable_all();
    let app = service::routes();
    if mode == "none" {
        let rt = builder.build().expect("runtime");
        return service::serve(&rt, app, process_cpu_ns);
    }
    if mode == "stack" || mode == "stack-again" {
        let provider = SdkTracerProvider::builder()
            .with_span_processor(service::batch_processor())
            .build();
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("overhead")))
            .init();
        let rt = builder.build().expect("runtime");
        return service::serve(&rt, app.layer(TraceLayer::new_for_http()), process_cpu_ns);
    }
    let rate = match mode {
        "baseline"
        | "baseline-sampling"
        | "baseline-sampling-noperf"
        | "baseline-passthrough"
        | "baseline-disabled"
        | "baseline-nospans"
        | "baseline-nolayer"
        | "baseline-noprocessor"
        | "baseline-nohooks"
        | "baseline-49hz"
        | "baseline-19hz"
        | "baseline-twolayers"
        | "labels-only" => 0.0,
        "hot10" => 0.1,
        other => panic!("unknown mode {other}"),
    };
    let correlate = !mode.starts_with("baseline-sampling") && mode != "baseline-passthrough";
    let spans = correlate && !matches!(mode, "baseline-nospans" | "baseline-disabled");
    let hooks = mode != "baseline-nohooks";
    let processor = spans && mode != "baseline-noprocessor";
    let span_layer = spans && mode != "baseline-nolayer";
    // spanprof as docs/layer.md sets it up, next to the same stack.
    let profiler = spanprof::Profiler::builder()
        .sampling(if mode == "labels-only" {
            spanprof::Sampling::LabelsOnly
        } else {
            spanprof::Sampling::InProcess
        })
        .baseline_hz(match mode {
            "baseline-49hz" => 49,
            "baseline-19hz" => 19,
            _ => 99,
        })
        .high_hz(1000)
        .use_perf_events(mode != "baseline-sampling-noperf")
        // SPANPROF_BASELINE_HZ=1 makes sampling negligible, for counting the request
        // path's instructions under Callgrind (which slows the process fifty-fold and
        // so multiplies the samples each request gets).
        .with_env()
        .expect("SPANPROF_* variables")
        .start()
        .expect("profiler");
    let provider = if processor {
        SdkTracerProvider::builder()
            .with_span_processor(SpanProfileProcessor::batch(service::DiscardingExporter))
            .build()
    } else {
        SdkTracerProvider::builder()
            .with_span_processor(service::batch_processor())
            .build()
    };
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("overhead")))
        .with(span_layer.then(SpanProfileLayer::new))
        .init();
    let mut layer = ProfileCorrelationLayer::builder();
    if mode == "baseline-disabled" {
        // The layer names and looks up every request, then labels none.
        for route in ["/api/orders", "/checkout", "/cart/{id}"] {
            layer = layer.disable_route(route);
        }
    }
    let layer = layer
        .default_policy(RoutePolicy::new().sample_rate(rate))
        .profiler(profiler.clone())
        .build()
        .expect("layer");
    // Labels only: no profile of its own to push.
    let _push = (mode != "labels-only").then(|| {
        PyroscopeExporter::start(
            PyroscopeConfig::new(sink),
            ProfileSource::profiler(&profiler, ProfileScope::LocalRoot),
        )
        .expect("pyroscope push")
    });
    if hooks {
        spanprof::install_runtime_hooks(&mut builder);
    }
    let rt = builder.build().expect("runtime");
    if mode == "baseline-twolayers" {
        service::serve(
            &rt,
            app.layer(layer).layer(TraceLayer::new_for_http()),
            process_cpu_ns,
        );
    } else if correlate {
        // As the docs set it up: one `Router::layer` call, `TraceLayer` outermost.
        let layers = tower::ServiceBuilder::new()
            .layer(TraceLayer::new_for_http())
            .layer(layer);
        service::serve(&rt, app.layer(layers), process_cpu_ns);
    } else if mode == "baseline-passthrough" {
        // A layer that does nothing in the correlation layer's place, wrapping the
        // response body as it does: what axum's per-route layering costs any layer.
        drop(layer);
        let pass = tower::util::MapResponseLayer::new(|r: axum::response::Response| {
            r.map(|body| http_body_util::BodyExt::map_err(body, |e| e))
        });
        service::serve(
            &rt,
            app.layer(pass).layer(TraceLayer::new_for_http()),
            process_cpu_ns,
        );
    } else {
        drop(layer);
        service::serve(&rt, app.layer(TraceLayer::new_for_http()), process_cpu_ns);
    }
    // For diagnosis (the `overhead` parent does not read it): how many signals were
    // samples, and how many perf signals landed in cold work.
    eprintln!("{mode}: {:?}", profiler.sampler_stats());
}

/// A server process and its control channel.
struct Server {
    mode: &'static str,
    child: Child,
    control: ChildStdin,
    answers: BufReader<ChildStdout>,
    url: String,
}

impl Server {
    fn start(mode: &'static str, mut cmd: Command) -> Server {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start the {mode} server: {e}"));
        let control = child.stdin.take().unwrap();
        let mut answers = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        answers.read_line(&mut line).expect("server's port");
        let port: u16 = line
            .trim()
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{mode} server said {line:?}"));
        Server {
            mode,
            child,
            control,
            answers,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// CPU seconds each of the server's live threads has used since it started,
    /// summed by thread name (`/proc/PID/task/*/comm` and `schedstat`): where a
    /// mode's extra CPU goes (request workers, the span exporter, the profiler's
    /// collector, the profile push).
    fn cpu_by_thread(&self) -> std::collections::BTreeMap<String, f64> {
        let mut by_name = std::collections::BTreeMap::<String, f64>::new();
        let dir = format!("/proc/{}/task", self.child.id());
        for task in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = task.path();
            let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            let ns: f64 = std::fs::read_to_string(path.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0.0);
            *by_name.entry(name.trim().to_owned()).or_default() += ns / 1e9;
        }
        by_name
    }

    /// The server process's CPU time so far, in nanoseconds.
    fn cpu_ns(&mut self) -> u64 {
        writeln!(self.control, "cpu").expect("ask the server");
        self.control.flush().expect("ask the server");
        let mut line = String::new();
        self.answers.read_line(&mut line).expect("server's answer");
        line.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{} server said {line:?}", self.mode))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------- the load generator

/// One run of the load generator: requests answered, latency percentiles (µs),
/// errors, and requests not sent because too many were outstanding.
#[derive(Debug, Clone, Copy, Default)]
struct LoadOutcome {
    requests: f64,
    p50_us: f64,
    p99_us: f64,
    errors: f64,
    skipped: f64,
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
fn load() {
    let base = arg("--url").expect("--url");
    let workload = arg("--workload").expect("--workload");
    let secs: f64 = arg("--secs").expect("--secs").parse().expect("--secs S");
    let rate: f64 = arg("--rate").map_or(0.0, |r| r.parse().expect("--rate R"));
    let conc: usize = arg("--concurrency").map_or(0, |c| c.parse().expect("--concurrency C"));
    let bodies: Arc<Vec<Bytes>> = Arc::new(
        (0..64)
            .map(|s| Bytes::from(serde_json::to_vec(&service::sample_order(s)).unwrap()))
            .collect(),
    );
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

fn run_load(
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

// ------------------------------------------------------------------ statistics

/// SplitMix64: a small deterministic generator for the bootstrap.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64 * n as f64) as usize
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if !n.is_multiple_of(2) {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The median of `v` and a 95 % bootstrap interval of it, resampling in two levels
/// when the rounds ran on several sets of server processes (`segment[i]` is round
/// i's): the segments with replacement, then the rounds within each. A process's own
/// bias is then part of the interval, not hidden in it. With one segment this is
/// [`median_ci`]. With few segments (five) such an interval is approximate (and
/// counts the rounds' own spread twice, so it errs wide); the JSON lists each
/// segment's median beside it, and the lowest and highest of five bound the median
/// with about 94 % confidence without any resampling.
fn median_ci_segments(v: &[f64], segment: &[usize]) -> (f64, f64, f64) {
    let k = segment.iter().max().map_or(1, |m| m + 1);
    if k == 1 {
        return median_ci(v);
    }
    const RESAMPLES: usize = 10_000;
    let by_segment: Vec<Vec<f64>> = (0..k)
        .map(|g| {
            v.iter()
                .zip(segment)
                .filter(|(_, s)| **s == g)
                .map(|(x, _)| *x)
                .collect()
        })
        .collect();
    let mut rng = SplitMix64(0x005e_ed0f_0e12_4ead);
    let mut meds: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let mut s = Vec::with_capacity(v.len());
            for _ in 0..k {
                let g = &by_segment[rng.below(k)];
                s.extend((0..g.len()).map(|_| g[rng.below(g.len())]));
            }
            median(&s)
        })
        .collect();
    meds.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| meds[((RESAMPLES - 1) as f64 * p).round() as usize];
    (median(v), q(0.025), q(0.975))
}

/// Median of `v` and the 95 % percentile-bootstrap interval of that median
/// (10 000 resamples of the rounds, with replacement; fixed seed).
fn median_ci(v: &[f64]) -> (f64, f64, f64) {
    const RESAMPLES: usize = 10_000;
    let mut rng = SplitMix64(0x005e_ed0f_0e12_4ead);
    let mut meds: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let s: Vec<f64> = (0..v.len()).map(|_| v[rng.below(v.len())]).collect();
            median(&s)
        })
        .collect();
    meds.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| meds[((RESAMPLES - 1) as f64 * p).round() as usize];
    (median(v), q(0.025), q(0.975))
}

// ------------------------------------------------------------------ the run

/// Figures of one mode on one workload, one entry per round.
#[derive(Default, Clone)]
struct Series {
    cpu_us_per_req: Vec<f64>,
    p50_us: Vec<f64>,
    p99_us: Vec<f64>,
    requests: Vec<f64>,
    errors: f64,
    skipped: f64,
    /// Per thread name, the CPU per request each round spent on those threads.
    by_thread: std::collections::BTreeMap<String, Vec<f64>>,
}

impl Series {
    /// Adds one round of server `s`: its CPU (process and by thread) read `before`
    /// the load and now, divided by the requests the load `o` got answered.
    fn record(
        &mut self,
        s: &mut Server,
        before: (std::collections::BTreeMap<String, f64>, u64),
        o: LoadOutcome,
        round: usize,
        w: &str,
        quiet: bool,
    ) {
        let (threads0, cpu0) = before;
        let cpu = (s.cpu_ns() - cpu0) as f64 / 1e3;
        for (name, t1) in s.cpu_by_thread() {
            let t0 = threads0.get(&name).copied().unwrap_or(0.0);
            self.by_thread
                .entry(name)
                .or_default()
                .push((t1 - t0) * 1e6 / o.requests.max(1.0));
        }
        self.cpu_us_per_req.push(cpu / o.requests.max(1.0));
        self.p50_us.push(o.p50_us);
        self.p99_us.push(o.p99_us);
        self.requests.push(o.requests);
        self.errors += o.errors;
        self.skipped += o.skipped;
        if !quiet {
            eprintln!(
                "round {round:>2} {w:<8} {:<9} {:>7.1} µs CPU/req, p50 {:>6.0} µs, p99 {:>6.0} µs, {} req{}",
                s.mode,
                cpu / o.requests.max(1.0),
                o.p50_us,
                o.p99_us,
                o.requests,
                if o.errors + o.skipped > 0.0 {
                    format!(", {} errors, {} skipped", o.errors, o.skipped)
                } else {
                    String::new()
                }
            );
        }
    }
}

/// Where each server's executable is copied to, so that no two server processes (nor
/// the load generator) run the same file: processes running one file share its
/// code's physical pages, and with them cache lines of code in L2 and L3, which a
/// server running a file of its own does not. Before these copies, every mode but
/// `compare` and `pyroscope` shared the load generator's file, and an A/A run with a
/// byte-identical copy as `compare` read 0.951 (an A/A run that should read 1):
/// the paired before/after figures favoured the newer build by up to 5 %.
struct Copies {
    dir: Option<std::path::PathBuf>,
}

impl Copies {
    fn new(own: bool) -> Copies {
        let dir = own.then(|| {
            let dir = std::env::temp_dir().join(format!("overhead-copies-{}", std::process::id()));
            // A run killed before its end leaves its copies: never serve those.
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("a directory for the servers' executables");
            dir
        });
        Copies { dir }
    }

    /// The file `mode`'s server runs: a copy of `path` of its own, made once.
    fn of(&self, mode: &str, path: &std::path::Path) -> std::path::PathBuf {
        let Some(dir) = &self.dir else {
            return path.to_owned();
        };
        let copy = dir.join(mode);
        if !copy.exists() {
            std::fs::copy(path, &copy).unwrap_or_else(|e| {
                panic!("copying {} to {}: {e}", path.display(), copy.display())
            });
        }
        copy
    }
}

impl Drop for Copies {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn coordinate() {
    let rounds: usize = arg("--rounds").map_or(15, |s| s.parse().expect("--rounds N"));
    let secs: f64 = arg("--round-secs").map_or(2.0, |s| s.parse().expect("--round-secs S"));
    let load_frac: f64 = arg("--load").map_or(0.6, |s| s.parse().expect("--load FRACTION"));
    let workloads: Vec<String> = arg("--workloads")
        .unwrap_or_else(|| "json,checkout".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    let anchor = arg("--anchor").filter(|p| std::path::Path::new(p).exists());
    // Another build of this binary (say, of an earlier commit), run as one more mode,
    // `compare`, serving `--compare-mode` (default `baseline`): a before/after in one run.
    let compare = arg("--compare");
    let compare_mode = arg("--compare-mode").unwrap_or_else(|| "baseline".into());
    // The build that serves `--compare-mode` itself (default: this binary), so that a
    // before/after can be run a second time with the two builds' places swapped.
    let after = arg("--after");
    let quiet = flag("--json");
    let concurrent = flag("--concurrent");
    let restarts: usize = arg("--restarts").map_or(1, |s| s.parse().expect("--restarts K"));
    assert!(
        (1..=rounds).contains(&restarts),
        "--restarts must be 1 to --rounds"
    );
    let exe = std::env::current_exe().unwrap();

    // The sink both profilers push to: answers everything 200 and forgets it.
    let sink_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sink = {
        let listener = sink_rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().fallback(|_body: Bytes| async { "" });
        std::thread::spawn(move || {
            sink_rt.block_on(async move { axum::serve(listener, app).await.unwrap() })
        });
        url
    };

    // `--modes` picks a subset (and the ablations; `ablations` names them all);
    // `stack` always runs, first of the list's order below, as every ratio's
    // reference. A name that is no mode is an error, not a mode left out.
    let picked: Vec<&'static str> = match arg("--modes") {
        None => MODES.to_vec(),
        Some(list) => {
            let asked = |m: &str| {
                list.split(',')
                    .any(|x| x == m || (x == "ablations" && ABLATIONS.contains(&m)))
            };
            if let Some(bad) = list
                .split(',')
                .find(|x| *x != "ablations" && !MODES.contains(x) && !ABLATIONS.contains(x))
            {
                eprintln!(
                    "overhead: --modes: no mode {bad:?}; the modes are {MODES:?}, the \
                     ablations {ABLATIONS:?} (or `ablations` for all of them)"
                );
                std::process::exit(2);
            }
            MODES
                .iter()
                .chain(&ABLATIONS)
                .copied()
                .filter(|m| *m == "stack" || asked(m))
                .collect()
        }
    };
    if after.is_some() && (compare.is_none() || !picked.contains(&compare_mode.as_str())) {
        eprintln!(
            "overhead: --after serves --compare-mode ({compare_mode}) against --compare's build: \
             give --compare, and that mode in --modes"
        );
        std::process::exit(2);
    }
    // Each server runs from a file of its own (see `Copies`), unless `--shared-binary`.
    let copies = Copies::new(!flag("--shared-binary"));
    let stack_at = picked.iter().position(|m| *m == "stack").unwrap();
    assert_eq!(stack_at, usize::from(picked[0] == "none"));
    // Every mode's server, started afresh for each of the `--restarts` segments.
    let start_servers = || -> Vec<Server> {
        let mut servers: Vec<Server> = picked
            .iter()
            .filter_map(|&mode| {
                if mode == "pyroscope" {
                    let path = anchor.as_ref()?;
                    let mut cmd = Command::new(copies.of(mode, path.as_ref()));
                    cmd.args(["--sink", &sink]);
                    return Some(Server::start(mode, cmd));
                }
                let path = match &after {
                    Some(after) if mode == compare_mode => std::path::Path::new(after),
                    _ => exe.as_path(),
                };
                let mut cmd = Command::new(copies.of(mode, path));
                cmd.args(["serve", "--mode", mode, "--sink", &sink]);
                Some(Server::start(mode, cmd))
            })
            .collect();
        if let Some(path) = &compare {
            let mut cmd = Command::new(copies.of("compare", path.as_ref()));
            cmd.args(["serve", "--mode", &compare_mode, "--sink", &sink]);
            servers.push(Server::start("compare", cmd));
        }
        servers
    };
    let warm_up = |servers: &[Server]| {
        for w in &workloads {
            for s in servers {
                run_load(&exe, &s.url, w, 1.0, ("--concurrency", 8.0));
            }
        }
    };
    let mut servers = start_servers();
    if anchor.is_none() {
        eprintln!("no --anchor binary: the pyroscope-rs mode is left out");
    }

    // Warm every server up, then find the stack server's saturation per workload.
    warm_up(&servers);
    let mut rates = Vec::new();
    for w in &workloads {
        let sat = run_load(
            &exe,
            &servers[stack_at].url,
            w,
            3.0,
            ("--concurrency", 32.0),
        );
        let saturation = sat.requests / 3.0;
        let rate = (saturation * load_frac).max(1.0);
        if !quiet {
            eprintln!(
                "{w}: stack saturates at {saturation:.0} req/s; open-loop rate {rate:.0} req/s"
            );
        }
        rates.push((saturation, rate));
    }

    let mut series: Vec<Vec<Series>> =
        vec![vec![Series::default(); servers.len()]; workloads.len()];
    // Which segment (set of server processes) each round ran on.
    let segment_of = |round: usize| round * restarts / rounds;
    for round in 0..rounds {
        if round > 0 && segment_of(round) != segment_of(round - 1) {
            // Fresh processes: two identical servers differ by up to ~1.5 % for as
            // long as they live (layout, placement), so one set of processes biases
            // every round alike; several sets average that out.
            drop(std::mem::take(&mut servers));
            servers = start_servers();
            warm_up(&servers);
        }
        for (wi, w) in workloads.iter().enumerate() {
            let n = servers.len();
            if concurrent {
                // Every server at once, each at 1/n of the rate: whatever else the
                // machine does in this window, every mode shares it.
                let before: Vec<_> = servers
                    .iter_mut()
                    .map(|s| (s.cpu_by_thread(), s.cpu_ns()))
                    .collect();
                let rate = rates[wi].1 / n as f64;
                let outcomes: Vec<LoadOutcome> = std::thread::scope(|scope| {
                    let loads: Vec<_> = servers
                        .iter()
                        .map(|s| {
                            let (exe, url) = (&exe, &s.url);
                            scope.spawn(move || run_load(exe, url, w, secs, ("--rate", rate)))
                        })
                        .collect();
                    loads.into_iter().map(|h| h.join().unwrap()).collect()
                });
                for (si, (o, b)) in outcomes.into_iter().zip(before).enumerate() {
                    let e = &mut series[wi][si];
                    e.record(&mut servers[si], b, o, round, w, quiet);
                }
                continue;
            }
            for k in 0..n {
                let si = (round + k) % n;
                let s = &mut servers[si];
                let before = (s.cpu_by_thread(), s.cpu_ns());
                let o = run_load(&exe, &s.url, w, secs, ("--rate", rates[wi].1));
                series[wi][si].record(s, before, o, round, w, quiet);
            }
        }
    }

    // The median of per-round values `v` as `key`, its interval as `key_lo` and
    // `key_hi`, and each set of processes' median as `key_segments`.
    let insert_median_ci =
        |m: &mut serde_json::Map<String, serde_json::Value>, key: &str, v: &[f64]| {
            let segments: Vec<usize> = (0..v.len()).map(segment_of).collect();
            let (med, lo, hi) = median_ci_segments(v, &segments);
            let per_segment: Vec<f64> = (0..restarts)
                .map(|k| {
                    let in_k: Vec<f64> = v
                        .iter()
                        .zip(&segments)
                        .filter(|(_, sg)| **sg == k)
                        .map(|(x, _)| *x)
                        .collect();
                    median(&in_k)
                })
                .collect();
            m.insert(format!("{key}_segments"), per_segment.into());
            m.insert(key.into(), med.into());
            m.insert(format!("{key}_lo"), lo.into());
            m.insert(format!("{key}_hi"), hi.into());
            (med, lo, hi)
        };
    let mut out = serde_json::Map::new();
    let mut plot_rows = Vec::new();
    for (wi, w) in workloads.iter().enumerate() {
        let mut m = serde_json::Map::new();
        m.insert("saturation_rps".into(), rates[wi].0.into());
        m.insert("rate_rps".into(), rates[wi].1.into());
        let stack = series[wi][stack_at].cpu_us_per_req.clone();
        let mut ratios = Vec::new();
        for (si, s) in servers.iter().enumerate() {
            let e = &series[wi][si];
            let name = s.mode;
            m.insert(
                format!("cpu_per_req_{name}"),
                median(&e.cpu_us_per_req).into(),
            );
            m.insert(format!("p50_us_{name}"), median(&e.p50_us).into());
            m.insert(format!("p99_us_{name}"), median(&e.p99_us).into());
            m.insert(
                format!("requests_per_round_{name}"),
                median(&e.requests).into(),
            );
            m.insert(format!("errors_{name}"), e.errors.into());
            // Where the CPU per request went, by thread name (median over rounds).
            let by_thread: serde_json::Map<String, serde_json::Value> = e
                .by_thread
                .iter()
                .map(|(t, v)| (t.clone(), median(v).into()))
                .collect();
            m.insert(format!("cpu_per_req_by_thread_{name}"), by_thread.into());
            m.insert(format!("skipped_{name}"), e.skipped.into());
            if si == stack_at {
                continue;
            }
            let r: Vec<f64> = e
                .cpu_us_per_req
                .iter()
                .zip(&stack)
                .map(|(a, b)| a / b)
                .collect();
            let (med, lo, hi) = insert_median_ci(&mut m, &format!("ratio_{name}"), &r);
            m.insert(format!("ratio_{name}_rounds"), r.clone().into());
            ratios.push((name, med, lo, hi, r));
        }
        // A before/after run: per round, this build's ratio over the earlier build's,
        // so whatever the machine did in a round cancels out of the quotient.
        let rounds_of = |mode: &str| ratios.iter().find(|r| r.0 == mode).map(|r| &r.4);
        if let (Some(after), Some(before)) = (rounds_of(&compare_mode), rounds_of("compare")) {
            let q: Vec<f64> = after.iter().zip(before).map(|(a, b)| a / b).collect();
            insert_median_ci(&mut m, "after_over_before", &q);
        }
        plot_rows.push((w.clone(), ratios));
        out.insert(w.clone(), m.into());
    }
    // The JSON workload's figures also at the top level, as issue 12 names them.
    if let Some(serde_json::Value::Object(first)) = out.get("json").cloned() {
        for (k, v) in first {
            if (k.starts_with("ratio_")
                || k.starts_with("cpu_per_req_")
                || k.starts_with("after_over_before"))
                && !k.ends_with("_rounds")
            {
                out.insert(k, v);
            }
        }
    }
    out.insert("rounds".into(), rounds.into());
    out.insert("round_secs".into(), secs.into());
    out.insert("load_fraction".into(), load_frac.into());
    out.insert("concurrent".into(), concurrent.into());
    out.insert("restarts".into(), restarts.into());
    out.insert("own_copies".into(), copies.dir.is_some().into());
    // Which build served what, so that a run with the builds' places swapped reads
    // back unambiguously (`after_over_before` is then `--after`'s over `--compare`'s).
    let path_of = |p: Option<&str>| p.map_or(serde_json::Value::Null, |p| p.into());
    out.insert(
        "after_binary".into(),
        after
            .as_deref()
            .map_or_else(|| exe.display().to_string().into(), |p| p.into()),
    );
    out.insert("compare_binary".into(), path_of(compare.as_deref()));
    let ran: Vec<&str> = picked
        .iter()
        .copied()
        .filter(|m| *m != "pyroscope" || anchor.is_some())
        .collect();
    out.insert("modes".into(), ran.into());
    out.insert(
        "cpu_unit".into(),
        "µs of server process CPU per request".into(),
    );
    if let Some(path) = arg("--plot") {
        match plot::draw(&path, &plot_rows) {
            Ok(()) => eprintln!("plot: {path}"),
            Err(e) => eprintln!("plot not drawn: {e}"),
        }
    }
    // Where each server's CPU went over the whole run (warm-up and calibration
    // included), by thread name.
    let threads: serde_json::Map<String, serde_json::Value> = servers
        .iter()
        .map(|s| {
            let by_name: serde_json::Map<String, serde_json::Value> = s
                .cpu_by_thread()
                .into_iter()
                .map(|(k, v)| (k, v.into()))
                .collect();
            (s.mode.to_owned(), by_name.into())
        })
        .collect();
    out.insert("cpu_seconds_by_thread".into(), threads.into());
    drop(servers);
    print_json(out.into());
}

mod plot {
    use plotters::prelude::*;

    type Row = (String, Vec<(&'static str, f64, f64, f64, Vec<f64>)>);

    /// One panel per workload: for each mode, its per-round ratios to the stack
    /// (small dots), their median (a large dot) and its 95 % interval (a bar).
    pub fn draw(path: &str, rows: &[Row]) -> Result<(), String> {
        let font = [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        ]
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or("no TrueType font found (install fonts-dejavu-core)")?;
        let font: &'static [u8] = Box::leak(font.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, font)
            .map_err(|_| "bad font")?;
        let width = 560 * rows.len().max(1) as u32;
        let root = BitMapBackend::new(path, (width, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let areas = root.split_evenly((1, rows.len().max(1)));
        for (area, (workload, ratios)) in areas.iter().zip(rows) {
            let all = ratios
                .iter()
                .flat_map(|r| r.4.iter().copied().chain([r.2, r.3]));
            let (lo, hi) = all
                .filter(|x| x.is_finite())
                .fold((1.0f64, 1.0f64), |(a, b), x| (a.min(x), b.max(x)));
            let pad = (hi - lo).max(0.02) * 0.08;
            let title = format!("{workload}: server CPU per request / user's stack");
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 17))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(55)
                .build_cartesian_2d(-0.5f64..(ratios.len() as f64 - 0.5), (lo - pad)..(hi + pad))
                .map_err(|e| e.to_string())?;
            let names: Vec<&str> = ratios.iter().map(|r| r.0).collect();
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(ratios.len())
                .x_label_formatter(&|x| {
                    let i = x.round();
                    if (x - i).abs() < 0.01 && i >= 0.0 {
                        names
                            .get(i as usize)
                            .map_or(String::new(), |s| s.to_string())
                    } else {
                        String::new()
                    }
                })
                .label_style(("sans-serif", 13))
                .draw()
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(LineSeries::new(
                    [(-0.5, 1.0), (ratios.len() as f64 - 0.5, 1.0)],
                    BLACK.mix(0.5),
                ))
                .map_err(|e| e.to_string())?;
            for (i, (_, med, lo, hi, rounds)) in ratios.iter().enumerate() {
                let x = i as f64;
                let n = rounds.len().max(1) as f64;
                chart
                    .draw_series(rounds.iter().enumerate().map(|(k, &y)| {
                        Circle::new((x - 0.2 + 0.4 * k as f64 / n, y), 2, BLUE.mix(0.4).filled())
                    }))
                    .map_err(|e| e.to_string())?;
                chart
                    .draw_series(LineSeries::new(
                        [(x + 0.28, *lo), (x + 0.28, *hi)],
                        RED.stroke_width(3),
                    ))
                    .map_err(|e| e.to_string())?;
                chart
                    .draw_series([Circle::new((x + 0.28, *med), 5, RED.filled())])
                    .map_err(|e| e.to_string())?;
            }
        }
        root.present().map_err(|e| e.to_string())
    }
}
