//! The pprof output read by the real `go tool pprof` (Debian's golang-go): `-tags`
//! lists the span and trace labels, and `-tagfocus=span_id=<id> -top` puts that
//! span's function on top.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use spanprof::Profiler;
use spanprof_workloads::{Mode, Workload, class_labels};
use support::{go_pprof, top_function};

#[test]
fn go_tool_pprof_reads_labels_and_focuses_on_a_span() {
    let profiler = Profiler::builder().start().expect("profiler");
    let w = Workload {
        duration: Duration::from_secs(2),
        tasks: 8,
        classes: 4,
        mode: Mode::Wrapper,
        ..Workload::default()
    };
    w.run(true);
    profiler.flush();
    let whole = profiler.store().process(Duration::from_secs(3600));
    profiler.stop();
    let path = support::artifact_dir().join("attribution.pb.gz");
    std::fs::write(&path, spanprof::pprof::encode_gzip(&whole)).unwrap();
    let file = path.to_str().unwrap();

    let tags = go_pprof(&["-tags", file]);
    for key in ["span_id:", "trace_id:", "span_name:", "route:"] {
        assert!(tags.contains(key), "-tags lacks {key}:\n{tags}");
    }
    for class in 0..4 {
        let span = class_labels(class, class, true).span_id_hex();
        assert!(tags.contains(&span), "-tags lacks span {span}:\n{tags}");
        let top = go_pprof(&["-top", &format!("-tagfocus=span_id=^{span}$"), file]);
        let f = top_function(&top);
        assert!(
            f.ends_with(&format!("burn_class_{class}")),
            "span {span}: top function {f:?}, expected burn_class_{class}:\n{top}"
        );
        // And none of the other classes' functions appear in its profile.
        for other in (0..4).filter(|o| *o != class) {
            assert!(!top.contains(&format!("burn_class_{other}")), "{top}");
        }
    }
    // Total CPU in the file matches the weighted estimate we encoded.
    let raw = go_pprof(&["-raw", file]);
    assert!(raw.contains("samples/count cpu/nanoseconds"), "{raw}");
}

/// The documented recipe for a span's flamegraph from a file or the debug endpoint:
/// `-tagfocus=root_span_id=^<pyroscope.profile.id>$` holds the request's whole tree,
/// including work inside inner (`#[instrument]`) spans, whose samples carry their own
/// `span_id`. (`span_id=^<id>$` selects that exact span only: here, nothing.)
#[test]
fn the_profile_id_recipe_finds_work_inside_inner_spans() {
    let profiler = Profiler::builder().start().expect("profiler");
    let (trace, root, inner) = (
        0x0af7_651916cd43dd8448eb211c80319cu128,
        0x1111_2222_3333_4444u64,
        0x5555_6666_7777_8888u64,
    );
    let inner_labels = spanprof::SpanLabels::builder()
        .trace_id(trace)
        .span_id(inner)
        .parent_span_id(root)
        .root_span_id(root)
        .span_name("hash_loop")
        .route("/hash")
        .hot(spanprof::Hotness::Sampled)
        .build();
    std::thread::spawn(move || {
        spanprof::register_current_thread();
        let _g = inner_labels.enter();
        let start = spanprof::stats::thread_cpu_time();
        while spanprof::stats::thread_cpu_time() - start < Duration::from_millis(400) {
            spanprof_workloads::BURNERS[2].1(5_000);
        }
    })
    .join()
    .unwrap();
    profiler.flush();
    let whole = profiler.store().process(Duration::from_secs(3600));
    profiler.stop();
    let path = support::artifact_dir().join("inner-span.pb.gz");
    std::fs::write(&path, spanprof::pprof::encode_gzip(&whole)).unwrap();
    let file = path.to_str().unwrap();
    let root_hex = format!("{root:016x}");

    let top = go_pprof(&[
        "-top",
        &format!("-tagfocus=root_span_id=^{root_hex}$"),
        file,
    ]);
    assert!(
        top_function(&top).ends_with("burn_class_2"),
        "root_span_id={root_hex} should hold the inner span's work:\n{top}"
    );
    let narrow = go_pprof(&["-top", &format!("-tagfocus=span_id=^{root_hex}$"), file]);
    assert!(!narrow.contains("burn_class_2"), "{narrow}");
}
