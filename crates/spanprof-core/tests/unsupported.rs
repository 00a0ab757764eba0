//! The stand-in built where the sampler is not (every target but Linux). Here it
//! is built on Linux with `RUSTFLAGS="--cfg spanprof_force_unsupported"`, the
//! way `scripts/test` does; in a normal build only the guard below runs.

/// `scripts/test` sets `SPANPROF_EXPECT_STAND_IN=1` when it builds the stand-in:
/// if the cfg got lost on the way (another variable overriding `RUSTFLAGS`), the
/// tests below would silently not exist, so this one fails instead.
#[test]
fn the_stand_in_is_built_when_the_test_script_asks_for_it() {
    let asked = std::env::var_os("SPANPROF_EXPECT_STAND_IN").is_some();
    if asked && !cfg!(spanprof_force_unsupported) {
        panic!(
            "SPANPROF_EXPECT_STAND_IN is set but --cfg spanprof_force_unsupported did not arrive"
        );
    }
}

#[cfg(spanprof_force_unsupported)]
use spanprof_core::{
    Profiler, ProfilerBuilder, ProfilerError, SpanLabels, WithSpanLabels, current_labels,
    register_current_thread,
};

#[cfg(spanprof_force_unsupported)]
#[test]
fn starting_a_profiler_says_clearly_that_profiling_is_unavailable() {
    let err = ProfilerBuilder::new()
        .start()
        .expect_err("no sampler on this build");
    assert!(matches!(err, ProfilerError::Unsupported(_)), "{err:?}");
    assert!(
        err.to_string().contains("only implemented on Linux"),
        "{err}"
    );
    assert!(matches!(
        Profiler::current_or_start(),
        Err(ProfilerError::Unsupported(_))
    ));
    assert!(Profiler::current().is_none());
    assert!(!register_current_thread(), "no thread is ever armed");
}

#[cfg(spanprof_force_unsupported)]
#[test]
fn labels_still_follow_every_poll() {
    let labels = SpanLabels::builder()
        .trace_id(0x4bf92f3577b34da6a3ce929d0e0e4736)
        .span_id(0x00f067aa0ba902b7)
        .span_name("checkout")
        .route("/checkout")
        .build();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let seen = rt.block_on(
        async {
            let first = current_labels().map(|l| l.span_id());
            tokio::task::yield_now().await;
            let second = current_labels().map(|l| l.span_id());
            (first, second)
        }
        .with_span_labels(labels.clone()),
    );
    assert_eq!(seen, (Some(0x00f067aa0ba902b7), Some(0x00f067aa0ba902b7)));
    assert!(current_labels().is_none(), "popped after the poll");
}
