//! Memory over a long run of a high-cardinality workload: many distinct stacks
//! (random call paths through 128 functions, 6 to 11 deep, ending in one of 8
//! burners), many spans (every request its own trace and span, 40 routes, a
//! quarter hot: sampled at 1 kHz), on a tokio runtime with spanprof's hooks, a profile window taken and
//! encoded every 10 s as a sink would. Every 10 s it records resident anonymous
//! memory (`/proc/self/status` RssAnon) and `Profiler::memory_stats`, and reports
//! the start, the peak and the slope over the last half of the run.
//!
//! `cargo run --release -p spanprof-bench --bin soak -- --json [--seconds 600] [--rate 3000] [--burn 60000]`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spanprof::WithSpanLabels;
use spanprof_bench::{arg, print_json};
use spanprof_workloads::BURNERS;

macro_rules! levels {
    ($($name:ident = $k:literal),*) => {
        $(
            // Each its own constant, so that no two are folded into one function.
            #[inline(never)]
            fn $name(path: u64, depth: u32) -> u64 {
                std::hint::black_box(descend(path, depth)) ^ std::hint::black_box($k)
            }
        )*
        const LEVELS: &[fn(u64, u32) -> u64] = &[$($name),*];
    };
}

levels!(
    level_000 = 0,
    level_001 = 1,
    level_002 = 2,
    level_003 = 3,
    level_004 = 4,
    level_005 = 5,
    level_006 = 6,
    level_007 = 7,
    level_008 = 8,
    level_009 = 9,
    level_010 = 10,
    level_011 = 11,
    level_012 = 12,
    level_013 = 13,
    level_014 = 14,
    level_015 = 15,
    level_016 = 16,
    level_017 = 17,
    level_018 = 18,
    level_019 = 19,
    level_020 = 20,
    level_021 = 21,
    level_022 = 22,
    level_023 = 23,
    level_024 = 24,
    level_025 = 25,
    level_026 = 26,
    level_027 = 27,
    level_028 = 28,
    level_029 = 29,
    level_030 = 30,
    level_031 = 31,
    level_032 = 32,
    level_033 = 33,
    level_034 = 34,
    level_035 = 35,
    level_036 = 36,
    level_037 = 37,
    level_038 = 38,
    level_039 = 39,
    level_040 = 40,
    level_041 = 41,
    level_042 = 42,
    level_043 = 43,
    level_044 = 44,
    level_045 = 45,
    level_046 = 46,
    level_047 = 47,
    level_048 = 48,
    level_049 = 49,
    level_050 = 50,
    level_051 = 51,
    level_052 = 52,
    level_053 = 53,
    level_054 = 54,
    level_055 = 55,
    level_056 = 56,
    level_057 = 57,
    level_058 = 58,
    level_059 = 59,
    level_060 = 60,
    level_061 = 61,
    level_062 = 62,
    level_063 = 63,
    level_064 = 64,
    level_065 = 65,
    level_066 = 66,
    level_067 = 67,
    level_068 = 68,
    level_069 = 69,
    level_070 = 70,
    level_071 = 71,
    level_072 = 72,
    level_073 = 73,
    level_074 = 74,
    level_075 = 75,
    level_076 = 76,
    level_077 = 77,
    level_078 = 78,
    level_079 = 79,
    level_080 = 80,
    level_081 = 81,
    level_082 = 82,
    level_083 = 83,
    level_084 = 84,
    level_085 = 85,
    level_086 = 86,
    level_087 = 87,
    level_088 = 88,
    level_089 = 89,
    level_090 = 90,
    level_091 = 91,
    level_092 = 92,
    level_093 = 93,
    level_094 = 94,
    level_095 = 95,
    level_096 = 96,
    level_097 = 97,
    level_098 = 98,
    level_099 = 99,
    level_100 = 100,
    level_101 = 101,
    level_102 = 102,
    level_103 = 103,
    level_104 = 104,
    level_105 = 105,
    level_106 = 106,
    level_107 = 107,
    level_108 = 108,
    level_109 = 109,
    level_110 = 110,
    level_111 = 111,
    level_112 = 112,
    level_113 = 113,
    level_114 = 114,
    level_115 = 115,
    level_116 = 116,
    level_117 = 117,
    level_118 = 118,
    level_119 = 119,
    level_120 = 120,
    level_121 = 121,
    level_122 = 122,
    level_123 = 123,
    level_124 = 124,
    level_125 = 125,
    level_126 = 126,
    level_127 = 127
);

/// Iterations of the burner at the bottom of each call path (`--burn`).
static BURN: AtomicU64 = AtomicU64::new(60_000);

/// One more level of the call path `path` (7 bits a level), or the burner at the
/// bottom.
#[inline(never)]
fn descend(path: u64, depth: u32) -> u64 {
    if depth == 0 {
        let (_, burn) = BURNERS[(path % BURNERS.len() as u64) as usize];
        return burn(BURN.load(Ordering::Relaxed));
    }
    LEVELS[(path % LEVELS.len() as u64) as usize](path / LEVELS.len() as u64, depth - 1)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / 1048576.0
}

/// Least-squares slope of `(seconds, MiB)` points, in MiB per minute.
fn slope_per_min(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(x, y), p| (x + p.0 / n, y + p.1 / n));
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(sxy, sxx), p| {
        (sxy + (p.0 - mx) * (p.1 - my), sxx + (p.0 - mx) * (p.0 - mx))
    });
    sxy / sxx * 60.0
}

fn main() {
    let seconds: u64 = arg("--seconds").map_or(600, |s| s.parse().expect("--seconds N"));
    let rate: u64 = arg("--rate").map_or(3_000, |s| s.parse().expect("--rate N"));
    if let Some(b) = arg("--burn") {
        BURN.store(b.parse().expect("--burn N"), Ordering::Relaxed);
    }
    let profiler = spanprof::Profiler::builder().start().expect("profiler");
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder.worker_threads(2).enable_all().build().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let driver = {
        let (stop, requests) = (stop.clone(), requests.clone());
        rt.spawn(async move {
            let start = tokio::time::Instant::now();
            let mut rng = 0x9e37_79b9_7f4a_7c15u64;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                tokio::time::sleep_until(start + Duration::from_nanos(i * 1_000_000_000 / rate))
                    .await;
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let path = rng;
                // Every request its own trace and span, 40 routes, a quarter hot.
                let labels = spanprof_bench::request_labels(
                    u128::from(rng) << 64 | u128::from(i),
                    i,
                    i % 40,
                    i.is_multiple_of(4),
                );
                let requests = requests.clone();
                tokio::spawn(
                    async move {
                        // Two calls down different paths, a yield between them.
                        std::hint::black_box(descend(path, 6 + (path % 6) as u32));
                        tokio::task::yield_now().await;
                        std::hint::black_box(descend(path.rotate_left(29), 6 + (path % 5) as u32));
                        requests.fetch_add(1, Ordering::Relaxed);
                    }
                    .with_span_labels(labels),
                );
            }
        })
    };
    // A sink: a window taken and encoded every 10 s.
    let window = profiler.window(spanprof::defaults::DEFAULT_WINDOW_ENTRIES);
    let start = Instant::now();
    let mut series = Vec::new();
    let mut pprof_bytes = 0;
    while start.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_secs(10));
        pprof_bytes += spanprof::pprof::encode(&window.take()).len();
        let m = profiler.memory_stats();
        let t = start.elapsed().as_secs_f64();
        let anon = spanprof_bench::proc_status_kib("RssAnon:") as f64 / 1024.0;
        series.push(serde_json::json!({
            "t": t.round(),
            "rss_anon_mib": anon,
            "estimate_mib": mib(m.total_bytes()),
            "store_mib": mib(m.store_bytes),
            "stack_cache_mib": mib(m.stack_cache.bytes),
            "stack_cache_evicted": m.stack_cache.evicted,
            "symbol_cache_mib": mib(m.symbol_cache.bytes),
            "symbol_cache_evicted": m.symbol_cache.evicted,
            "labels_cache_mib": mib(m.labels_cache.bytes),
            "window_mib": mib(m.window_bytes),
            "backlog_mib": mib(m.backlog_bytes),
            "names": m.names.names,
            "requests": requests.load(Ordering::Relaxed),
        }));
        if spanprof_bench::flag("--progress") {
            eprintln!("{}", series.last().unwrap());
        }
    }
    stop.store(true, Ordering::Relaxed);
    rt.block_on(driver).unwrap();
    let memory = profiler.memory_stats();
    let store = profiler.store().stats();
    let sampler = profiler.sampler_stats();
    let anon: Vec<(f64, f64)> = series
        .iter()
        .map(|p| {
            (
                p["t"].as_f64().unwrap(),
                p["rss_anon_mib"].as_f64().unwrap(),
            )
        })
        .collect();
    let half = seconds as f64 / 2.0;
    let last_half: Vec<(f64, f64)> = anon.iter().copied().filter(|p| p.0 > half).collect();
    let elapsed = start.elapsed().as_secs_f64();
    print_json(serde_json::json!({
        "seconds": elapsed,
        "requests": requests.load(Ordering::Relaxed),
        "requests_per_second": requests.load(Ordering::Relaxed) as f64 / elapsed,
        "rss_anon_start_mib": anon.first().map_or(0.0, |p| p.1),
        "rss_anon_peak_mib": anon.iter().map(|p| p.1).fold(0.0, f64::max),
        "rss_anon_end_mib": anon.last().map_or(0.0, |p| p.1),
        "rss_anon_slope_last_half_mib_per_min": slope_per_min(&last_half),
        "estimate_end_mib": mib(memory.total_bytes()),
        "bounds_mib": mib(memory.bound_bytes()),
        "stack_cache_evicted": memory.stack_cache.evicted,
        "symbol_cache_evicted": memory.symbol_cache.evicted,
        "labels_cache_evicted": memory.labels_cache.evicted,
        "store_spans": store.spans,
        "store_stacks": store.stacks,
        "spans_evicted": store.spans_evicted,
        "stacks_dropped": store.stacks_dropped,
        "samples": sampler.samples,
        "dropped_ring_full": sampler.dropped_ring_full,
        "dropped_backlog": sampler.dropped_backlog,
        "pprof_bytes": pprof_bytes,
        "series": series,
    }));
    profiler.stop();
}
