//! Memory under label cardinality: many distinct spans per second, 1 % hot, for a
//! sustained period (compressed: faster than real time), with the store's resident
//! memory bound at its default (64 MiB).
//!
//! `cargo run --release -p spanprof-bench --bin memory -- --json [--seconds 60] [--rate 50000]`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spanprof_bench::{arg, print_json};
use spanprof_workloads::BURNERS;

fn rss_mib() -> f64 {
    spanprof_bench::proc_status_kib("VmRSS:") as f64 / 1024.0
}

fn main() {
    let seconds: u64 = arg("--seconds").map_or(60, |s| s.parse().expect("--seconds N"));
    let rate: u64 = arg("--rate").map_or(50_000, |s| s.parse().expect("--rate N"));
    let profiler = spanprof::Profiler::builder().start().expect("profiler");
    let rss_start = rss_mib();
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let (stop, made) = (stop.clone(), made.clone());
            std::thread::spawn(move || {
                spanprof::register_current_thread();
                let per_thread = rate / 2;
                let start = Instant::now();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Pace to the rate; each span does a little CPU work.
                    let due = start + Duration::from_nanos(i * 1_000_000_000 / per_thread);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    i += 1;
                    let l = spanprof_bench::request_labels(
                        u128::from(t) << 96 | u128::from(i),
                        t << 48 | i,
                        i % 20,
                        i.is_multiple_of(100),
                    );
                    let _g = l.enter();
                    BURNERS[(i % 8) as usize].1(1_500 + (i % 7) * 200);
                    made.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut rss_max = rss_start;
    let mut bytes_max = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(500));
        rss_max = rss_max.max(rss_mib());
        bytes_max = bytes_max.max(profiler.store().stats().bytes);
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    profiler.flush();
    let store = profiler.store().stats();
    let sampler = profiler.sampler_stats();
    let elapsed = start.elapsed().as_secs_f64();
    let spans = made.load(Ordering::Relaxed);
    print_json(serde_json::json!({
        "seconds": elapsed,
        "spans": spans,
        "spans_per_second": spans as f64 / elapsed,
        "rss_start_mib": rss_start,
        "rss_max_mib": rss_max,
        "rss_growth_mib": rss_max - rss_start,
        "store_bytes_max_mib": bytes_max as f64 / 1048576.0,
        "store_bound_mib": spanprof::defaults::DEFAULT_MAX_BYTES as f64 / 1048576.0,
        "store_spans": store.spans,
        "store_stacks": store.stacks,
        "spans_evicted": store.spans_evicted,
        "stacks_dropped": store.stacks_dropped,
        "samples": sampler.samples,
        "dropped_ring_full": sampler.dropped_ring_full,
        "dropped_backlog": sampler.dropped_backlog,
        "interned_names": spanprof::stats::intern_stats().names,
    }));
    profiler.stop();
}
