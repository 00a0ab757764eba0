//! Issue 2's attribution test: on a 2-worker runtime, 32 concurrent tasks in 8
//! classes migrate between workers; of the samples whose stack holds class k's
//! function, at least 99 % must carry class k's span labels.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use spanprof::Profiler;
use spanprof_workloads::{Mode, Workload, run_and_score};
use support::{assert_attribution, assert_migrated};

fn workload(mode: Mode) -> Workload {
    Workload {
        duration: Duration::from_secs(3),
        mode,
        ..Workload::default()
    }
}

#[test]
fn wrapped_tasks_are_attributed_across_migrations() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let o = run_and_score(&workload(Mode::Wrapper), &profiler, true);
    profiler.stop();
    assert_migrated(&o, "wrapper");
    assert_attribution(&o, "wrapper");
}

/// The wrapper alone, with no tokio hooks at all: what a build without
/// `tokio_unstable` (or a runtime someone else built) gets.
#[test]
fn wrapper_path_alone_is_attributed() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let o = run_and_score(&workload(Mode::Wrapper), &profiler, false);
    profiler.stop();
    assert_migrated(&o, "wrapper only");
    assert_attribution(&o, "wrapper only");
}

#[test]
fn joined_futures_inside_one_request_are_attributed() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let o = run_and_score(&workload(Mode::Joined), &profiler, true);
    profiler.stop();
    assert_migrated(&o, "joined");
    assert_attribution(&o, "joined");
}

/// Tasks spawned from inside a labelled task inherit its labels through the tokio
/// hooks: the children have no wrapper of their own.
#[cfg(tokio_unstable)]
#[test]
fn spawned_tasks_inherit_labels() {
    let _serial = support::serial();
    let before = spanprof::stats::inheritance_stats();
    let profiler = Profiler::builder().start().expect("profiler");
    let o = run_and_score(&workload(Mode::Inherit), &profiler, true);
    profiler.stop();
    assert_migrated(&o, "inherit");
    assert_attribution(&o, "inherit");
    let after = spanprof::stats::inheritance_stats();
    assert!(after.inherited - before.inherited >= 32, "{after:?}");
    assert_eq!(after.live, 0, "every inherited label released at terminate");
    assert_eq!(after.overflowed, 0);
}

/// Without the hooks, spawned children lose their labels: this is what the hooks
/// are for, and it shows the inherit test above can fail.
#[test]
fn without_hooks_spawned_children_are_unlabelled() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let o = run_and_score(&workload(Mode::Inherit), &profiler, false);
    profiler.stop();
    // Unlabelled children are cold work: the baseline timer samples them (99 per
    // CPU-second; each poll is ~1 ms of CPU), not the parents' high rate.
    let expected = o.polls as f64 / 1000.0 * 99.0;
    assert!(
        o.samples as f64 > 0.4 * expected,
        "{expected:.0} expected: {o:?}"
    );
    assert!(
        o.frac(o.unlabeled) > 0.9,
        "children should be unlabelled: {o:?}"
    );
}

/// `spawn_blocking` work started in a labelled context is labelled.
#[test]
fn spawn_blocking_keeps_labels() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder.worker_threads(2).enable_all().build().unwrap();
    let labels = spanprof_workloads::class_labels(3, 0, true);
    let span = labels.span_id();
    rt.block_on(spanprof::WithSpanLabels::with_span_labels(
        async {
            spanprof::spawn_blocking(|| {
                // CPU time, not wall time: on a loaded machine 500 ms of wall time
                // can be well under the 100 ms of CPU the assertions need.
                let start = spanprof::stats::thread_cpu_time();
                while spanprof::stats::thread_cpu_time() - start < Duration::from_millis(300) {
                    spanprof_workloads::BURNERS[3].1(10_000);
                }
            })
            .await
            .unwrap();
        },
        labels,
    ));
    drop(rt);
    profiler.flush();
    let p = profiler
        .store()
        .span(span)
        .expect("samples of the blocking work");
    profiler.stop();
    assert!(
        p.cpu_ns_in("burn_class_3") * 10 >= p.cpu_ns() * 9,
        "{:?}",
        p.top_functions(5)
    );
    assert!(p.sample_count() >= 100, "{}", p.sample_count());
}

/// `Profile::by_span` answers "which span did this CPU go to" without walking samples:
/// each span's row names the function that burned its CPU.
#[test]
fn by_span_names_each_spans_own_work() {
    let profiler = spanprof::Profiler::current_or_start().expect("profiler");
    let (_, labels) = support::labelled_burn(300);
    profiler.flush();
    let rows = profiler
        .store()
        .process(std::time::Duration::from_secs(60))
        .by_span(3);
    for (class, l) in labels.iter().enumerate() {
        let row = rows
            .iter()
            .find(|r| r.labels.as_ref().is_some_and(|x| x.span_id == l.span_id()))
            .unwrap_or_else(|| panic!("no row for span {class}: {rows:?}"));
        let burner = spanprof_workloads::BURNERS[class].0;
        assert!(row.samples > 0 && row.cpu_ns > 0, "{row:?}");
        assert!(
            row.top_functions
                .iter()
                .any(|f| f.function.contains(burner)),
            "span {class}'s top functions miss {burner}: {:?}",
            row.top_functions
        );
        let other = spanprof_workloads::BURNERS[1 - class].0;
        assert!(
            !row.top_functions.iter().any(|f| f.function.contains(other)),
            "span {class} got {other}: {:?}",
            row.top_functions
        );
    }
    // Heaviest first.
    assert!(rows.windows(2).all(|w| w[0].cpu_ns >= w[1].cpu_ns));
}
