//! pprof-rs 0.15 on the same busy 2-thread workload as spanprof's `rate_sweep`, at
//! 99, 250, 1000, 2000 and 4000 Hz, side by side with the workload unprofiled:
//! samples per CPU-second and the throughput ratio. Prints one JSON object.
//!
//! `cd benches/anchors/pprof-capture && cargo run --release -- --json`

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const RATES: &[i32] = &[99, 250, 1000, 2000, 4000];

/// The same xorshift burner as spanprof-workloads' `burn_class_0`/`_1`.
#[inline(never)]
fn burn(iters: u64, k: u64) -> u64 {
    let mut x = k;
    let mut i = 0;
    while i < iters {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x ^= i;
        i += 1;
    }
    black_box(x)
}

/// This thread's CPU time from `/proc/thread-self/stat` (utime + stime), seconds.
fn thread_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn run(secs: f64) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..2u64)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let cpu0 = thread_cpu();
                let mut iters = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    burn(1_000, 0x9e37_79b9_7f4a_7c15 ^ t);
                    iters += 1;
                }
                (iters as f64, thread_cpu() - cpu0)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1))
}

fn main() {
    let secs = 3.0;
    let mut rows = Vec::new();
    for &hz in RATES {
        let (mut ratios, mut captures) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let (bare_iters, bare_cpu) = run(secs);
            let guard = pprof::ProfilerGuardBuilder::default()
                .frequency(hz)
                .blocklist(&["libc", "libgcc", "pthread", "vdso"])
                .build()
                .expect("pprof-rs profiler");
            let (iters, cpu) = run(secs);
            let report = guard.report().build().expect("report");
            drop(guard);
            let samples: isize = report.data.values().sum();
            ratios.push((iters / cpu) / (bare_iters / bare_cpu));
            captures.push(samples as f64 / cpu);
        }
        ratios.sort_by(|a, b| a.total_cmp(b));
        captures.sort_by(|a, b| a.total_cmp(b));
        let (ratio, capture) = (ratios[1], captures[1]);
        eprintln!("{hz:>5} Hz: throughput ratio {ratio:.4}, {capture:.0} samples per CPU-second");
        rows.push(serde_json::json!({
            "requested_hz": hz, "throughput_ratio": ratio,
            "samples_per_cpu_second": capture, "capture_ratio": capture / f64::from(hz),
            "mechanism": "pprof-rs ITIMER_PROF",
        }));
    }
    println!("{}", serde_json::json!({ "profiler": "pprof-rs 0.15", "seconds_per_run": secs, "rates": rows }));
}
