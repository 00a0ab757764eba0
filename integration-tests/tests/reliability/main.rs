//! Issue 6's reliability suite: the profiler does not break a production service.
//! Start/stop cycles, runtime shutdown while sampling, fork+exec from a sampled
//! process, system calls interrupted by the profiling signal, a label flood, deep
//! recursion, code without frame pointers, and no secrets in labels.

#[path = "../support/mod.rs"]
mod support;

use std::io::Read;
use std::time::{Duration, Instant};

use spanprof::{Hotness, Profiler, SpanLabels, StoreConfig};
use spanprof_bench::BURNERS;

/// Whether this process has a handler installed for SIGPROF (`SigCgt` bit 26).
fn sigprof_caught() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("SigCgt:")).unwrap();
    let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
    mask & (1 << (27 - 1)) != 0
}

fn hot(span: u64, name: &str) -> SpanLabels {
    SpanLabels::builder()
        .span_id(span)
        .span_name(name)
        .hot(Hotness::Sampled)
        .build()
}

fn burn_cpu(ms: u64, class: usize) {
    let start = spanprof::thread_cpu_time();
    while spanprof::thread_cpu_time() - start < Duration::from_millis(ms) {
        BURNERS[class].1(2_000);
    }
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
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        spanprof::register_current_thread();
        while let Ok(Some(span)) = rx.recv() {
            let l = hot(span, "cycle");
            let _g = l.enter();
            burn_cpu(40, 0);
            done_tx.send(()).unwrap();
        }
    });
    for cycle in 0..20u64 {
        let profiler = Profiler::builder().high_hz(4000).start().expect("start");
        assert!(sigprof_caught());
        tx.send(Some(1000 + cycle)).unwrap();
        done_rx.recv().unwrap();
        profiler.flush();
        let p = profiler
            .store()
            .span(1000 + cycle)
            .expect("samples in every cycle");
        assert!(
            p.sample_count() >= 20,
            "cycle {cycle}: {}",
            p.sample_count()
        );
        profiler.stop();
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
}

#[test]
fn runtime_shutdown_while_sampling() {
    let _s = support::serial();
    let profiler = Profiler::builder().high_hz(4000).start().expect("start");
    for round in 0..5u64 {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        spanprof::install_runtime_hooks(&mut builder);
        let rt = builder.worker_threads(2).enable_all().build().unwrap();
        for t in 0..8u64 {
            let l = hot(round * 100 + t, "busy");
            rt.spawn(spanprof::WithSpanLabels::with_span_labels(
                async move {
                    loop {
                        BURNERS[1].1(5_000);
                        tokio::task::yield_now().await;
                    }
                },
                l,
            ));
            rt.spawn_blocking(|| burn_cpu(50, 2));
        }
        std::thread::sleep(Duration::from_millis(150));
        // Dropped mid-flight: tasks cancelled, workers and blocking threads exit.
        rt.shutdown_timeout(Duration::from_secs(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    profiler.flush();
    let stats = profiler.sampler_stats();
    assert!(stats.samples > 500, "{stats:?}");
    assert_eq!(
        stats.threads, 0,
        "every runtime thread deregistered: {stats:?}"
    );
    assert_eq!(support::perf_event_fds(), 0);
    profiler.stop();
}

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
            let _g = l.enter();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                BURNERS[3].1(5_000);
            }
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
    for i in 0..40 {
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c").arg("i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done; echo done; grep -c . /proc/self/timers 2>/dev/null || echo 0");
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
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("done"), "child {i} ran to the end");
        // The child has no POSIX timers: nothing samples it.
        assert_eq!(lines.next(), Some("0"), "child {i} inherited timers");
        burn_cpu(5, 3);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    burner.join().unwrap();
    spanprof::deregister_current_thread();
    assert!(profiler.sampler_stats().samples > 100);
    profiler.stop();
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
        tid_tx.send(spanprof::current_tid()).unwrap();
        let (mut reads, mut interrupted) = (0u64, 0u64);
        let mut buf = [0u8; 16];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => reads += 1,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => interrupted += 1,
                Err(e) => panic!("read: {e}"),
            }
        }
        (reads, interrupted)
    });
    let tid = tid_rx.recv().unwrap();
    let mut sent = 0;
    for round in 0..200 {
        std::thread::sleep(Duration::from_millis(2));
        for _ in 0..5 {
            if spanprof::send_profiling_signal_for_test(tid) {
                sent += 1;
            }
        }
        if round % 10 == 0 {
            writer.write_all(b"x").unwrap();
        }
    }
    drop(writer);
    let (reads, interrupted) = blocked.join().unwrap();
    assert!(sent > 500, "{sent} signals sent");
    assert_eq!(
        interrupted, 0,
        "EINTR reached the application ({sent} signals, {reads} reads)"
    );
    assert_eq!(reads, 20);
    profiler.stop();
}

#[test]
fn a_label_flood_keeps_memory_bounded() {
    let _s = support::serial();
    let cfg = StoreConfig {
        max_spans: 1_000,
        ..StoreConfig::default()
    };
    let profiler = Profiler::builder()
        .high_hz(4000)
        .store(cfg)
        .start()
        .expect("start");
    let rss_before = rss_kib();
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            std::thread::spawn(move || {
                spanprof::register_current_thread();
                for i in 0..500_000u64 {
                    // A million distinct span ids in all, each polled briefly.
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
    let stats = profiler.store().stats();
    let rss_after = rss_kib();
    profiler.stop();
    assert!(stats.spans <= 1_000, "{stats:?}");
    assert!(stats.spans_evicted > 1_000, "{stats:?}");
    assert!(stats.bytes <= spanprof::DEFAULT_MAX_BYTES, "{stats:?}");
    assert!(
        rss_after.saturating_sub(rss_before) < 96 * 1024,
        "resident memory grew {} KiB",
        rss_after - rss_before
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
    std::thread::spawn({
        let l = l.clone();
        move || {
            spanprof::register_current_thread();
            let _g = l.enter();
            // glibc is built without frame pointers: memcpy and memset of large
            // buffers keep the thread inside it most of the time.
            let src = vec![7u8; 8 << 20];
            let mut dst = vec![0u8; 8 << 20];
            let end = Instant::now() + Duration::from_secs(2);
            while Instant::now() < end {
                dst.copy_from_slice(&src);
                dst.fill(std::hint::black_box(3));
            }
        }
    })
    .join()
    .unwrap();
    profiler.flush();
    let p = profiler.store().span(40).expect("samples");
    profiler.stop();
    assert!(p.sample_count() > 1000);
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
