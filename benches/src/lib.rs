//! Helpers shared by spanprof's bench binaries: their command line, JSON output,
//! memory readings and plots. The workloads they run are in `spanprof-workloads`.

use spanprof::{Hotness, SpanLabels};

/// Prints `value` as the last line of output, as every bench binary does.
pub fn print_json(value: serde_json::Value) {
    println!("{value}");
}

/// A `kB` field of this process's `/proc/self/status` (`VmRSS:`, `RssAnon:`) in
/// KiB; 0 where it cannot be read.
pub fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The labels of one generated request: its own trace and span, a route of the
/// form `GET /route/{n}`, hot (sampled at the high rate) or cold.
pub fn request_labels(trace_id: u128, span_id: u64, route: u64, hot: bool) -> SpanLabels {
    SpanLabels::builder()
        .trace_id(trace_id)
        .span_id(span_id)
        .span_name("request")
        .route(&format!("GET /route/{route}"))
        .hot(if hot { Hotness::Sampled } else { Hotness::Cold })
        .build()
}

/// The value following `--name` on this program's command line.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// Registers a system TrueType font (DejaVu Sans, else Liberation Sans) as plotters'
/// `sans-serif`, for the benches' plots.
pub fn register_plot_font() -> Result<(), String> {
    let font = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    ]
    .iter()
    .find_map(|p| std::fs::read(p).ok())
    .ok_or("no TrueType font found (install fonts-dejavu-core)")?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, font)
        .map_err(|_| "bad font".to_owned())
}

/// Whether `--name` is on this program's command line.
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// The median of `v` (the upper one of an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The tracer provider of a bench's tracing stack: the user's batch processor in
/// front of an exporter that discards, or, with `spanprof`, `SpanProfileProcessor`'s
/// batching form in front of the same exporter.
pub fn tracer_provider(spanprof: bool) -> opentelemetry_sdk::trace::SdkTracerProvider {
    use spanprof_workloads::service;
    let builder = opentelemetry_sdk::trace::SdkTracerProvider::builder();
    if spanprof {
        builder
            .with_span_processor(spanprof::tower::SpanProfileProcessor::batch(
                service::DiscardingExporter,
            ))
            .build()
    } else {
        builder
            .with_span_processor(service::batch_processor())
            .build()
    }
}

/// The JSON API's request bodies the benches send: 64 generated orders.
pub fn order_bodies() -> Vec<bytes::Bytes> {
    (0..64)
        .map(|seed| {
            serde_json::to_vec(&spanprof_workloads::service::sample_order(seed))
                .expect("an order serializes")
                .into()
        })
        .collect()
}
