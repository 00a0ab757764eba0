//! The pprof output read by the real `go tool pprof` (Debian's golang-go): `-tags`
//! lists the span and trace labels, and `-tagfocus=span_id=<id> -top` puts that
//! span's function on top.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use spanprof::Profiler;
use spanprof_bench::{Mode, Workload, class_labels};
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
