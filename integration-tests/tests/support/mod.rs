//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use spanprof_bench::Outcome;

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

pub mod web;
