//! The pprof sinks read by the real `go tool pprof`: periodic files, and the
//! `/debug/spanprof/profile` endpoint fetched by `go tool pprof` itself.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use spanprof::Profiler;
use spanprof_export::{PprofFileConfig, PprofFileExporter, ProfileSource};
use spanprof_viewer::debug_router;
use support::{go_pprof, labelled_burn, top_function, total_ns};

#[test]
fn periodic_files_read_by_go_tool_pprof() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let dir = support::artifact_dir().join(format!("pprof-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = PprofFileConfig::new(&dir);
    cfg.interval = Duration::from_millis(500);
    let files = PprofFileExporter::start(cfg, ProfileSource::profiler(&profiler)).unwrap();
    let (cpu_ns, labels) = labelled_burn(1500);
    profiler.flush();
    let written = files.shutdown(Duration::from_secs(5));
    profiler.stop();
    assert!(written.len() >= 3, "{written:?}");
    let mut names: Vec<_> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_owned())
        .collect();
    let sorted = {
        let mut s = names.clone();
        s.sort();
        s
    };
    assert_eq!(names, sorted, "file names sort by time");
    names.dedup();
    let paths: Vec<&str> = written.iter().map(|p| p.to_str().unwrap()).collect();

    let mut args = vec!["-tags"];
    args.extend(&paths);
    let tags = go_pprof(&args);
    for key in ["span_id:", "trace_id:", "span_name:", "route:"] {
        assert!(tags.contains(key), "-tags lacks {key}:\n{tags}");
    }
    for (class, l) in labels.iter().enumerate() {
        let focus = format!("-tagfocus=span_id=^{}$", l.span_id_hex());
        let mut args = vec!["-top", focus.as_str()];
        args.extend(&paths);
        let top = go_pprof(&args);
        let f = top_function(&top);
        assert!(f.ends_with(&format!("burn_class_{class}")), "{f}\n{top}");
    }
    // Total CPU of the two spans (one sampled at 1 kHz, one at 99 Hz, each sample
    // weighted by its period) matches their threads' CPU time within 10 %.
    let focus = format!(
        "-tagfocus=span_id=^({}|{})$",
        labels[0].span_id_hex(),
        labels[1].span_id_hex()
    );
    let mut args = vec!["-top", focus.as_str()];
    args.extend(&paths);
    let top = go_pprof(&args);
    let total = total_ns(&top);
    let ratio = total as f64 / cpu_ns as f64;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "pprof total {total} ns vs CPU {cpu_ns} ns ({ratio:.3})"
    );
}

#[test]
fn debug_endpoint_is_fetched_by_go_tool_pprof() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = debug_router(profiler.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    });
    let burner = std::thread::spawn(|| labelled_burn(2500));
    std::thread::sleep(Duration::from_millis(200));
    let url = format!("http://{addr}/debug/spanprof/profile?seconds=2");
    let tags = go_pprof(&["-tags", &url]);
    assert!(
        tags.contains("span_id:") && tags.contains("trace_id:"),
        "{tags}"
    );
    let (_, labels) = burner.join().unwrap();
    assert!(tags.contains(&labels[0].span_id_hex()), "{tags}");

    // A span's profile from the store.
    let url = format!(
        "http://{addr}/debug/spanprof/profile?span_id={}",
        labels[1].span_id_hex()
    );
    let top = go_pprof(&["-top", &url]);
    assert!(top_function(&top).ends_with("burn_class_1"), "{top}");

    // Bad and unknown ids get clear errors.
    let (bad, missing) = rt.block_on(async {
        let bad = support::web::http_get(
            &format!("http://{addr}/debug/spanprof/profile?span_id=zz"),
            &[],
        )
        .await;
        let missing = support::web::http_get(
            &format!("http://{addr}/debug/spanprof/profile?span_id=00000000deadbeef"),
            &[],
        )
        .await;
        (bad, missing)
    });
    assert_eq!(bad.0, 400, "{}", bad.1);
    assert!(bad.1.contains("span_id"), "{}", bad.1);
    assert_eq!(missing.0, 404, "{}", missing.1);
    profiler.stop();
}

/// pprof files join the other sinks: in a `Sinks`, stopped with them within one
/// deadline, with the last interval's file written and counted.
#[test]
fn pprof_files_stop_with_the_other_sinks() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let dir = support::artifact_dir().join(format!("pprof-sinks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut sinks = spanprof_export::Sinks::new();
    sinks.push(
        PprofFileExporter::start(
            PprofFileConfig::new(&dir)
                .interval(Duration::from_secs(60))
                .max_files(3),
            ProfileSource::profiler(&profiler),
        )
        .unwrap(),
    );
    labelled_burn(200);
    profiler.flush();
    let started = std::time::Instant::now();
    let stats = sinks.shutdown(Duration::from_secs(5));
    profiler.stop();
    assert!(started.elapsed() < Duration::from_secs(5), "{stats:?}");
    assert_eq!(stats.len(), 1);
    let (name, stats) = stats[0];
    assert_eq!(name, "pprof-files");
    assert_eq!((stats.sent, stats.dropped()), (1, 0), "{stats:?}");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "the last interval's file: {files:?}");
}
