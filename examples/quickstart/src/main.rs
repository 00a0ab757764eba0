//! Runs 32 concurrent labelled tasks in 8 classes on a 2-worker tokio runtime, each
//! class burning CPU in its own function and yielding often so tasks migrate between
//! workers, then prints each class's span profile: samples and top functions.
//!
//! `cargo run --release -p quickstart`

use std::hint::black_box;
use std::time::{Duration, Instant};

use spanprof::{Profiler, SpanLabels, WithSpanLabels};

macro_rules! burners {
    ($($name:ident = $k:literal),*) => {
        $(
            // Each body differs (its own constants), so the linker cannot fold them.
            #[inline(never)]
            fn $name(iters: u64) -> u64 {
                let mut x = black_box($k);
                for i in 0..iters {
                    x = x.rotate_left(($k % 31) as u32 + 1) ^ i.wrapping_mul($k | 1);
                }
                black_box(x)
            }
        )*
        const BURNERS: &[(&str, fn(u64) -> u64)] = &[$((stringify!($name), $name)),*];
    };
}

burners!(
    parse_cart = 0x9e3779b97f4a7c15u64,
    price_rules = 0x2545f4914f6cdd1du64,
    tax_table = 0xbf58476d1ce4e5b9u64,
    discount_engine = 0x94d049bb133111ebu64,
    render_json = 0xd6e8feb86659fd93u64,
    hash_session = 0xa0761d6478bd642fu64,
    compress_log = 0xe7037ed1a0b428dbu64,
    audit_trail = 0x8ebc6af09c88c6e3u64
);

/// Burns CPU for about `ms` in `burn`, yielding every millisecond.
async fn work(burn: fn(u64) -> u64, ms: u64) {
    let end = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < end {
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(1) {
            burn(2_000);
        }
        tokio::task::yield_now().await;
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profiler = Profiler::builder().baseline_hz(99).high_hz(1000).start()?;
    let caps = profiler.capabilities();
    println!(
        "profiler: baseline {} Hz, high {} Hz via {} (effective {} Hz)",
        caps.baseline_hz,
        caps.high_hz,
        caps.mechanism.as_str(),
        caps.effective_high_hz
    );

    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder.worker_threads(2).enable_all().build()?;

    let mut spans = Vec::new();
    rt.block_on(async {
        let mut handles = Vec::new();
        for task in 0..32u64 {
            let class = (task % 8) as usize;
            let (name, burn) = BURNERS[class];
            let labels = SpanLabels::builder()
                .trace_id(0x1000 + u128::from(task))
                .span_id(0x100 + task)
                .span_name(name)
                .route(&format!("GET /{name}"))
                // Every other class is hot: profiled at the high rate.
                .hot(if class.is_multiple_of(2) {
                    spanprof::Hotness::Sampled
                } else {
                    spanprof::Hotness::Cold
                })
                .build();
            spans.push((labels.clone(), name));
            handles.push(tokio::spawn(work(burn, 400).with_span_labels(labels)));
        }
        for h in handles {
            h.await.expect("task");
        }
    });
    profiler.flush();

    println!(
        "{:<18} {:<8} {:>8} {:>10}  top functions",
        "span", "hot", "samples", "cpu ms"
    );
    for (labels, name) in spans.iter().take(8) {
        let Some(profile) = profiler.store().span(labels.span_id()) else {
            println!("{:<18} no samples", labels.span_id_hex());
            continue;
        };
        let top: Vec<String> = profile
            .top_functions(3)
            .iter()
            .map(|f| {
                format!(
                    "{} ({:.0}%)",
                    short(&f.function),
                    100.0 * f.self_ns as f64 / profile.cpu_ns().max(1) as f64
                )
            })
            .collect();
        println!(
            "{:<18} {:<8} {:>8} {:>10.1}  {}",
            format!("{} {}", labels.span_id_hex(), name),
            labels.hotness().as_str().unwrap_or("-"),
            profile.sample_count(),
            profile.cpu_ns() as f64 / 1e6,
            top.join(", ")
        );
    }
    let stats = profiler.sampler_stats();
    println!(
        "sampler: {} samples, {} dropped (ring full), {} truncated",
        stats.samples, stats.dropped_ring_full, stats.truncated
    );
    let path = std::env::temp_dir().join("spanprof-quickstart.pb.gz");
    let whole = profiler.store().process(Duration::from_secs(600));
    std::fs::write(&path, spanprof::pprof::encode_gzip(&whole))?;
    println!(
        "whole-process pprof: {} (try: go tool pprof -tags {0})",
        path.display()
    );
    profiler.stop();
    Ok(())
}

fn short(f: &str) -> &str {
    f.rsplit("::").next().unwrap_or(f)
}
