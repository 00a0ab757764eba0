//! The signal handler never allocates: a counting global allocator sees no
//! allocator call from inside the handler over at least 100 000 samples taken while
//! the sampled code itself allocates heavily.

use std::time::{Duration, Instant};

use spanprof::{HandlerAllocCounter, Hotness, Profiler, SpanLabels};

#[global_allocator]
static ALLOC: HandlerAllocCounter = HandlerAllocCounter::new();

#[test]
fn handler_allocates_nothing_over_100k_samples() {
    let profiler = Profiler::builder().high_hz(4000).start().expect("profiler");
    let target = 100_000;
    let deadline = Instant::now() + Duration::from_secs(120);
    let threads: Vec<_> = (0..2)
        .map(|t| {
            std::thread::spawn(move || {
                spanprof::register_current_thread();
                let labels = SpanLabels::builder()
                    .span_id(100 + t)
                    .span_name("alloc-heavy")
                    .hot(Hotness::Sampled)
                    .build();
                let _g = labels.enter();
                let mut keep: Vec<Vec<u8>> = Vec::new();
                while Instant::now() < deadline {
                    for i in 0..1000 {
                        keep.push(vec![i as u8; 64 + (i % 512)]);
                    }
                    keep.clear();
                    if spanprof::Profiler::current()
                        .is_some_and(|p| p.sampler_stats().samples >= target)
                    {
                        break;
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = profiler.sampler_stats();
    profiler.stop();
    assert!(stats.samples >= target, "only {} samples", stats.samples);
    assert!(
        ALLOC.total() > 1_000_000,
        "the workload should allocate a lot"
    );
    assert_eq!(
        ALLOC.in_handler(),
        0,
        "allocator called from the signal handler"
    );
}
