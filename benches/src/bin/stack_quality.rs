//! Stack quality: for each pattern of `spanprof_workloads::stacks` (work inside glibc,
//! Rust's formatting, serde_json, regex, the C zlib), the share of its samples whose
//! stack holds the pattern's caller and reaches the thread's first frame, and the
//! mean depth; with the DWARF unwinder and the frame-pointer walk side by side in
//! one run, at 1 kHz. Prints one JSON object.
//!
//! `cargo run --release -p spanprof-bench --bin stack_quality -- [--seconds 2] [--json] [--floor 0.995]`
//!
//! The build's own frame pointers are in the output (`frame_pointers`); run it from
//! a build without them (`RUSTFLAGS="-C force-frame-pointers=no"`, its own target
//! directory) for the other column. With `--floor F` it exits 1 when a pattern's
//! share of whole stacks under DWARF unwinding is below `F`.
//!
//! With `--pprof FILE` it scores a pprof profile instead (e.g. the checkout
//! example's `/debug/spanprof/profile?seconds=10`): the share of its sampled CPU whose
//! stack reaches a thread's first frame.

use std::time::Duration;

use spanprof::{Profiler, Unwinding};
use spanprof_bench::{arg, print_json};
use spanprof_workloads::stacks::{self, STACK_PATTERNS, StackQuality};

fn quality_json(q: &StackQuality) -> serde_json::Value {
    serde_json::json!({
        "samples": q.samples,
        "caller_found": q.share(q.with_caller),
        "rooted": q.share(q.rooted),
        "whole": q.share(q.whole),
        "mean_depth": q.mean_depth,
    })
}

/// Every pattern under one unwinder; returns (name, score) per pattern.
fn run_patterns(
    unwinding: Unwinding,
    cpu: Duration,
) -> (Option<bool>, Vec<(&'static str, StackQuality)>) {
    let profiler = Profiler::builder()
        .baseline_hz(99)
        .high_hz(1000)
        .unwinding(unwinding)
        .start()
        .expect("profiler");
    let frame_pointers = profiler.capabilities().frame_pointers;
    assert_eq!(
        profiler.capabilities().unwinding,
        unwinding,
        "unwinder in force"
    );
    let mut out = Vec::new();
    for (i, p) in STACK_PATTERNS.iter().enumerate() {
        let span = 1 + i as u64;
        stacks::run_labelled(p, span, cpu);
        profiler.flush();
        let profile = profiler.store().span(span).expect("samples of the pattern");
        let q = stacks::score(&profile, p.caller);
        eprintln!(
            "{:<15} {:<20} {:>5} samples, caller {:5.1} %, rooted {:5.1} %, {:4.1} frames",
            unwinding.as_str(),
            p.name,
            q.samples,
            100.0 * q.share(q.with_caller),
            100.0 * q.share(q.rooted),
            q.mean_depth
        );
        out.push((p.name, q));
    }
    let stats = profiler.sampler_stats();
    if unwinding == Unwinding::DwarfCfi {
        eprintln!(
            "DWARF rule cache: {} frames, {:.2} % missed",
            stats.unwind_frames,
            100.0 * stats.unwind_cache_misses as f64 / stats.unwind_frames.max(1) as f64
        );
    }
    profiler.stop();
    (frame_pointers, out)
}

/// `--pprof FILE`: the share of the profile's first sample value (CPU) whose stack
/// reaches a thread's first frame, and which functions the rest end in.
fn score_pprof(path: &str) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let p = spanprof::pprof::decode(&bytes).expect("a pprof profile");
    let name_of_location = |id: u64| -> Vec<String> {
        p.location
            .iter()
            .find(|l| l.id == id)
            .map(|l| {
                l.line
                    .iter()
                    .rev()
                    .map(|line| {
                        p.function
                            .iter()
                            .find(|f| f.id == line.function_id)
                            .map(|f| p.string_table[f.name as usize].clone())
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let (mut all, mut rooted) = (0i64, 0i64);
    let mut ends: std::collections::BTreeMap<String, i64> = Default::default();
    for s in &p.sample {
        let v = s.value.first().copied().unwrap_or(0);
        let outer: Vec<String> = s
            .location_id
            .iter()
            .rev()
            .take(2)
            .flat_map(|&id| name_of_location(id))
            .collect();
        all += v;
        if outer.iter().take(3).any(|f| stacks::is_thread_root(f)) {
            rooted += v;
        } else {
            *ends
                .entry(outer.first().cloned().unwrap_or_default())
                .or_default() += v;
        }
    }
    let mut ends: Vec<_> = ends.into_iter().collect();
    ends.sort_by_key(|(_, v)| -v);
    print_json(serde_json::json!({
        "profile": path,
        "samples": p.sample.len(),
        "rooted": rooted as f64 / all.max(1) as f64,
        "unrooted_ends": ends.iter().take(8).map(|(f, v)| serde_json::json!({
            "outermost_function": f, "share": *v as f64 / all.max(1) as f64,
        })).collect::<Vec<_>>(),
    }));
}

fn main() {
    if let Some(path) = arg("--pprof") {
        return score_pprof(&path);
    }
    let secs: f64 = arg("--seconds").map_or(2.0, |s| s.parse().expect("--seconds S"));
    let floor: Option<f64> = arg("--floor").map(|s| s.parse().expect("--floor F"));
    let cpu = Duration::from_secs_f64(secs);
    let (frame_pointers, dwarf) = run_patterns(Unwinding::DwarfCfi, cpu);
    let (_, walk) = run_patterns(Unwinding::FramePointers, cpu);
    let table = |rows: &[(&str, StackQuality)]| -> serde_json::Map<String, serde_json::Value> {
        rows.iter()
            .map(|(n, q)| ((*n).to_owned(), quality_json(q)))
            .collect()
    };
    print_json(serde_json::json!({
        "frame_pointers": frame_pointers,
        "cpu_seconds_per_pattern": secs,
        "hz": 1000,
        "dwarf": table(&dwarf),
        "frame_pointer_walk": table(&walk),
    }));
    if let Some(floor) = floor {
        let below: Vec<_> = dwarf
            .iter()
            .filter(|(_, q)| q.share(q.whole) < floor)
            .map(|(n, q)| format!("{n}: {:.2} %", 100.0 * q.share(q.whole)))
            .collect();
        if !below.is_empty() {
            eprintln!(
                "whole stacks under the floor of {:.1} %: {below:?}",
                100.0 * floor
            );
            std::process::exit(1);
        }
    }
}
