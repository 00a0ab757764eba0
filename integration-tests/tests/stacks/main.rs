//! Whole stacks whatever the code was built with: a labelled task whose time goes to
//! glibc's allocator, serde_json or a C library keeps its caller in its samples and
//! reaches the thread's first frame. `scripts/test` runs this suite twice: in the
//! project's build and in one without frame pointers (`SPANPROF_EXPECT_FRAME_POINTERS`
//! says which, and the first test checks the build is the one expected).

use std::time::Duration;

use spanprof::Profiler;
use spanprof_workloads::stacks::{self, StackQuality};

/// Runs `pattern` for `cpu` at 1 kHz in span `span_id`; returns its score.
fn measure(profiler: &Profiler, name: &str, span_id: u64, cpu: Duration) -> StackQuality {
    let pattern = stacks::pattern(name).expect("a pattern");
    stacks::run_labelled(pattern, span_id, cpu);
    profiler.flush();
    let profile = profiler.store().span(span_id).expect("samples");
    let q = stacks::score(&profile, pattern.caller);
    let broken: Vec<_> = profile
        .samples
        .iter()
        .filter(|s| {
            !s.stack.iter().any(|f| f.function.contains(pattern.caller))
                || !s
                    .stack
                    .iter()
                    .rev()
                    .take(3)
                    .any(|f| stacks::is_thread_root(&f.function))
        })
        .take(3)
        .map(|s| {
            s.stack
                .iter()
                .map(|f| f.function.to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    eprintln!("{name}: {q:?}; stacks not whole, e.g. {broken:#?}");
    q
}

#[track_caller]
fn assert_whole(name: &str, q: &StackQuality) {
    assert!(q.samples >= 200, "{name}: only {} samples", q.samples);
    assert!(
        q.share(q.with_caller) >= 0.99,
        "{name}: the caller is in {:.1} % of the samples: {q:?}",
        100.0 * q.share(q.with_caller)
    );
    assert!(
        q.share(q.rooted) >= 0.99,
        "{name}: {:.1} % of the samples reach the thread's first frame: {q:?}",
        100.0 * q.share(q.rooted)
    );
}

fn profiler() -> Profiler {
    Profiler::builder()
        .baseline_hz(99)
        .high_hz(1000)
        .start()
        .expect("profiler")
}

#[test]
fn this_build_has_the_frame_pointers_the_suite_expects() {
    let profiler = profiler();
    let has = profiler.capabilities().frame_pointers;
    profiler.stop();
    match std::env::var("SPANPROF_EXPECT_FRAME_POINTERS").as_deref() {
        Ok("1") => assert_eq!(has, Some(true)),
        Ok("0") => assert_eq!(has, Some(false)),
        _ => eprintln!("frame pointers: {has:?} (SPANPROF_EXPECT_FRAME_POINTERS unset)"),
    }
}

#[test]
fn small_allocations_keep_their_caller_and_root() {
    let profiler = profiler();
    let q = measure(
        &profiler,
        "small_allocations",
        1,
        Duration::from_millis(1500),
    );
    profiler.stop();
    assert_whole("small_allocations", &q);
}

#[test]
fn serde_json_keeps_its_caller_and_root() {
    let profiler = profiler();
    let q = measure(&profiler, "serde_json", 2, Duration::from_millis(1500));
    profiler.stop();
    assert_whole("serde_json", &q);
}

#[test]
fn a_c_library_keeps_its_caller_and_root() {
    let profiler = profiler();
    let q = measure(&profiler, "zlib_c_library", 3, Duration::from_millis(1500));
    profiler.stop();
    assert_whole("zlib_c_library", &q);
}
