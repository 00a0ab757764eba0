//! Attribution accuracy on migrating tasks.
//!
//! `cargo run --release -p spanprof-bench --bin attribution -- --json [--seconds 10] [--mode wrapper|inherit|joined]`
//!
//! 32 tasks in 8 classes on 2 workers, each class burning CPU in its own function
//! and yielding every ~1 ms. Prints one JSON object (fractions of the samples whose
//! stack contains a class function).

use std::time::Duration;

use spanprof_bench::{arg, flag, print_json};
use spanprof_workloads::{Mode, Workload, run_and_score};

fn main() {
    let seconds: u64 = arg("--seconds").map_or(10, |s| s.parse().expect("--seconds N"));
    let mode = match arg("--mode").as_deref() {
        None | Some("wrapper") => Mode::Wrapper,
        Some("inherit") => Mode::Inherit,
        Some("joined") => Mode::Joined,
        Some(other) => panic!("unknown --mode {other}: wrapper, inherit or joined"),
    };
    let hot = !flag("--baseline");
    let profiler = spanprof::Profiler::builder()
        .start()
        .expect("start profiler");
    let w = Workload {
        duration: Duration::from_secs(seconds),
        mode,
        hot,
        ..Workload::default()
    };
    let o = run_and_score(&w, &profiler, true);
    let stats = profiler.sampler_stats();
    if !flag("--json") {
        eprintln!("{o:?}\n{stats:?}");
    }
    print_json(serde_json::json!({
        "samples": o.samples,
        "correct": o.frac(o.correct),
        "wrong": o.frac(o.wrong),
        "unlabeled": o.frac(o.unlabeled),
        "migrated_polls": if o.polls == 0 { 0.0 } else { o.migrated_polls as f64 / o.polls as f64 },
        "tasks_migrated": o.tasks_migrated,
        "tasks": o.tasks,
        "mode": format!("{mode:?}").to_lowercase(),
        "hot": hot,
        "mechanism": profiler.capabilities().mechanism.as_str(),
        "dropped_ring_full": stats.dropped_ring_full,
        "seconds": seconds,
    }));
    profiler.stop();
}
