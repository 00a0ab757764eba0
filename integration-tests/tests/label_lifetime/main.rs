//! Labels live exactly as long as they may be read (issue 9.1).
//!
//! The signal handler reads the label record of whatever is in the interrupted
//! thread's slot. tokio runs a task's terminate hook inside its final poll, before
//! the after-poll hook, so the inheritance table must not free the record there: the
//! slot still points at it until the after-poll hook restores it.
//!
//! The test binary's global allocator (`QuarantineAlloc`) poisons every freed block and keeps it
//! in quarantine, so a read of a freed label record shows up as a sample whose ids
//! are the poison pattern (or kills the process when the handler follows a poisoned
//! pointer): either way the test fails.
//!
//! Only the task hooks (`--cfg tokio_unstable`) have a terminate hook, so without
//! that cfg there is nothing here to test.
#![cfg(tokio_unstable)]

use std::sync::atomic::{AtomicU64, Ordering};

use spanprof_core::testing::{POISON_BYTE, QuarantineAlloc};

#[global_allocator]
static ALLOC: QuarantineAlloc = QuarantineAlloc::new();

const POISON_U64: u64 = u64::from_ne_bytes([POISON_BYTE; 8]);

#[test]
fn fire_and_forget_tasks_never_expose_a_freed_label_record() {
    use std::time::{Duration, Instant};

    use spanprof::{Hotness, Profiler, SpanLabels, WithSpanLabels};

    // The chains run after their request ended, so they are cold (detached) work:
    // the baseline timer is what samples them, as often as the kernel tick allows.
    // (A high-rate sample landing there is dropped after reading the record, which
    // leaves no trace to check.)
    let profiler = Profiler::builder()
        .baseline_hz(1000)
        .high_hz(spanprof::defaults::MAX_HIGH_HZ)
        .start()
        .expect("profiler");
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder.worker_threads(2).enable_all().build().unwrap();
    ALLOC.set_poisoning(true);
    let chains = AtomicU64::new(0);
    let span_base = 0x1000_0000u64;
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(4);
        let mut n = 0u64;
        while Instant::now() < deadline {
            // A batch of requests; each spawns a fire-and-forget chain of tasks and
            // returns at once, so only the inheritance table keeps its labels alive
            // and the chain's last task frees them in its final poll.
            let mut requests = Vec::new();
            for _ in 0..64 {
                n += 1;
                let labels = SpanLabels::builder()
                    .trace_id(u128::from(n))
                    .span_id(span_base + n)
                    .span_name("fire-and-forget")
                    .route("/fire")
                    .hot(Hotness::Sampled)
                    .build();
                requests.push(tokio::spawn(
                    async move {
                        tokio::spawn(async {
                            std::hint::black_box(spin(2_000));
                            tokio::spawn(async {
                                std::hint::black_box(spin(2_000));
                            });
                        });
                    }
                    .with_span_labels(labels),
                ));
            }
            for r in requests {
                r.await.unwrap();
            }
            chains.fetch_add(64, Ordering::Relaxed);
            tokio::task::yield_now().await;
        }
        // Let the last chains finish before the runtime shuts down: tokio runs the
        // spawn hook of a task spawned during shutdown after it has already shut the
        // task down (and run its terminate hook), which would leave that one entry in
        // the table (docs/architecture.md, "Known limits").
        tokio::time::sleep(Duration::from_millis(100)).await;
    });
    drop(rt);
    ALLOC.set_poisoning(false);
    profiler.flush();
    let profile = profiler.store().process(Duration::from_secs(3600));
    profiler.stop();

    // A read of a freed record yields poisoned ids, or (the state byte reads as
    // ended) a detached sample whose route id is poison, which resolves to no name.
    let mut labelled = 0u64;
    let mut poisoned = 0u64;
    for s in &profile.samples {
        let Some(l) = &s.labels else { continue };
        if l.span_id == POISON_U64
            || l.trace_id == u128::from_ne_bytes([POISON_BYTE; 16])
            || l.root_span_id == POISON_U64
            || &*l.route == spanprof::defaults::OVERFLOW_NAME
        {
            poisoned += s.count;
        } else if &*l.route == "/fire" {
            labelled += s.count;
        }
    }
    let stats = spanprof::stats::inheritance_stats();
    assert!(
        ALLOC.poisoned() > 10_000,
        "the quarantine saw too few frees to mean anything"
    );
    assert!(
        labelled >= 300,
        "too few labelled samples ({labelled}) to judge; {} chains",
        chains.load(Ordering::Relaxed)
    );
    assert_eq!(
        poisoned, 0,
        "{poisoned} samples read a freed label record ({labelled} read live ones)"
    );
    assert_eq!(stats.live, 0, "inherited labels released: {stats:?}");
}

#[inline(never)]
fn spin(iters: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..iters {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x ^= i;
    }
    x
}
