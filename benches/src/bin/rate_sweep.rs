//! Capture and overhead against the sampling rate: a busy 2-thread workload (all of
//! it hot), at 99, 250, 1000, 2000 and 4000 Hz, each run side by side with the same
//! workload unprofiled. Prints one JSON object; with `--plot FILE.png` also draws
//! overhead (throughput ratio) and capture against the rate, adding the pprof-rs
//! figures of `benches/anchors/pprof-capture` when given `--anchor FILE.json`.
//!
//! `cargo run --release -p spanprof-bench --bin rate_sweep -- --json [--plot docs/overhead-vs-rate.png] [--anchor pprof.json]`
//!
//! With `--mechanisms` it compares instead, at 250 Hz (the highest rate both reach),
//! the per-sample cost of the two ways of sampling: the per-thread CPU-time timer
//! (`timer_create`) and the perf event (`perf_event_open` plus one re-arming `ioctl`
//! per sample), each round running bare, perf and timer side by side.
//!
//! With `--floor` it measures spanprof's cost per sample at 1 kHz against the
//! machine's floor (an empty handler, a signal-free kernel ring). With
//! `--pause-resume` it times what a hot request's resume and pause of its thread's
//! perf event cost (`spanprof_core::testing::sample_floor::pause_resume_cost`, `--iterations`
//! pairs per round, 200 000 by default), beside a thread CPU clock read and `getppid`.
//! With `--unwind` it times one walk of a stack by each of the handler's unwinders
//! (frame pointers; DWARF with a warm and with a cold cache). With `--symbolize` it
//! times the collector's naming of a new stack whose addresses are all cached. With
//! `--pprof` it times the pprof encoding of a window as a push sees it (`--samples`
//! distinct stacks 35 frames deep, named from 300 shared functions, each sample with
//! labels of its own span): µs per sample.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use spanprof::{Hotness, SpanLabels};
use spanprof_bench::{arg, print_json};
use spanprof_workloads::BURNERS;

const RATES: &[u32] = &[99, 250, 1000, 2000, 4000];

/// What samples the busy threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sampling {
    /// Nothing.
    Bare,
    /// spanprof's profiler (started by the caller); the threads register and run
    /// inside hot labels.
    Spanprof,
    /// The floor with a signal: a perf event per thread signalling an empty handler
    /// that re-arms it with one `ioctl` (the handler installed by the caller).
    EmptyHandler(u64),
    /// The floor without a signal: a perf event per thread writing into a kernel ring.
    KernelRing(u64),
}

/// Runs 2 busy threads for `secs`; returns (iterations per CPU-second, samples per
/// CPU-second per thread).
fn run(secs: f64, profiled: bool) -> (f64, f64) {
    run_sampled(
        secs,
        if profiled {
            Sampling::Spanprof
        } else {
            Sampling::Bare
        },
    )
}

fn run_sampled(secs: f64, sampling: Sampling) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..2u64)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let profiled = sampling == Sampling::Spanprof;
                if profiled {
                    spanprof::register_current_thread();
                }
                let l = SpanLabels::builder()
                    .span_id(t + 1)
                    .span_name("sweep")
                    .hot(Hotness::Sampled)
                    .build();
                let _g = profiled.then(|| l.enter());
                let probe = floor::Probe::start(sampling);
                let cpu0 = spanprof::stats::thread_cpu_time();
                let mut iters = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    BURNERS[t as usize].1(1_000);
                    iters += 1;
                }
                let cpu = (spanprof::stats::thread_cpu_time() - cpu0).as_secs_f64();
                let samples = match &probe {
                    Some(p) => p.samples(),
                    None => l.cpu_samples(),
                };
                drop(probe);
                spanprof::deregister_current_thread();
                (iters as f64, cpu, samples as f64)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let (mut iters, mut cpu, mut samples) = (0.0, 0.0, 0.0);
    for h in handles {
        let (i, c, s) = h.join().unwrap();
        iters += i;
        cpu += c;
        samples += s;
    }
    (iters / cpu, samples / cpu)
}

/// The machine's floor per sample (`spanprof_core::testing::sample_floor`, Linux only).
mod floor {
    use super::Sampling;
    use spanprof_core::testing::sample_floor::{RingProbe, SignalProbe};

    pub enum Probe {
        Signal(SignalProbe),
        Ring(RingProbe),
    }

    impl Probe {
        pub fn start(sampling: Sampling) -> Option<Probe> {
            match sampling {
                Sampling::EmptyHandler(ns) => {
                    Some(Probe::Signal(SignalProbe::start(ns).expect("perf event")))
                }
                Sampling::KernelRing(ns) => {
                    Some(Probe::Ring(RingProbe::start(ns).expect("perf ring")))
                }
                _ => None,
            }
        }

        pub fn samples(&self) -> u64 {
            match self {
                Probe::Signal(p) => p.samples(),
                Probe::Ring(p) => p.samples(),
            }
        }
    }

    pub fn install() {
        spanprof_core::testing::sample_floor::install_empty_handler().expect("probe handler");
    }

    pub fn uninstall() {
        spanprof_core::testing::sample_floor::uninstall_empty_handler();
    }
}

/// CPU time per sample, in µs, from the throughput ratio and the sampling rate: the
/// fraction of CPU lost, divided by the samples taken per CPU-second.
fn cost_per_sample_us(ratio: f64, samples_per_cpu_second: f64) -> f64 {
    (1.0 - ratio) / samples_per_cpu_second.max(1.0) * 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn mechanisms(secs: f64, rounds: usize) {
    const HZ: u32 = 250;
    let mut rows = Vec::new();
    let mut results: [(Vec<f64>, Vec<f64>, String); 2] = Default::default();
    for round in 0..rounds {
        let (bare, _) = run(secs, false);
        for (i, perf) in [true, false].into_iter().enumerate() {
            let p = spanprof::Profiler::builder()
                .baseline_hz(99)
                .high_hz(HZ)
                .use_perf_events(perf)
                .start()
                .expect("profiler");
            results[i].2 = p.capabilities().mechanism.as_str().to_owned();
            let (with, per_cpu_s) = run(secs, true);
            p.stop();
            results[i].0.push(with / bare);
            results[i].1.push(per_cpu_s);
            eprintln!(
                "round {round}: {:<10} ratio {:.4}, {per_cpu_s:.0} samples per CPU-second, {:.1} µs per sample",
                results[i].2,
                with / bare,
                cost_per_sample_us(with / bare, per_cpu_s)
            );
        }
    }
    for (ratios, captures, mechanism) in results {
        let costs: Vec<f64> = ratios
            .iter()
            .zip(&captures)
            .map(|(&r, &c)| cost_per_sample_us(r, c))
            .collect();
        rows.push(serde_json::json!({
            "mechanism": mechanism, "requested_hz": HZ,
            "throughput_ratio": median(ratios.clone()),
            "samples_per_cpu_second": median(captures),
            "cost_per_sample_us": median(costs.clone()),
            "cost_per_sample_us_all_rounds": costs,
        }));
    }
    print_json(
        serde_json::json!({ "seconds_per_run": secs, "rounds": rounds, "mechanisms": rows }),
    );
}

/// `--floor`: spanprof's cost per sample at 1 kHz against the machine's floor, in
/// one run: each round runs the busy threads bare, with spanprof hot at 1 kHz
/// unwinding by DWARF and by frame pointers, with an empty handler on the same perf
/// event (re-armed by `ioctl`), and with a signal-free kernel ring, in a rotating
/// order.
fn floor_run(secs: f64, rounds: usize) {
    const HZ: u64 = 1000;
    let names = [
        "spanprof",
        "spanprof_frame_pointers",
        "empty_handler",
        "kernel_ring",
    ];
    let mut cost: [Vec<f64>; 4] = Default::default();
    let mut rate: [Vec<f64>; 4] = Default::default();
    let mut mechanism = String::new();
    for round in 0..rounds {
        let (bare, _) = run(secs, false);
        for k in 0..names.len() {
            let i = (round + k) % names.len();
            let (with, per_cpu_s) = match i {
                0 | 1 => {
                    let p = spanprof::Profiler::builder()
                        .baseline_hz(99)
                        .high_hz(HZ as u32)
                        .unwinding(if i == 0 {
                            spanprof::Unwinding::DwarfCfi
                        } else {
                            spanprof::Unwinding::FramePointers
                        })
                        .start()
                        .expect("profiler");
                    mechanism = p.capabilities().mechanism.as_str().to_owned();
                    let r = run(secs, true);
                    p.stop();
                    r
                }
                2 => {
                    floor::install();
                    let r = run_sampled(secs, Sampling::EmptyHandler(1_000_000_000 / HZ));
                    floor::uninstall();
                    r
                }
                _ => run_sampled(secs, Sampling::KernelRing(1_000_000_000 / HZ)),
            };
            let c = cost_per_sample_us(with / bare, per_cpu_s);
            cost[i].push(c);
            rate[i].push(per_cpu_s);
            eprintln!(
                "round {round}: {:<23} ratio {:.4}, {per_cpu_s:.0} samples per CPU-second, {c:.1} µs per sample",
                names[i],
                with / bare
            );
        }
    }
    let m: Vec<f64> = cost.iter().map(|c| median(c.clone())).collect();
    // Per round, one cost over another, then the median of those.
    let over =
        |a: usize, b: usize| median(cost[a].iter().zip(&cost[b]).map(|(x, y)| x / y).collect());
    print_json(serde_json::json!({
        "requested_hz": HZ, "seconds_per_run": secs, "rounds": rounds,
        "spanprof_mechanism": mechanism,
        "cost_per_sample_us_spanprof": m[0],
        "cost_per_sample_us_spanprof_frame_pointers": m[1],
        "cost_per_sample_us_empty_handler": m[2],
        "cost_per_sample_us_kernel_ring": m[3],
        "spanprof_over_empty_handler": m[0] / m[2],
        "spanprof_over_kernel_ring": m[0] / m[3],
        "spanprof_over_empty_handler_median_of_rounds": over(0, 2),
        "spanprof_frame_pointers_over_empty_handler_median_of_rounds": over(1, 2),
        "spanprof_over_kernel_ring_median_of_rounds": over(0, 3),
        "samples_per_cpu_second": {
            "spanprof": median(rate[0].clone()),
            "spanprof_frame_pointers": median(rate[1].clone()),
            "empty_handler": median(rate[2].clone()),
            "kernel_ring": median(rate[3].clone()),
        },
        "cost_per_sample_us_all_rounds": {
            "spanprof": cost[0], "spanprof_frame_pointers": cost[1],
            "empty_handler": cost[2], "kernel_ring": cost[3],
        },
    }));
}

/// `--pause-resume`: a hot request's resume and pause of its perf event, per round
/// `iterations` of each call; medians over the rounds.
fn pause_resume_run(rounds: usize, iterations: u32) {
    let (mut pair, mut clock, mut plain) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let c = spanprof_core::testing::sample_floor::pause_resume_cost(iterations)
            .expect("perf event (perf_event_paranoid <= 2)");
        eprintln!(
            "round {round}: ENABLE+DISABLE {:.2} µs, thread CPU clock {:.2} µs, getppid {:.2} µs",
            c.enable_disable_pair_us, c.thread_cpu_clock_us, c.plain_syscall_us
        );
        pair.push(c.enable_disable_pair_us);
        clock.push(c.thread_cpu_clock_us);
        plain.push(c.plain_syscall_us);
    }
    print_json(serde_json::json!({
        "rounds": rounds, "iterations_per_round": iterations,
        "enable_disable_pair_us": median(pair.clone()),
        "thread_cpu_clock_us": median(clock.clone()),
        "getppid_us": median(plain.clone()),
        "all_rounds": { "enable_disable_pair_us": pair, "thread_cpu_clock_us": clock,
                        "getppid_us": plain },
    }));
}

/// `--unwind`: what one walk of a stack costs each unwinder of the signal handler,
/// on stacks of 10, 30 and 60 frames of recursion (`--iterations` walks each, 200 000
/// by default); medians over the rounds.
fn unwind_run(rounds: usize, iterations: u32) {
    let mut rows = Vec::new();
    for depth in [10u32, 30, 60] {
        let (mut fp, mut dwarf, mut cold) = (Vec::new(), Vec::new(), Vec::new());
        let mut frames = (0, 0);
        for round in 0..rounds {
            let c = spanprof_core::testing::sample_floor::unwind_cost(depth, iterations)
                .expect("a DWARF unwinder (x86_64)");
            eprintln!(
                "round {round}, depth {depth}: frame pointers {:.0} ns ({} frames), DWARF {:.0} ns ({} frames), DWARF cold {:.0} ns",
                c.frame_pointer_ns,
                c.frame_pointer_frames,
                c.dwarf_ns,
                c.dwarf_frames,
                c.dwarf_cold_ns
            );
            fp.push(c.frame_pointer_ns);
            dwarf.push(c.dwarf_ns);
            cold.push(c.dwarf_cold_ns);
            frames = (c.frame_pointer_frames, c.dwarf_frames);
        }
        rows.push(serde_json::json!({
            "recursion_depth": depth,
            "frame_pointer_frames": frames.0, "dwarf_frames": frames.1,
            "frame_pointer_ns": median(fp), "dwarf_ns": median(dwarf),
            "dwarf_cold_ns": median(cold),
        }));
    }
    print_json(serde_json::json!({ "rounds": rounds, "iterations": iterations, "stacks": rows }));
}

/// A window's profile as the collector hands it to a push: `samples` distinct stacks
/// of 35 frames whose frames share their names (one `Arc<str>` per function, as the
/// symbolizer's cache gives), each sample with its own span's labels.
fn push_window(samples: usize) -> spanprof_core::Profile {
    use spanprof_core::{Frame, Profile, ProfileSample, SampleLabels};
    let functions: Vec<Frame> = (0..300u64)
        .map(|i| Frame {
            function: format!(
                "<checkout::service::handlers::Handler{i} as tower_service::Service<http::Request<axum_core::body::Body>>>::call::{{{{closure}}}}"
            )
            .into(),
            file: Some(format!("/src/checkout/src/service/handler_{}.rs", i % 40).into()),
            line: 10 + (i as u32 % 200),
            address: 0x40_0000 + i * 0x40,
            inlined: i % 4 == 0,
        })
        .collect();
    let span_name: Arc<str> = "checkout".into();
    let route: Arc<str> = "POST /checkout".into();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let samples = (0..samples as u64)
        .map(|n| {
            let stack: Vec<Frame> = (0..35)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    functions[(x % 300) as usize].clone()
                })
                .collect();
            ProfileSample {
                stack: stack.into(),
                labels: Some(Arc::new(SampleLabels {
                    trace_id: u128::from(n) << 64 | 7,
                    span_id: n + 1,
                    parent_span_id: 0,
                    root_span_id: n + 1,
                    span_name: span_name.clone(),
                    route: route.clone(),
                    hot: Hotness::Sampled,
                    latency: None,
                })),
                count: 1,
                cpu_ns: 1_000_000,
                wall_ns: 0,
            }
        })
        .collect();
    Profile {
        samples,
        start: std::time::SystemTime::now(),
        duration_ns: 10_000_000_000,
        period_ns: 10_101_010,
    }
}

/// `--pprof`: the median over `rounds` of the µs per sample that encoding a push's
/// window takes (the pprof message built and encoded, before compression).
fn pprof_run(rounds: usize, samples: usize) {
    let profile = push_window(samples);
    let mut us = Vec::new();
    let mut bytes = 0;
    for _ in 0..rounds {
        let t = spanprof::stats::thread_cpu_time();
        bytes = std::hint::black_box(spanprof_core::pprof::encode(&profile)).len();
        us.push((spanprof::stats::thread_cpu_time() - t).as_secs_f64() * 1e6 / samples as f64);
    }
    print_json(
        serde_json::json!({ "samples": samples, "bytes": bytes, "us_per_sample": median(us) }),
    );
}

fn main() {
    let secs: f64 = arg("--seconds").map_or(3.0, |s| s.parse().expect("--seconds S"));
    let rounds: usize = arg("--rounds").map_or(3, |s| s.parse().expect("--rounds N"));
    if spanprof_bench::flag("--mechanisms") {
        return mechanisms(secs, rounds);
    }
    if spanprof_bench::flag("--floor") {
        return floor_run(secs, rounds);
    }
    if spanprof_bench::flag("--unwind") {
        let iterations =
            arg("--iterations").map_or(200_000, |s| s.parse().expect("--iterations N"));
        return unwind_run(rounds, iterations);
    }
    if spanprof_bench::flag("--symbolize") {
        // Stacks 35 addresses deep, as the checkout example's DWARF stacks are.
        let us = spanprof_core::testing::warm_stack_cost(300, 35, rounds.max(5));
        return print_json(serde_json::json!({ "warm_stack_us": us }));
    }
    if spanprof_bench::flag("--pprof") {
        let samples = arg("--samples").map_or(2_000, |s| s.parse().expect("--samples N"));
        return pprof_run(rounds.max(5), samples);
    }
    if spanprof_bench::flag("--pause-resume") {
        let iterations =
            arg("--iterations").map_or(200_000, |s| s.parse().expect("--iterations N"));
        return pause_resume_run(rounds, iterations);
    }
    let counter = AtomicU64::new(0);
    let mut rows = Vec::new();
    for &hz in RATES {
        let (mut ratios, mut captures) = (Vec::new(), Vec::new());
        let mut mechanism = String::new();
        for _ in 0..rounds {
            let (bare, _) = run(secs, false);
            let p = spanprof::Profiler::builder()
                .baseline_hz(hz.min(99))
                .high_hz(hz)
                .start()
                .expect("profiler");
            mechanism = p.capabilities().mechanism.as_str().to_owned();
            let (with, per_cpu_s) = run(secs, true);
            p.stop();
            ratios.push(with / bare);
            captures.push(per_cpu_s);
            counter.fetch_add(1, Ordering::Relaxed);
        }
        ratios.sort_by(|a, b| a.total_cmp(b));
        let (ratio, capture) = (ratios[ratios.len() / 2], median(captures));
        eprintln!(
            "{hz:>5} Hz: throughput ratio {ratio:.4}, {capture:.0} samples per CPU-second ({mechanism})"
        );
        rows.push(serde_json::json!({
            "requested_hz": hz, "throughput_ratio": ratio,
            "throughput_ratio_min_max": [ratios[0], ratios[ratios.len() - 1]],
            "samples_per_cpu_second": capture, "capture_ratio": capture / f64::from(hz),
            "cost_per_sample_us": cost_per_sample_us(ratio, capture),
            "mechanism": mechanism,
        }));
    }
    if let Some(path) = arg("--plot") {
        let anchor: Option<serde_json::Value> = arg("--anchor")
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|s| serde_json::from_str(s.lines().last()?).ok());
        match plot::draw(&path, &rows, anchor.as_ref()) {
            Ok(()) => eprintln!("plot: {path}"),
            Err(e) => eprintln!("plot not drawn: {e}"),
        }
    }
    print_json(serde_json::json!({ "seconds_per_run": secs, "rounds": rounds, "rates": rows }));
}

mod plot {
    use plotters::prelude::*;

    fn series(rows: &[serde_json::Value], key: &str) -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|r| Some((r["requested_hz"].as_f64()?, r[key].as_f64()?)))
            .collect()
    }

    pub fn draw(
        path: &str,
        rows: &[serde_json::Value],
        anchor: Option<&serde_json::Value>,
    ) -> Result<(), String> {
        spanprof_bench::register_plot_font()?;
        let root = BitMapBackend::new(path, (1100, 460)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (left, right) = root.split_horizontally(550);
        let anchor_rows: Vec<serde_json::Value> = anchor
            .and_then(|a| a["rates"].as_array().cloned())
            .unwrap_or_default();
        for (area, key, title, y) in [
            (
                &left,
                "throughput_ratio",
                "Throughput with profiling / without",
                (0.75f64, 1.02f64),
            ),
            (
                &right,
                "capture_ratio",
                "Samples delivered / requested (per CPU-s)",
                (0.0, 1.1),
            ),
        ] {
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(50)
                .build_cartesian_2d((50f64..5000f64).log_scale(), y.0..y.1)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc("requested rate (Hz, log)")
                .label_style(("sans-serif", 13))
                .draw()
                .map_err(|e| e.to_string())?;
            let ours = series(rows, key);
            chart
                .draw_series(LineSeries::new(ours.clone(), BLUE.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label("spanprof (per-thread perf events)")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLUE));
            chart
                .draw_series(ours.iter().map(|p| Circle::new(*p, 4, BLUE.filled())))
                .map_err(|e| e.to_string())?;
            let theirs = series(&anchor_rows, key);
            if !theirs.is_empty() {
                chart
                    .draw_series(LineSeries::new(theirs.clone(), RED.stroke_width(2)))
                    .map_err(|e| e.to_string())?
                    .label("pprof-rs 0.15 (ITIMER_PROF)")
                    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED));
                chart
                    .draw_series(theirs.iter().map(|p| Circle::new(*p, 4, RED.filled())))
                    .map_err(|e| e.to_string())?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .label_font(("sans-serif", 13))
                .position(SeriesLabelPosition::LowerLeft)
                .draw()
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())
    }
}
