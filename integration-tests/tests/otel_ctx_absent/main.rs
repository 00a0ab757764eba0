//! A service built without the feature `otel-thread-ctx` shows an outside reader
//! nothing: no process context mapping, no `otel_thread_ctx_v1` symbol. (The
//! feature's own tests are in `integration-tests/otel-ctx`, a package of its own so
//! that this one is built without it.)

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use otel_ctx_reader::{ProcessContextError, ThreadContextReader, read_process_context};
use spanprof::{Profiler, SpanLabels, WithSpanLabels};

const SERVE: &str = "SPANPROF_OTEL_CTX_ABSENT_SERVE";

/// In the child: the profiler and labelled work, until standard input closes.
fn serve() {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder.worker_threads(2).enable_all().build().unwrap();
    let profiler = Profiler::builder().start().expect("profiler");
    rt.spawn(async {
        for i in 1u64.. {
            let labels = SpanLabels::builder()
                .trace_id(u128::from(i))
                .span_id(i)
                .span_name("GET /work")
                .route("/work")
                .build();
            async {
                std::hint::black_box((0..10_000u64).sum::<u64>());
                tokio::task::yield_now().await;
            }
            .with_span_labels(labels)
            .await;
        }
    });
    println!("ready");
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().lines().count();
    profiler.stop();
}

#[test]
fn a_service_without_the_feature_publishes_no_context() {
    if std::env::var_os(SERVE).is_some() {
        return serve();
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "a_service_without_the_feature_publishes_no_context",
            "--exact",
            "--nocapture",
        ])
        .env(SERVE, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the service");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the service exited");
    }
    std::thread::sleep(Duration::from_millis(200));
    let pid = child.id() as i32;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(!maps.contains("OTEL_CTX"), "{maps}");
    assert_eq!(
        read_process_context(pid),
        Err(ProcessContextError::NoMapping)
    );
    assert!(
        ThreadContextReader::new(pid, Vec::new()).is_none(),
        "the executable exports otel_thread_ctx_v1"
    );
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}
