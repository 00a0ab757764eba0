//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use spanprof_workloads::Outcome;

/// Asserts the attribution goals of issue 2 on one run, with the numbers in the message.
#[track_caller]
pub fn assert_attribution(o: &Outcome, what: &str) {
    assert!(
        o.samples >= 200,
        "{what}: too few class samples to judge: {o:?}"
    );
    let correct = o.frac(o.correct);
    assert!(
        correct >= 0.99,
        "{what}: only {:.4} of class samples carry their class's labels: {o:?}",
        correct
    );
}

/// Asserts that tasks really moved between worker threads.
#[track_caller]
pub fn assert_migrated(o: &Outcome, what: &str) {
    assert!(
        o.tasks_migrated * 2 >= o.tasks,
        "{what}: fewer than half the tasks ran on more than one thread: {o:?}"
    );
    assert!(o.migrated_polls > 0, "{what}: no poll migrated: {o:?}");
}

/// Open file descriptors of this process that are perf events.
pub fn perf_event_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains("perf_event"))
        .count()
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

/// POSIX timers of this process (`/proc/self/timers`).
pub fn posix_timers() -> usize {
    std::fs::read_to_string("/proc/self/timers")
        .expect("read /proc/self/timers")
        .lines()
        .filter(|l| l.starts_with("ID:"))
        .count()
}

/// Where tests write artifacts (kept after the run for inspection).
pub fn artifact_dir() -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("test-artifacts");
    std::fs::create_dir_all(&dir).expect("create artifact dir");
    dir
}

/// Serialises tests that start the process-wide profiler when the harness runs them
/// as threads of one process (`cargo test`); nextest runs each in its own process.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub mod receiver;
pub mod web;

/// From async code: [`labelled_burn`] on a blocking thread, then a flush of
/// `profiler` so the samples are in its store.
pub async fn burn_and_flush(
    profiler: &spanprof::Profiler,
    cpu_ms: u64,
) -> [spanprof::SpanLabels; 2] {
    let (_, labels) = tokio::task::spawn_blocking(move || labelled_burn(cpu_ms))
        .await
        .unwrap();
    let pr = profiler.clone();
    tokio::task::spawn_blocking(move || pr.flush())
        .await
        .unwrap();
    labels
}

/// Two threads burning CPU under span labels: class 0 hot (high rate), class 1
/// cold (baseline). Returns the two threads' CPU time in ns and their labels.
pub fn labelled_burn(cpu_ms: u64) -> (u64, [spanprof::SpanLabels; 2]) {
    let labels = [
        spanprof_workloads::class_labels(0, 0, true),
        spanprof_workloads::class_labels(1, 1, false),
    ];
    let handles: Vec<_> = labels
        .iter()
        .cloned()
        .enumerate()
        .map(|(class, l)| {
            std::thread::spawn(move || {
                spanprof::register_current_thread();
                let _g = l.enter();
                let start = spanprof::stats::thread_cpu_time();
                while spanprof::stats::thread_cpu_time() - start
                    < std::time::Duration::from_millis(cpu_ms)
                {
                    spanprof_workloads::BURNERS[class].1(5_000);
                }
                (spanprof::stats::thread_cpu_time() - start).as_nanos() as u64
            })
        })
        .collect();
    let cpu = handles.into_iter().map(|h| h.join().unwrap()).sum();
    (cpu, labels)
}

/// Runs `go tool pprof` with `args`; panics with its stderr on failure.
pub fn go_pprof(args: &[&str]) -> String {
    let tmp = artifact_dir().join("pprof-tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out = std::process::Command::new("go")
        .arg("tool")
        .arg("pprof")
        .args(args)
        .env("PPROF_TMPDIR", &tmp)
        .env("HOME", &tmp)
        .output()
        .expect("`go` must be installed (Debian golang-go; scripts/test installs it)");
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The function of the first row of `go tool pprof -top`.
pub fn top_function(top: &str) -> String {
    let mut rows = top
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"));
    rows.next();
    let row = rows.next().expect("a row");
    row.split_whitespace().skip(5).collect::<Vec<_>>().join(" ")
}

/// `Total samples = 2.51s` (or `950ms`) from a `go tool pprof -top` header, in ns.
pub fn total_ns(top: &str) -> u64 {
    let line = top
        .lines()
        .find(|l| l.contains("Total samples = "))
        .unwrap_or_else(|| panic!("no total in {top}"));
    let v = line.split("Total samples = ").nth(1).unwrap();
    duration_ns(v.split_whitespace().next().unwrap())
}

/// A duration as `go tool pprof` prints it (`2.51s`, `950ms`, `40us`, `2mins`), in ns.
pub fn duration_ns(v: &str) -> u64 {
    let (num, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1e6)
    } else if let Some(n) = v.strip_suffix("us") {
        (n, 1e3)
    } else if let Some(n) = v.strip_suffix("mins") {
        (n, 60e9)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e9)
    } else {
        panic!("unit of {v}")
    };
    (num.parse::<f64>().unwrap() * scale) as u64
}

/// A layer that records every event (level and fields) into its log.
pub struct LogCapture(pub std::sync::Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", f.name(), v));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LogCapture {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut f = Fields(format!("{} ", e.metadata().level()));
        e.record(&mut f);
        self.0.lock().unwrap().push(f.0);
    }
}

/// A subscriber that records every event (level and fields) into `logs`.
pub fn capture_logs(logs: std::sync::Arc<Mutex<Vec<String>>>) -> impl tracing::Subscriber {
    use tracing_subscriber::prelude::*;
    tracing_subscriber::registry().with(LogCapture(logs))
}

/// Every event logged in this process, by any thread (the sinks log from theirs): the
/// first call installs [`capture_logs`] as the global subscriber.
pub fn global_logs() -> std::sync::Arc<Mutex<Vec<String>>> {
    static LOGS: std::sync::OnceLock<std::sync::Arc<Mutex<Vec<String>>>> =
        std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = std::sync::Arc::new(Mutex::new(Vec::new()));
        tracing::subscriber::set_global_default(capture_logs(logs.clone()))
            .expect("no other subscriber in this test binary");
        logs
    })
    .clone()
}

/// What each open file descriptor points at (for failure messages).
pub fn fd_targets() -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|t| t.to_string_lossy().into_owned())
        .collect()
}
