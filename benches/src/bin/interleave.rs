//! Hot work next to cold work: one thread runs a hot span and a cold span in turns,
//! in polls of 50, 200 and 1000 µs of CPU (cold polls three quarters as long), and
//! the CPU estimate of each span (`SpanLabels::cpu_ns`: its samples' weights) is
//! compared with the CPU it used. Several rounds per poll length; prints the
//! median, min and max of estimate / actual per span.
//!
//! `cargo run --release -p spanprof-bench --bin interleave -- [--rounds 5] [--hot-ms 1000] [--hz 1000] --json`

use serde_json::json;
use spanprof_bench::{arg, print_json};
use spanprof_workloads::Interleaving;

fn summary(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(f64::total_cmp);
    json!({
        "median": v[v.len() / 2],
        "min": v[0],
        "max": v[v.len() - 1],
    })
}

fn main() {
    let rounds: usize = arg("--rounds").map_or(5, |s| s.parse().expect("--rounds N"));
    let hot_ms: u64 = arg("--hot-ms").map_or(1000, |s| s.parse().expect("--hot-ms N"));
    let hz: u32 = arg("--hz").map_or(1000, |s| s.parse().expect("--hz N"));
    let profiler = spanprof::Profiler::builder()
        .high_hz(hz)
        .start()
        .expect("start profiler");
    let mechanism = profiler.capabilities().mechanism;
    let mut results = Vec::new();
    for (i, poll_us) in [50u64, 200, 1000].into_iter().enumerate() {
        let mut hot = Vec::new();
        let mut cold = Vec::new();
        let mut hot_samples = 0;
        for round in 0..rounds {
            let o = Interleaving {
                hot_poll_us: poll_us,
                cold_poll_us: poll_us * 3 / 4,
                hot_cpu_ms: hot_ms,
            }
            .run(&profiler, 0x1E_0000 + (i * 1000 + round) as u64 * 2);
            hot.push(o.hot_ratio);
            cold.push(o.cold_ratio);
            hot_samples += o.hot_samples;
            eprintln!(
                "{poll_us} us polls, round {round}: hot {:.3} cold {:.3}",
                o.hot_ratio, o.cold_ratio
            );
        }
        results.push(json!({
            "poll_us": poll_us,
            "hot_estimate_over_actual": summary(hot),
            "cold_estimate_over_actual": summary(cold),
            "hot_samples_per_round": hot_samples / rounds as u64,
        }));
    }
    let stats = profiler.sampler_stats();
    profiler.stop();
    print_json(json!({
        "mechanism": mechanism.as_str(),
        "high_hz": hz,
        "rounds": rounds,
        "hot_cpu_ms_per_round": hot_ms,
        "results": results,
        "high_rate_in_cold": stats.high_rate_in_cold,
        "superseded": stats.superseded,
    }));
}
