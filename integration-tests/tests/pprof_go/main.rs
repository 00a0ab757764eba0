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

/// The lines of the known inlined chain below, as it runs: where `chain_outer` calls
/// `chain_middle`, where `chain_middle` calls `chain_leaf`, and the first and last
/// line of `chain_leaf`'s loop.
static CHAIN_LINES: [std::sync::atomic::AtomicU32; 4] =
    [const { std::sync::atomic::AtomicU32::new(0) }; 4];

fn note_line(i: usize, line: u32) {
    CHAIN_LINES[i].store(line, std::sync::atomic::Ordering::Relaxed);
}

#[inline(never)]
fn chain_outer(n: u64) -> u64 {
    let (r, at) = (chain_middle(n), line!());
    note_line(0, at);
    r ^ 1
}

#[inline(always)]
fn chain_middle(n: u64) -> u64 {
    let (r, at) = (chain_leaf(n), line!());
    note_line(1, at);
    r.wrapping_add(3)
}

#[inline(always)]
fn chain_leaf(n: u64) -> u64 {
    let mut x = n | 1;
    note_line(2, line!() + 1);
    for _ in 0..n {
        x = std::hint::black_box(x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(7));
    }
    note_line(3, line!() - 1);
    x
}

/// Every frame of a sample names its own function and the line executing in it, as
/// `go tool pprof -raw` reads the file: the innermost inlined function at the line of
/// the spin loop, each caller at the line of its call (pprof's convention for the
/// `Line`s of one `Location`), under its full name.
#[test]
fn inlined_frames_carry_their_own_function_and_line() {
    let profiler = Profiler::builder().high_hz(1000).start().expect("profiler");
    let labels = spanprof::SpanLabels::builder()
        .span_id(0x1234)
        .span_name("chain")
        .hot(spanprof::Hotness::Sampled)
        .build();
    std::thread::spawn(move || {
        spanprof::register_current_thread();
        let _g = labels.enter();
        let start = spanprof::stats::thread_cpu_time();
        while spanprof::stats::thread_cpu_time() - start < Duration::from_millis(600) {
            std::hint::black_box(chain_outer(std::hint::black_box(20_000)));
        }
    })
    .join()
    .unwrap();
    profiler.flush();
    let whole = profiler.store().process(Duration::from_secs(3600));
    profiler.stop();
    let path = support::artifact_dir().join("inlined.pb.gz");
    std::fs::write(&path, spanprof::pprof::encode_gzip(&whole)).unwrap();
    let raw = go_pprof(&["-raw", path.to_str().unwrap()]);
    // A location's lines, innermost first: `ID: ADDR M=.. FUNCTION FILE:LINE s=..`,
    // then one indented line per caller inlined at the same address.
    let locations: Vec<Vec<(String, String)>> = raw
        .split("Locations")
        .nth(1)
        .expect("a Locations section")
        .split("Mappings")
        .next()
        .unwrap()
        .lines()
        .fold(Vec::new(), |mut locs, line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(at) = fields.iter().position(|f| f.contains(".rs:")) else {
                return locs;
            };
            let function = fields[..at]
                .iter()
                .skip_while(|f| f.ends_with(':') || f.starts_with("0x") || f.starts_with("M="))
                .copied()
                .collect::<Vec<_>>()
                .join(" ");
            let frame = (function, fields[at].to_owned());
            if fields[0].ends_with(':') || locs.is_empty() {
                locs.push(vec![frame]);
            } else {
                locs.last_mut().unwrap().push(frame);
            }
            locs
        });
    let spin = locations
        .iter()
        .find(|l| l.first().is_some_and(|(f, _)| f.ends_with("chain_leaf")))
        .unwrap_or_else(|| panic!("no location whose innermost frame is chain_leaf:\n{raw}"));
    let at = |function: &str| {
        spin.iter()
            .find(|(f, _)| f.ends_with(function))
            .map(|(_, file_line)| file_line.clone())
            .unwrap_or_else(|| panic!("{function} not in {spin:?}\n{raw}"))
    };
    let line = |i: usize| CHAIN_LINES[i].load(std::sync::atomic::Ordering::Relaxed);
    let line_of = |function: &str| -> u32 {
        at(function)
            .rsplit(':')
            .next()
            .and_then(|l| l.parse().ok())
            .unwrap_or(0)
    };
    assert!(
        (line(2)..=line(3)).contains(&line_of("chain_leaf")),
        "chain_leaf at {}, its loop is lines {}-{}: {spin:?}",
        line_of("chain_leaf"),
        line(2),
        line(3)
    );
    assert_eq!(line_of("chain_middle"), line(1), "{spin:?}");
    assert_eq!(line_of("chain_outer"), line(0), "{spin:?}");
    assert_eq!(spin.len(), 3, "{spin:?}");
    // Names keep their type: `go tool pprof` shortens names it takes for mangled
    // ones (`<u64>::rotate_left` to `::rotate_left`) unless told they are not.
    let shortened: Vec<&str> = raw.lines().filter(|l| l.contains(" ::")).collect();
    assert!(
        shortened.is_empty(),
        "names lost their type: {shortened:#?}"
    );
    assert!(raw.contains("<u64>::rotate_left"), "{raw}");
}
