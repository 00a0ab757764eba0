//! Issue 6's reliability suite: the profiler does not break a production service.
//! Start/stop cycles, runtime shutdown while sampling, fork+exec from a sampled
//! process, system calls interrupted by the profiling signal, a label flood, deep
//! recursion, code without frame pointers, and no secrets in labels.

#[path = "../support/mod.rs"]
mod support;

use std::io::Read;
use std::time::{Duration, Instant};

use spanprof::stats::SamplerStats;
use spanprof::{Hotness, Profiler, SpanLabels, StoreConfig};
use spanprof_workloads::BURNERS;

/// Whether this process has a handler installed for SIGPROF (`SigCgt` bit 26).
fn sigprof_caught() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("SigCgt:")).unwrap();
    let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
    mask & (1 << (libc_sigprof() - 1)) != 0
}

/// Whether SIGPROF's bit is set in the `field` mask line of a `/proc/<pid>/status`.
fn sigprof_in(status: &str, field: &str) -> bool {
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
    mask & (1 << (libc_sigprof() - 1)) != 0
}

/// SIGPROF's number on Linux.
fn libc_sigprof() -> u32 {
    27
}

/// Samples expected at `hz` over `cpu` of hot work.
fn expected(cpu: Duration, hz: u32) -> u64 {
    (cpu.as_secs_f64() * f64::from(hz)) as u64
}

// Floors on sample counts, as fractions of `expected`. Intervals are exponential,
// so a count is Poisson (at the 160 of one 40 ms cycle, one standard deviation is
// 8 %). Two losses come on top, measured here at 4 kHz in these unoptimised builds
// while other tests share the two cores: the handler's own time, which the re-armed
// perf period does not count (quiet cycles take 130-150 of 160); and perf signals
// lost when they coincide with a pending baseline tick (one `SIGPROF` is kept), each
// leaving the event disarmed until the next tick, up to 10 ms of CPU: contended
// cycles took 26-75 of 160, whole tests 38-76 % of expected. A broken high rate
// shows as the baseline's count, 2.5 % of expected (99 of 4 000 Hz), or as nothing.
/// One 40 ms cycle: four times what the baseline alone would give.
const CYCLE_FLOOR: f64 = 0.1;
/// Sums over many cycles or a long burn, where contended stretches average out.
const AGGREGATE_FLOOR: f64 = 0.35;

#[track_caller]
fn assert_floor(what: &str, samples: u64, expected: u64, floor: f64, stats: &SamplerStats) {
    assert!(
        samples as f64 >= expected as f64 * floor,
        "{what}: {samples} samples, under {floor} of the {expected} expected: {stats:?}"
    );
}

/// Runs `f`, failing if it took longer than `deadline` (a generous bound on a
/// call whose behaviour is to return in bounded time).
#[track_caller]
fn within<T>(what: &str, deadline: Duration, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    assert!(
        took <= deadline,
        "{what} took {took:?}, over its deadline of {deadline:?}"
    );
    out
}

fn hot(span: u64, name: &str) -> SpanLabels {
    SpanLabels::builder()
        .span_id(span)
        .span_name(name)
        .hot(Hotness::Sampled)
        .build()
}

/// Burns at least `ms` of this thread's CPU; returns how much it burned.
fn burn_cpu(ms: u64, class: usize) -> Duration {
    let start = spanprof::stats::thread_cpu_time();
    while spanprof::stats::thread_cpu_time() - start < Duration::from_millis(ms) {
        BURNERS[class].1(2_000);
    }
    spanprof::stats::thread_cpu_time() - start
}

/// The drain thread sleeps its whole interval unless a ring fills: a ring reaching
/// half its capacity wakes it from the signal handler, so a long interval (here the
/// 10 s maximum) loses nothing to full rings while it saves the wake-ups.
#[test]
fn a_ring_half_full_is_drained_before_the_interval() {
    let _s = support::serial();
    let profiler = Profiler::builder()
        .high_hz(1000)
        .ring_capacity(64)
        .drain_interval(Duration::from_secs(10))
        .start()
        .expect("profiler");
    let burn = std::thread::spawn(|| {
        spanprof::register_current_thread();
        let labels = hot(70, "ring_filler");
        let _g = labels.enter();
        burn_cpu(600, 0)
    });
    let cpu = burn.join().unwrap();
    // No flush: whatever reaches the store came through the drain thread, whose 10 s
    // interval is not over (the collector may take a moment more to symbolize them).
    // A 1 kHz burn of 600 ms writes over 150 samples even at the timer's 250 Hz: two
    // fills of a 64-slot ring at least.
    let waited = Instant::now();
    let mut drained = 0;
    while waited.elapsed() < Duration::from_secs(5) {
        drained = profiler.store().stats().samples;
        if drained >= 32 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = profiler.sampler_stats();
    assert!(
        drained >= 32,
        "only {drained} samples reached the store within 5 s of a {cpu:?} hot burn \
         with a 64-slot ring: {stats:?}"
    );
    profiler.stop();
}

/// A profiler whose high rate (1 kHz) runs on perf events, which the tests of the
/// pause at a span's end need.
fn perf_profiler_at_1khz() -> Profiler {
    let profiler = Profiler::builder().high_hz(1000).start().expect("profiler");
    assert_eq!(
        profiler.capabilities().mechanism,
        spanprof::Mechanism::PerfEvent,
        "this test needs perf events (kernel.perf_event_paranoid <= 2)"
    );
    profiler
}

/// This thread's voluntary context switches: how often it blocked.
fn voluntary_switches() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .map(|n| n.trim().parse().unwrap())
        .unwrap()
}

/// The kernel turns its perf scheduling hooks on when the system's first per-thread
/// event opens, and waits for an RCU grace period to do so (8 to 25 ms here); it
/// turns them off a second after the last one closes. So a thread's first hot poll,
/// which opens its event, blocked its worker for that long when no event had been
/// open for a second: the example's first checkout after an idle start got a
/// long-poll warning. The profiler now holds one event from start to stop.
#[test]
fn the_first_hot_poll_after_a_quiet_second_does_not_block() {
    let _s = support::serial();
    let profiler = perf_profiler_at_1khz();
    // Past the kernel's one-second delay before it turns the hooks off.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        support::perf_event_fds(),
        1,
        "the profiler holds one perf event while it runs"
    );
    let blocked = std::thread::spawn(|| {
        spanprof::register_current_thread();
        let labels = hot(90, "first_hot");
        let before = voluntary_switches();
        let g = labels.enter();
        let after = voluntary_switches();
        drop(g);
        after - before
    })
    .join()
    .unwrap();
    assert_eq!(blocked, 0, "the first hot push blocked its thread");
    profiler.stop();
    assert_eq!(support::perf_event_fds(), 0, "perf fds closed at stop");
}

/// Hot work whose span ends pauses its thread's perf event, so the cold work after it
/// takes no high-rate signal: each such signal costs a delivery and a re-arm (about
/// 30 µs on a KVM guest) for no sample, and the overhead benchmark's `hot10` server
/// took 0.7 of them per hot request before they were paused.
#[test]
fn hot_work_that_ends_leaves_no_high_rate_signal_in_cold_work() {
    let _s = support::serial();
    let profiler = perf_profiler_at_1khz();
    std::thread::spawn(|| {
        spanprof::register_current_thread();
        for i in 0..20 {
            // A hot poll arms the event at its push; the span then ends.
            let labels = hot(80 + i, "short_hot");
            drop(labels.enter());
            drop(labels);
            // 5 ms of cold CPU: five mean high-rate intervals.
            burn_cpu(5, 1);
        }
    })
    .join()
    .unwrap();
    // Before the fix, each of the 20 cold burns took one. Now only an interval that
    // runs out inside an iteration's own few µs with the event on (between the push
    // and the span's end, which is not hot work) can land one: rare, not never.
    let stats = profiler.sampler_stats();
    assert!(
        stats.high_rate_in_cold <= 3,
        "high-rate signals landed in cold work after hot spans had ended: {stats:?}"
    );
    profiler.stop();
}

/// Hot spans that end leave the perf event exactly as the kernel's own one-shot arming
/// does: after any number of them, hot work that stays open and is then left for
/// cold work draws at most one high-rate signal there (the one that finds it cold and
/// turns the event off), not a stream of them.
#[test]
fn ended_hot_spans_do_not_leave_the_event_firing_in_cold_work() {
    let _s = support::serial();
    let profiler = perf_profiler_at_1khz();
    let p = profiler.clone();
    let cold_signals = std::thread::spawn(move || {
        spanprof::register_current_thread();
        for i in 0..20 {
            let labels = hot(90 + i, "short_hot");
            drop(labels.enter());
        }
        // Hot work whose span stays open, polled once, then 50 ms of cold CPU.
        let open = hot(120, "open_hot");
        drop(open.enter());
        let before = p.sampler_stats().high_rate_in_cold;
        burn_cpu(50, 1);
        let cold = p.sampler_stats().high_rate_in_cold - before;
        drop(open);
        cold
    })
    .join()
    .unwrap();
    let stats = profiler.sampler_stats();
    assert!(
        cold_signals <= 2,
        "{cold_signals} high-rate signals in 50 ms of cold work after an open hot span: {stats:?}"
    );
    profiler.stop();
}

#[test]
fn start_stop_cycles_leave_nothing_behind() {
    let _s = support::serial();
    let timers = support::posix_timers();
    assert!(
        !sigprof_caught(),
        "nothing handles SIGPROF before the first start"
    );
    // A long-lived registered thread across all cycles, as a runtime worker would be.
    let (tx, rx) = std::sync::mpsc::channel::<Option<u64>>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Duration>();
    let worker = std::thread::spawn(move || {
        spanprof::register_current_thread();
        while let Ok(Some(span)) = rx.recv() {
            let l = hot(span, "cycle");
            let _g = l.enter();
            done_tx.send(burn_cpu(40, 0)).unwrap();
        }
    });
    let (mut total, mut total_expected) = (0, 0);
    for cycle in 0..20u64 {
        let profiler = Profiler::builder().high_hz(4000).start().expect("start");
        assert!(sigprof_caught());
        let dropped = profiler.sampler_stats().dropped_ring_full;
        tx.send(Some(1000 + cycle)).unwrap();
        let cpu = done_rx.recv().unwrap();
        profiler.flush();
        let p = profiler
            .store()
            .span(1000 + cycle)
            .expect("samples in every cycle");
        let stats = profiler.sampler_stats();
        // Samples a late drain dropped (counted) were taken all the same.
        let samples = p.sample_count() + stats.dropped_ring_full - dropped;
        // The burn stops at its first check past 40 ms, checks microseconds apart:
        // CPU measured beyond that is the signal handler's own, which no sample
        // covers (seen once on a loaded machine: 183 ms for a 40 ms burn).
        let cpu = cpu.min(Duration::from_millis(41));
        let expected = expected(cpu, profiler.capabilities().effective_high_hz);
        assert_floor(
            &format!("cycle {cycle}"),
            samples,
            expected,
            CYCLE_FLOOR,
            &stats,
        );
        total += samples;
        total_expected += expected;
        within("Profiler::stop", STOP_DEADLINE, || profiler.stop());
        assert!(
            !sigprof_caught(),
            "cycle {cycle}: SIGPROF action restored at stop"
        );
        assert_eq!(
            support::perf_event_fds(),
            0,
            "cycle {cycle}: perf fds closed at stop"
        );
        assert_eq!(
            support::posix_timers(),
            timers,
            "cycle {cycle}: timers deleted at stop"
        );
    }
    tx.send(None).unwrap();
    worker.join().unwrap();
    assert_floor(
        "all cycles",
        total,
        total_expected,
        AGGREGATE_FLOOR,
        &SamplerStats::default(),
    );
}

/// A generous deadline for `Profiler::stop` (disarm, drain, symbolize what is
/// left, join the collector): it takes milliseconds once the symbolizer is warm.
const STOP_DEADLINE: Duration = Duration::from_secs(10);

#[test]
fn runtime_shutdown_while_sampling() {
    let _s = support::serial();
    let profiler = Profiler::builder().high_hz(4000).start().expect("start");
    let hot_cpu_ns = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut labels = Vec::new();
    const SHUTDOWN: Duration = Duration::from_secs(5);
    for round in 0..5u64 {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        spanprof::install_runtime_hooks(&mut builder);
        let rt = builder.worker_threads(2).enable_all().build().unwrap();
        for t in 0..8u64 {
            let l = hot(round * 100 + t, "busy");
            labels.push(l.clone());
            let hot_cpu_ns = hot_cpu_ns.clone();
            rt.spawn(spanprof::WithSpanLabels::with_span_labels(
                async move {
                    loop {
                        let start = spanprof::stats::thread_cpu_time();
                        BURNERS[1].1(5_000);
                        let burned = spanprof::stats::thread_cpu_time() - start;
                        hot_cpu_ns.fetch_add(
                            burned.as_nanos() as u64,
                            std::sync::atomic::Ordering::Relaxed,
                        );
                        tokio::task::yield_now().await;
                    }
                },
                l,
            ));
            rt.spawn_blocking(|| burn_cpu(50, 2));
        }
        std::thread::sleep(Duration::from_millis(150));
        // Dropped mid-flight: tasks cancelled, workers and blocking threads exit.
        // Every thread exits on its own well before the timeout: a shutdown that
        // takes the whole timeout left threads behind (a hook that blocks their
        // exit, a registration that never ends).
        within(
            "runtime shutdown_timeout",
            SHUTDOWN - Duration::from_millis(500),
            || rt.shutdown_timeout(SHUTDOWN),
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    profiler.flush();
    let stats = profiler.sampler_stats();
    // The burners' own CPU inside the labelled polls (the polls' other work is
    // sampled under the same labels too, so this expects less than is sampled),
    // against the samples of those labels. A short burn (60-400 ms of CPU): the
    // cycle floor.
    let hot_cpu = Duration::from_nanos(hot_cpu_ns.load(std::sync::atomic::Ordering::Relaxed));
    let samples: u64 = labels.iter().map(SpanLabels::cpu_samples).sum();
    let hz = profiler.capabilities().effective_high_hz;
    assert_floor(
        "hot tasks",
        samples,
        expected(hot_cpu, hz),
        CYCLE_FLOOR,
        &stats,
    );
    assert_eq!(
        stats.threads, 0,
        "every runtime thread deregistered: {stats:?}"
    );
    assert_eq!(
        support::perf_event_fds(),
        1,
        "the runtime's threads closed their perf events; the profiler's own is left"
    );
    within("Profiler::stop", STOP_DEADLINE, || profiler.stop());
}

/// What an exec'd child inherited that concerns the profiler: its own
/// `/proc/self/status` and open file descriptors, read by `/bin/sh` itself (a
/// builtin `read` loop, so nothing forks in between).
const CHILD_REPORT: &str = r#"i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done
while read -r line; do case "$line" in Sig*|ShdPnd*) echo "$line";; esac; done < /proc/self/status
for fd in /proc/self/fd/*; do echo "fd $(readlink "$fd")"; done
n=0; while read -r line; do case "$line" in ID:*) n=$((n+1));; esac; done < /proc/self/timers; echo "timers $n"
echo done"#;

#[test]
fn fork_and_exec_from_a_sampled_process() {
    let _s = support::serial();
    let profiler = Profiler::builder().high_hz(4000).start().expect("start");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let burner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            spanprof::register_current_thread();
            let l = hot(7, "parent");
            let start = spanprof::stats::thread_cpu_time();
            {
                let _g = l.enter();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    BURNERS[3].1(5_000);
                }
            }
            (spanprof::stats::thread_cpu_time() - start, l)
        })
    };
    // The sampled thread forks too: `uid` makes std fork + exec (not posix_spawn).
    let uid = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .map(|s| s.parse::<u32>().unwrap())
        })
        .unwrap();
    spanprof::register_current_thread();
    let l = hot(8, "spawner");
    let _g = l.enter();
    assert!(support::posix_timers() > 0, "the forking thread is armed");
    for i in 0..40 {
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c").arg(CHILD_REPORT);
        if i % 2 == 0 {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        }
        let out = cmd.output().expect("spawn");
        assert!(
            out.status.success(),
            "child {i}: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.lines().last(),
            Some("done"),
            "child {i} ran to the end: {text}"
        );
        // Nothing of the parent's sampling reached the exec'd child: SIGPROF is
        // neither ignored, blocked nor pending there (the profiler passes SIGPROF
        // through SIG_IGN at stop, and its handler runs with it blocked), no perf
        // event descriptor leaked through exec, no POSIX timer.
        for field in ["SigIgn:", "SigBlk:", "SigPnd:", "ShdPnd:"] {
            assert!(
                !sigprof_in(&text, field),
                "child {i}: SIGPROF in {field}\n{text}"
            );
        }
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("fd ") && l.contains("perf_event")),
            "child {i} inherited perf event descriptors:\n{text}"
        );
        assert!(
            text.lines().any(|l| l == "timers 0"),
            "child {i} has POSIX timers:\n{text}"
        );
        burn_cpu(5, 3);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (burner_cpu, burner_labels) = burner.join().unwrap();
    spanprof::deregister_current_thread();
    profiler.flush();
    // The burner burns hot for the whole test (about a second of CPU); the
    // spawner's CPU goes mostly to forking and waiting, so it only has to be sampled.
    let stats = profiler.sampler_stats();
    let hz = profiler.capabilities().effective_high_hz;
    assert_floor(
        "burner",
        burner_labels.cpu_samples(),
        expected(burner_cpu, hz),
        AGGREGATE_FLOOR,
        &stats,
    );
    assert!(l.cpu_samples() > 0, "the spawner was sampled: {stats:?}");
    within("Profiler::stop", STOP_DEADLINE, || profiler.stop());
}

#[test]
fn system_calls_interrupted_by_the_signal_are_restarted() {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let _s = support::serial();
    let profiler = Profiler::builder().high_hz(4000).start().expect("start");
    // A sampled thread blocks in `read` on a socket; SIGPROF is sent to it while it
    // waits (the CPU-time timers cannot do that on their own: a blocked thread uses
    // no CPU, so the test sends the signal itself). With SA_RESTART the read resumes;
    // without, it would fail with EINTR.
    let (mut writer, mut reader) = UnixStream::pair().unwrap();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let blocked = std::thread::spawn(move || {
        spanprof::register_current_thread();
        let l = hot(20, "blocked-read");
        let _g = l.enter();
        tid_tx.send(spanprof_core::current_tid()).unwrap();
        // Bytes, not reads: two writes can arrive before one read takes them.
        let (mut bytes, mut interrupted) = (0u64, 0u64);
        let mut buf = [0u8; 16];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => bytes += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => interrupted += 1,
                Err(e) => panic!("read: {e}"),
            }
        }
        (bytes, interrupted)
    });
    let tid = tid_rx.recv().unwrap();
    let mut sent = 0;
    for round in 0..200 {
        std::thread::sleep(Duration::from_millis(2));
        for _ in 0..5 {
            if spanprof_core::testing::send_profiling_signal(tid) {
                sent += 1;
            }
        }
        if round % 10 == 0 {
            writer.write_all(b"x").unwrap();
        }
    }
    drop(writer);
    let (bytes, interrupted) = blocked.join().unwrap();
    assert!(sent > 500, "{sent} signals sent");
    assert_eq!(
        interrupted, 0,
        "EINTR reached the application ({sent} signals, {bytes} bytes read)"
    );
    assert_eq!(bytes, 20, "every byte written was read");
    profiler.stop();
}

/// What the flood test allows resident memory to grow by beyond the profiler's
/// configured bounds: the allocator's per-thread arenas and the pages it keeps
/// after frees (glibc returns little of a fragmented heap), the two threads'
/// stacks and sample rings. Measured: 2.9-4.8 MiB of growth in all, the bounded
/// parts included; a leak of 1 KiB per sample (about 11 MiB here) fails.
const FLOOD_SLACK_KIB: u64 = 6 * 1024;

#[test]
fn a_label_flood_keeps_memory_bounded() {
    let _s = support::serial();
    // Small bounds, so that the flood reaches them and a leak beside them shows.
    let mut cfg = StoreConfig::default();
    cfg.max_spans = 1_000;
    cfg.max_bytes = 2 << 20;
    let profiler = Profiler::builder()
        .high_hz(4000)
        .store(cfg)
        .cache_bytes(2 << 20)
        .start()
        .expect("start");
    let flood = |spans: u64| {
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                std::thread::spawn(move || {
                    spanprof::register_current_thread();
                    for i in 0..spans {
                        let l = SpanLabels::builder()
                            .trace_id(u128::from(t) << 64 | u128::from(i))
                            .span_id(t << 32 | i | 1)
                            .span_name("flood")
                            .hot(Hotness::Sampled)
                            .build();
                        let _g = l.enter();
                        BURNERS[4].1(300);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        profiler.flush();
    };
    // The same code once, so that what is measured is the flood, not the
    // symbolizer's first parse of this binary's debug information.
    flood(20_000);
    let rss_before = rss_kib();
    // A million distinct span ids in all, each polled briefly.
    flood(500_000);
    let stats = profiler.store().stats();
    let memory = profiler.memory_stats();
    let rss_after = rss_kib();
    within("Profiler::stop", STOP_DEADLINE, || profiler.stop());
    assert!(stats.spans <= 1_000, "{stats:?}");
    assert!(stats.spans_evicted > 1_000, "{stats:?}");
    assert!(stats.bytes <= 2 << 20, "{stats:?}");
    for (what, cache) in [
        ("stack cache", memory.stack_cache),
        ("symbol cache", memory.symbol_cache),
        ("labels cache", memory.labels_cache),
    ] {
        assert!(cache.bytes <= cache.max_bytes, "{what}: {memory:?}");
    }
    let bound_kib = memory.bound_bytes() as u64 / 1024 + FLOOD_SLACK_KIB;
    let grew = rss_after.saturating_sub(rss_before);
    eprintln!("resident memory grew {grew} KiB; bounds {bound_kib} KiB with slack; {memory:?}");
    assert!(
        grew <= bound_kib,
        "resident memory grew {grew} KiB, over the configured bounds plus slack ({bound_kib} KiB): {memory:?}"
    );
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap()
}

#[inline(never)]
fn recurse(depth: u32) -> u64 {
    if depth == 0 {
        burn_cpu(300, 5);
        return 1;
    }
    std::hint::black_box(recurse(depth - 1)) + 1
}

#[test]
fn deep_recursion_is_truncated_and_marked() {
    let _s = support::serial();
    let profiler = Profiler::builder().high_hz(4000).start().expect("start");
    let l = hot(30, "deep");
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn({
            let l = l.clone();
            move || {
                spanprof::register_current_thread();
                let _g = l.enter();
                recurse(2_000)
            }
        })
        .unwrap()
        .join()
        .unwrap();
    profiler.flush();
    let p = profiler.store().span(30).expect("samples");
    let stats = profiler.sampler_stats();
    profiler.stop();
    assert!(stats.truncated > 0, "{stats:?}");
    let marked = p
        .samples
        .iter()
        .filter(|s| {
            s.stack
                .last()
                .is_some_and(|f| f.function.starts_with("[truncated"))
        })
        .count();
    assert!(marked > 0, "truncated stacks end in a marker frame");
}

#[test]
fn code_without_frame_pointers_is_sampled_safely() {
    let _s = support::serial();
    let profiler = Profiler::builder().high_hz(4000).start().expect("start");
    let l = hot(40, "libc");
    let cpu = std::thread::spawn({
        let l = l.clone();
        move || {
            spanprof::register_current_thread();
            let _g = l.enter();
            // glibc is built without frame pointers: memcpy and memset of large
            // buffers keep the thread inside it most of the time.
            let src = vec![7u8; 8 << 20];
            let mut dst = vec![0u8; 8 << 20];
            // Two seconds of this thread's CPU, however busy the machine.
            let start = spanprof::stats::thread_cpu_time();
            while spanprof::stats::thread_cpu_time() - start < Duration::from_secs(2) {
                dst.copy_from_slice(&src);
                dst.fill(std::hint::black_box(3));
            }
            spanprof::stats::thread_cpu_time() - start
        }
    })
    .join()
    .unwrap();
    profiler.flush();
    let p = profiler.store().span(40).expect("samples");
    let stats = profiler.sampler_stats();
    let expected = expected(cpu, profiler.capabilities().effective_high_hz);
    profiler.stop();
    assert_floor("libc", p.sample_count(), expected, AGGREGATE_FLOOR, &stats);
    // Inside glibc, and its caller recovered: the frame right after the libc leaf is
    // the function that called memcpy or memset (`copy_from_slice`, `fill`, or
    // `from_elem` for the buffers), not the closure above it, where the frame-pointer
    // walk alone lands (glibc leaves the frame pointer at the caller's frame record).
    let in_libc: Vec<_> = p
        .samples
        .iter()
        .filter(|s| s.stack.first().is_some_and(|f| in_glibc(&f.function)))
        .collect();
    let libc_ns: u64 = in_libc.iter().map(|s| s.cpu_ns).sum();
    let with_caller_ns: u64 = in_libc
        .iter()
        .filter(|s| {
            s.stack.get(1).is_some_and(|f| {
                ["copy_from_slice", "fill", "from_elem"]
                    .iter()
                    .any(|c| f.function.contains(c))
            })
        })
        .map(|s| s.cpu_ns)
        .sum();
    assert!(libc_ns > p.cpu_ns() / 2, "{:?}", p.top_functions(5));
    assert!(
        with_caller_ns * 10 >= libc_ns * 9,
        "caller recovered for {with_caller_ns} of {libc_ns} ns in libc: {:?}",
        in_libc
            .iter()
            .take(3)
            .map(|s| &s.stack[..3.min(s.stack.len())])
            .collect::<Vec<_>>()
    );
}

/// A frame in glibc's copy and fill code: `[libc.so.6]` where its symbols are
/// stripped (Debian's), else its `memcpy`/`memmove`/`memset` variants.
fn in_glibc(function: &str) -> bool {
    function.starts_with("[libc")
        || ["memcpy", "memmove", "memset"]
            .iter()
            .any(|m| function.contains(m))
}

#[test]
fn labels_never_carry_paths_queries_or_headers() {
    let _s = support::serial();
    let profiler = Profiler::builder().high_hz(4000).start().expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let app = axum::Router::new()
            .route(
                "/cart/{id}",
                axum::routing::get(|| async {
                    support::web::burn_blocking(30, BURNERS[6].1).to_string()
                }),
            )
            .layer(
                spanprof_tower::ProfileCorrelationLayer::builder()
                    .default_policy(spanprof_tower::RoutePolicy::new().sample_rate(1.0))
                    .profiler(profiler.clone())
                    .build()
                    .unwrap(),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        for path in [
            "/cart/secret-id-4111111111111111?token=hunter2&email=a@b.c",
            "/nowhere/secret-id-4111111111111111?token=hunter2",
        ] {
            let (status, _) = support::web::http_get(
                &format!("http://{addr}{path}"),
                &[
                    ("authorization", "Bearer hunter2"),
                    ("cookie", "session=secret-cookie"),
                    ("traceparent", "00-hunter2-secret-01"),
                ],
            )
            .await;
            assert!(status == 200 || status == 404);
        }
    });
    profiler.flush();
    let whole = profiler.store().process(Duration::from_secs(600));
    let pprof = spanprof::pprof::encode(&whole);
    profiler.stop();
    let routes: Vec<String> = whole
        .samples
        .iter()
        .filter_map(|s| s.labels.as_ref())
        .flat_map(|l| [l.route.to_string(), l.span_name.to_string()])
        .collect();
    assert!(routes.iter().any(|r| r == "/cart/{id}"), "{routes:?}");
    for secret in [
        "hunter2",
        "4111111111111111",
        "secret-cookie",
        "a@b.c",
        "token=",
    ] {
        assert!(
            !routes.iter().any(|r| r.contains(secret)),
            "{secret} in labels: {routes:?}"
        );
        assert!(
            !pprof.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret} in the pprof output"
        );
    }
}
