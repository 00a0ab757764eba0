//! Stress: allocation-, mutex- and syscall-heavy code sampled at the highest rate for
//! tens of seconds while threads are created and destroyed throughout. No crash, no
//! deadlock, and no timer or file descriptor left behind. A watchdog turns a
//! deadlock into a failure with a diagnostic instead of a hung CI job.

#[path = "../support/mod.rs"]
mod support;

use std::io::Write;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spanprof::{Hotness, Profiler, SpanLabels};
use support::{open_fds, perf_event_fds, posix_timers};

fn churn(shared: Arc<Mutex<Vec<u64>>>, id: u64, until: Instant) {
    spanprof::register_current_thread();
    let labels = SpanLabels::builder()
        .span_id(id)
        .span_name("stress")
        .hot(if id.is_multiple_of(2) {
            Hotness::Sampled
        } else {
            Hotness::Cold
        })
        .build();
    let _g = labels.enter();
    let mut devnull = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap();
    let mut rounds = 0u64;
    // At least one round, however late a loaded machine starts this thread.
    while rounds == 0 || Instant::now() < until {
        let v: Vec<String> = (0..200).map(|i| format!("{id}-{i}")).collect();
        shared.lock().unwrap().push(v.len() as u64);
        devnull.write_all(b"spanprof").unwrap();
        let _ = std::fs::metadata("/proc/self/status").unwrap();
        std::thread::sleep(Duration::from_micros(200));
        rounds += 1;
        if shared.lock().unwrap().len() > 10_000 {
            shared.lock().unwrap().clear();
        }
    }
    assert!(rounds > 0);
}

/// The test's run time (20 s of stress) plus room for a loaded machine: past it
/// the test is hung, not slow.
const WATCHDOG: Duration = Duration::from_secs(180);

/// What the watchdog prints before aborting: the phase the test was in, and
/// every thread of the process with its state and where the kernel has it waiting.
fn diagnostic(phase: &str) -> String {
    let mut out = format!("stress test hung in phase {phase:?} after {WATCHDOG:?}; threads:\n");
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            let p = t.path();
            let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
            let stat = read("stat");
            // `pid (comm) state ...`: the state is the first field after the name.
            let state = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .next();
            out += &format!(
                "  {} {:?} state {} wchan {}\n",
                t.file_name().to_string_lossy(),
                read("comm").trim(),
                state.unwrap_or("?"),
                read("wchan")
            );
        }
    }
    out
}

/// Aborts the process with [`diagnostic`] unless the test reports done within
/// [`WATCHDOG`]; phases are reported as the test goes.
fn watchdog(phases: Receiver<&'static str>) {
    let deadline = Instant::now() + WATCHDOG;
    let mut phase = "start";
    loop {
        match phases.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok("done") | Err(RecvTimeoutError::Disconnected) => return,
            Ok(p) => phase = p,
            Err(RecvTimeoutError::Timeout) => {
                eprintln!("{}", diagnostic(phase));
                std::process::abort();
            }
        }
    }
}

#[test]
fn stress_threads_come_and_go_under_max_rate() {
    let (phase, phases): (Sender<&'static str>, _) = std::sync::mpsc::channel();
    let dog = std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || watchdog(phases))
        .unwrap();
    // tokio creates a process-wide socket pair for its signal driver with the first
    // runtime and keeps it: make it exist before counting.
    drop(
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap(),
    );
    let fds_before = open_fds();
    let targets_before = support::fd_targets();
    let timers_before = posix_timers();
    let profiler = Profiler::builder().high_hz(4000).start().expect("profiler");
    phase.send("stress").unwrap();
    let shared = Arc::new(Mutex::new(Vec::new()));
    let end = Instant::now() + Duration::from_secs(20);
    let mut id = 0;
    let mut spawned = 0;

    // A tokio runtime whose blocking threads come and go as well.
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder
        .worker_threads(2)
        .max_blocking_threads(8)
        .thread_keep_alive(Duration::from_millis(50))
        .enable_all()
        .build()
        .unwrap();

    while Instant::now() < end {
        let batch: Vec<_> = (0..4)
            .map(|_| {
                id += 1;
                spawned += 1;
                let shared = shared.clone();
                let until = Instant::now() + Duration::from_millis(100 + (id % 5) * 40);
                let tid = id;
                std::thread::spawn(move || churn(shared, tid, until))
            })
            .collect();
        rt.block_on(async {
            let tasks: Vec<_> = (0..4)
                .map(|i| {
                    spanprof::spawn_blocking(move || {
                        let v: Vec<u64> = (0..50_000).map(|x| x * i).collect();
                        v.iter().sum::<u64>()
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        for t in batch {
            t.join().expect("stress thread panicked");
        }
    }
    phase.send("runtime drop").unwrap();
    drop(rt);
    phase.send("flush").unwrap();
    profiler.flush();
    let stats = profiler.sampler_stats();
    // All stress threads are gone: nothing of theirs may remain armed. The profiler
    // holds one perf event of its own while it runs with them.
    let own = usize::from(profiler.capabilities().mechanism == spanprof::Mechanism::PerfEvent);
    assert_eq!(perf_event_fds(), own, "perf event fds leaked");
    assert_eq!(posix_timers(), timers_before, "POSIX timers leaked");
    phase.send("stop").unwrap();
    profiler.stop();
    assert_eq!(perf_event_fds(), 0, "perf event fds left open at stop");
    assert!(spawned > 100, "only {spawned} threads");
    assert!(stats.samples > 1000, "{stats:?}");
    // Runtime threads finish exiting (and drop the runtime's epoll and eventfd) a
    // moment after `drop(rt)` returns: wait for the count to settle, not for a leak.
    let settle = Instant::now() + Duration::from_secs(5);
    while open_fds() != fds_before && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        open_fds(),
        fds_before,
        "file descriptors leaked: before {targets_before:?}, after {:?}",
        support::fd_targets()
    );
    assert_eq!(posix_timers(), timers_before);
    let after = profiler.sampler_stats();
    assert_eq!(after.threads, 0, "{after:?}");
    phase.send("done").unwrap();
    dog.join().unwrap();
}
