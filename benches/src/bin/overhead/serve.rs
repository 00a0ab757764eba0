//! The servers: one process per mode (`overhead serve`), and the run's handles on
//! them ([`Server`], [`Copies`]).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use opentelemetry::trace::TracerProvider as _;
use spanprof::export::{ProfileSource, PyroscopeConfig, PyroscopeExporter};
use spanprof::tower::{ProfileCorrelationLayer, RoutePolicy, SpanProfileLayer};
use spanprof_bench::tracer_provider;
use spanprof_workloads::service;
use tower_http::trace::TraceLayer;
use tracing_subscriber::prelude::*;

/// `handler-cost`: prints the JSON handler's own CPU time per call (µs), called in a
/// loop on this thread without HTTP or tracing.
pub fn handler_cost() {
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

pub fn serve(mode: &str, sink: &str) {
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
        let provider = tracer_provider(false);
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
        "hot100" => 1.0,
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
        // OVERHEAD_DRAIN_MS: the collector's drain interval (default 1 s), to price
        // its batching.
        .drain_interval(std::time::Duration::from_millis(
            std::env::var("OVERHEAD_DRAIN_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1000),
        ))
        // SPANPROF_BASELINE_HZ=1 makes sampling negligible, for counting the request
        // path's instructions under Callgrind (which slows the process fifty-fold and
        // so multiplies the samples each request gets).
        .with_env()
        .expect("SPANPROF_* variables")
        .start()
        .expect("profiler");
    let provider = tracer_provider(processor);
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
            ProfileSource::profiler(&profiler),
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
    let memory = profiler.memory_stats();
    eprintln!(
        "{mode}: symbol cache {:?}; stack cache {:?}",
        memory.symbol_cache, memory.stack_cache
    );
}

/// A server process and its control channel.
pub struct Server {
    pub mode: &'static str,
    child: Child,
    control: ChildStdin,
    answers: BufReader<ChildStdout>,
    pub url: String,
}

impl Server {
    pub fn start(mode: &'static str, mut cmd: Command) -> Server {
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
    pub fn cpu_by_thread(&self) -> std::collections::BTreeMap<String, f64> {
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
    pub fn cpu_ns(&mut self) -> u64 {
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

/// Where each server's executable is copied to, so that no two server processes (nor
/// the load generator) run the same file: processes running one file share its
/// code's physical pages, and with them cache lines of code in L2 and L3, which a
/// server running a file of its own does not. Before these copies, every mode but
/// `compare` and `pyroscope` shared the load generator's file, and an A/A run with a
/// byte-identical copy as `compare` read 0.951 (an A/A run that should read 1):
/// the paired before/after figures favoured the newer build by up to 5 %.
pub struct Copies {
    pub dir: Option<std::path::PathBuf>,
}

impl Copies {
    pub fn new(own: bool) -> Copies {
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
    pub fn of(&self, mode: &str, path: &std::path::Path) -> std::path::PathBuf {
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
