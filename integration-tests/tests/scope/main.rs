//! The profile scope has one home: the layer's builder sets it, and the sinks label
//! samples in it without being told, so spans' profile ids and the samples' span ids
//! cannot disagree. Two layers that set different scopes log one warning.

#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spanprof::{Hotness, Profiler, SpanLabels};
use spanprof_export::{PprofFileConfig, PprofFileExporter, ProfileSource};
use spanprof_tower::{ProfileCorrelationLayer, ProfileScope};

const ROOT: u64 = 0x5C0_0001;
const INNER: u64 = 0x5C0_0002;

/// Burns CPU on a registered thread inside `labels`.
fn burn_in(labels: &SpanLabels, cpu_ms: u64) {
    let labels = labels.clone();
    std::thread::spawn(move || {
        spanprof::register_current_thread();
        let _g = labels.enter();
        let start = spanprof::stats::thread_cpu_time();
        while spanprof::stats::thread_cpu_time() - start < Duration::from_millis(cpu_ms) {
            spanprof_workloads::BURNERS[0].1(5_000);
        }
    })
    .join()
    .unwrap();
}

/// CPU nanoseconds by `span_id` label over the pprof files at `paths`.
fn ns_by_span_id(paths: &[std::path::PathBuf]) -> BTreeMap<String, i64> {
    let mut by_id = BTreeMap::new();
    for path in paths {
        let pb = spanprof::pprof::decode(&std::fs::read(path).unwrap()).expect("gzip'd pprof");
        let s = |i: i64| pb.string_table[i as usize].as_str();
        for sample in &pb.sample {
            if let Some(l) = sample.label.iter().find(|l| s(l.key) == "span_id") {
                *by_id.entry(s(l.str).to_owned()).or_default() += sample.value[1];
            }
        }
    }
    by_id
}

#[test]
fn a_sink_labels_samples_in_the_scope_the_layer_was_built_with() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let _layer = ProfileCorrelationLayer::builder()
        .profiler(profiler.clone())
        .scope(ProfileScope::AllSpans)
        .build()
        .unwrap();
    let dir = support::artifact_dir().join(format!("scope-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = PprofFileConfig::new(&dir);
    cfg.interval = Duration::from_millis(300);
    // The sink is not told the scope: it reads the one the layer set.
    let files = PprofFileExporter::start(cfg, ProfileSource::profiler(&profiler)).unwrap();
    // A request's local root and an inner span under it; the work is the inner span's.
    let root = SpanLabels::builder()
        .trace_id(0x5C0_0000_0000_0000_0000_0000_0000_0001)
        .span_id(ROOT)
        .root_span_id(ROOT)
        .span_name("GET /checkout")
        .route("GET /checkout")
        .hot(Hotness::Sampled)
        .build();
    let inner = root.child(INNER, "calculate_total");
    burn_in(&inner, 400);
    profiler.flush();
    let written = files.shutdown(Duration::from_secs(5));
    profiler.stop();

    let by_id = ns_by_span_id(&written);
    // AllSpans: each sample carries its own span's id, not its local root's.
    let inner_ns = by_id.get(&format!("{INNER:016x}")).copied().unwrap_or(0);
    assert!(inner_ns >= 200_000_000, "inner span's samples: {by_id:?}");
    assert!(
        !by_id.contains_key(&format!("{ROOT:016x}")),
        "inner work labelled with the local root's id: {by_id:?}"
    );
}

#[test]
fn layers_built_with_different_scopes_log_one_warning() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let build = |scope: Option<ProfileScope>| {
        let mut b = ProfileCorrelationLayer::builder().profiler(profiler.clone());
        if let Some(scope) = scope {
            b = b.scope(scope);
        }
        b.build().unwrap()
    };
    let logs: Arc<Mutex<Vec<String>>> = Arc::default();
    let scope_warnings = || {
        logs.lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("WARN") && l.contains("scope"))
            .cloned()
            .collect::<Vec<_>>()
    };

    // A correct set-up logs nothing: two layers (an HTTP and a gRPC one) with the
    // same scope, and a third that leaves it alone.
    tracing::subscriber::with_default(support::capture_logs(logs.clone()), || {
        build(Some(ProfileScope::AllSpans));
        build(Some(ProfileScope::AllSpans));
        build(None);
    });
    assert_eq!(scope_warnings(), Vec::<String>::new());

    // A layer that disagrees: one warning naming both scopes, however many follow.
    tracing::subscriber::with_default(support::capture_logs(logs.clone()), || {
        build(Some(ProfileScope::LocalRoot));
        build(Some(ProfileScope::LocalRoot));
        build(Some(ProfileScope::AllSpans));
    });
    profiler.stop();
    let warnings = scope_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("AllSpans") && warnings[0].contains("LocalRoot"),
        "{}",
        warnings[0]
    );
}
