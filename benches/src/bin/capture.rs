//! Capture rate: samples per CPU-second of one busy hot thread, against the rate
//! asked for.
//!
//! `cargo run --release -p spanprof-bench --bin capture -- --hz 1000 --json [--seconds 5] [--timer]`

use std::time::{Duration, Instant};

use spanprof::{Hotness, SpanLabels};
use spanprof_bench::{arg, flag, print_json};
use spanprof_workloads::BURNERS;

fn main() {
    let hz: u32 = arg("--hz").map_or(1000, |s| s.parse().expect("--hz N"));
    let seconds: f64 = arg("--seconds").map_or(5.0, |s| s.parse().expect("--seconds N"));
    let use_perf = !flag("--timer");
    let profiler = spanprof::Profiler::builder()
        .baseline_hz(hz.min(99))
        .high_hz(hz)
        .use_perf_events(use_perf)
        .start()
        .expect("start profiler");
    let caps = profiler.capabilities();
    let labels = SpanLabels::builder()
        .span_id(1)
        .span_name("capture")
        .hot(Hotness::Sampled)
        .build();
    let (cpu, samples) = std::thread::spawn(move || {
        spanprof::register_current_thread();
        let _g = labels.enter();
        let cpu0 = spanprof::stats::thread_cpu_time();
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        while Instant::now() < end {
            BURNERS[0].1(10_000);
        }
        let cpu = spanprof::stats::thread_cpu_time() - cpu0;
        (cpu, labels.cpu_samples())
    })
    .join()
    .expect("burner thread");
    let achieved = samples as f64 / cpu.as_secs_f64();
    print_json(serde_json::json!({
        "requested_hz": hz,
        "achieved_hz": achieved,
        "capture_ratio": achieved / f64::from(hz),
        "mechanism": caps.mechanism.as_str(),
        "samples": samples,
        "cpu_seconds": cpu.as_secs_f64(),
    }));
    profiler.stop();
}
