//! spanprof's OpenTelemetry process context (OTEP 4719) and thread context (OTEP
//! 4947), read from another process as a profiler reads them (`otel-ctx-reader`),
//! while a loaded axum service built with the feature `otel-thread-ctx` (`src/main.rs`)
//! serves labelled requests: every record read must be that of a span in flight at
//! the instant of the read, with its route and span name.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use otel_ctx_reader::{
    ProcessContextError, ThreadContextReader, ThreadRead, context_mappings, read_process_context,
};

/// The service under test, started from its binary.
struct Service {
    child: Child,
    stdin: Option<ChildStdin>,
    port: u16,
    spans_file: std::path::PathBuf,
}

impl Service {
    fn start(sampling: &str) -> Service {
        let spans_file = std::env::temp_dir().join(format!(
            "spanprof-otel-ctx-{}-{sampling}.spans",
            std::process::id()
        ));
        let mut child = Command::new(env!("CARGO_BIN_EXE_otel_ctx_service"))
            .arg(&spans_file)
            .arg(sampling)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the service");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the service's port");
        let port = line
            .trim()
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok());
        Service {
            stdin: child.stdin.take(),
            child,
            port: port.unwrap_or_else(|| panic!("the service said {line:?}")),
            spans_file,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Stops the service and returns the spans it exported: (trace id, span id) to
    /// (start, end in Unix ns, name).
    fn stop(mut self) -> HashMap<(String, String), (u128, u128, String)> {
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait for the service");
        assert!(status.success(), "the service failed: {status}");
        let text = std::fs::read_to_string(&self.spans_file).expect("spans file");
        let _ = std::fs::remove_file(&self.spans_file);
        text.lines()
            .map(|l| {
                let f: Vec<&str> = l.splitn(5, ' ').collect();
                (
                    (f[0].to_owned(), f[1].to_owned()),
                    (
                        f[2].parse().unwrap(),
                        f[3].parse().unwrap(),
                        f[4].to_owned(),
                    ),
                )
            })
            .collect()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `GET /work/{n}` from `clients` concurrent clients until `stop`.
fn load(port: u16, clients: usize, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<http_body_util::Empty<bytes::Bytes>>();
            let tasks: Vec<_> = (0..clients)
                .map(|c| {
                    let client = client.clone();
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        let mut sent = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            let uri =
                                format!("http://127.0.0.1:{port}/work/{}", sent * 7 + c as u64);
                            let res = client.get(uri.parse().unwrap()).await.expect("request");
                            assert!(res.status().is_success(), "{}", res.status());
                            http_body_util::BodyExt::collect(res.into_body())
                                .await
                                .expect("body");
                            sent += 1;
                        }
                        sent
                    })
                })
                .collect();
            let mut sent = 0;
            for t in tasks {
                sent += t.await.unwrap();
            }
            sent
        })
    })
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// What the reads found, against the spans the service exported.
#[derive(Debug, Default)]
struct Agreement {
    reads: usize,
    empty: usize,
    invalid: usize,
    records: usize,
    /// Records of a span exported with start <= read <= end, whose route and span
    /// name decode to the span's.
    in_flight: usize,
    /// Records of a span that had ended when read.
    ended: usize,
    /// Records of no exported span.
    unknown: usize,
    /// Records whose attributes do not match their span's.
    wrong_names: usize,
    examples: Vec<String>,
}

/// Reads the threads of the service under load for `seconds` and compares each read
/// with the spans exported.
fn reads_against_spans(sampling: &str, seconds: f64) -> Agreement {
    let service = Service::start(sampling);
    let pid = service.pid();
    let cx = read_process_context(pid).expect("a process context");
    let reader =
        ThreadContextReader::new(pid, cx.attribute_key_map()).expect("otel_thread_ctx_v1 exported");
    let stop = Arc::new(AtomicBool::new(false));
    let load = load(service.port, 6, stop.clone());
    let mut reads = Vec::new();
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        for (tid, name) in reader.threads() {
            if !name.starts_with("tokio-rt") {
                continue;
            }
            if let Ok((read, at)) = reader.read(tid, unix_ns) {
                reads.push((read, at));
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    stop.store(true, Ordering::Relaxed);
    let sent = load.join().expect("load");
    assert!(sent > 50, "only {sent} requests were served");
    let spans = service.stop();
    let inner: std::collections::HashSet<String> = spans
        .iter()
        .filter(|(_, (_, _, name))| name == "crunch")
        .map(|((trace, _), _)| trace.clone())
        .collect();
    let mut a = Agreement {
        reads: reads.len(),
        ..Agreement::default()
    };
    for (read, at) in reads {
        let r = match read {
            ThreadRead::Empty => {
                a.empty += 1;
                continue;
            }
            ThreadRead::Invalid(_) => {
                a.invalid += 1;
                continue;
            }
            ThreadRead::Record(r) => r,
        };
        a.records += 1;
        let Some((start, end, name)) = spans.get(&(r.trace_id.clone(), r.span_id.clone())) else {
            a.unknown += 1;
            if a.examples.len() < 5 {
                a.examples.push(format!("no exported span: {r:?}"));
            }
            continue;
        };
        if at > *end {
            a.ended += 1;
            if a.examples.len() < 5 {
                a.examples
                    .push(format!("read {} ns after its span ended: {r:?}", at - end));
            }
            continue;
        }
        // The ids are the request's (the local root's); the span name is the span
        // being polled: the request's, or its inner span's.
        let names_ok = (r.attribute("span.name") == Some(name.as_str())
            || r.attribute("span.name") == Some("crunch") && inner.contains(&r.trace_id))
            && r.attribute("http.route") == Some("/work/{n}")
            && r.trace_flags == 1;
        if !names_ok {
            a.wrong_names += 1;
            if a.examples.len() < 5 {
                a.examples.push(format!("span {name}: {r:?}"));
            }
            continue;
        }
        if *start <= at {
            a.in_flight += 1;
        }
    }
    a
}

#[track_caller]
fn assert_agreement(a: &Agreement) {
    assert!(a.records >= 200, "too few records read to judge: {a:#?}");
    let agree = a.in_flight as f64 / a.records as f64;
    assert!(
        agree >= 0.99,
        "only {agree:.4} of the records read were of a span in flight, with its names: {a:#?}"
    );
    assert_eq!(a.ended, 0, "records of spans that had ended: {a:#?}");
    eprintln!("{} reads: {a:?} (agreement {agree:.4})", a.reads);
}

#[test]
fn an_outside_reader_reads_the_span_each_thread_polls_in_labels_only_mode() {
    assert_agreement(&reads_against_spans("labels-only", 4.0));
}

#[test]
fn an_outside_reader_reads_the_span_each_thread_polls_beside_the_in_process_sampler() {
    assert_agreement(&reads_against_spans("in-process", 3.0));
}

#[test]
fn the_process_context_carries_the_resource_and_the_thread_contexts_key_map() {
    let service = Service::start("labels-only");
    let before = otel_ctx_reader::boottime_ns();
    let cx = read_process_context(service.pid()).expect("a process context");
    assert!(
        cx.published_at_ns > 0 && cx.published_at_ns <= before,
        "published at {} (now {before})",
        cx.published_at_ns
    );
    // The tracer provider's Resource, set after the profiler published a first one:
    // the update reached the mapping.
    assert_eq!(
        cx.resource_string("service.name").as_deref(),
        Some("otel-ctx-test")
    );
    assert_eq!(
        cx.resource_string("service.instance.id").as_deref(),
        Some("instance-42")
    );
    assert_eq!(cx.schema_version().as_deref(), Some("tlsdesc_v1_dev"));
    assert_eq!(cx.attribute_key_map(), ["http.route", "span.name"]);
    assert_eq!(
        context_mappings(service.pid()).len(),
        1,
        "one process context"
    );
}

#[test]
fn a_forked_child_does_not_inherit_the_process_context() {
    let service = Service::start("labels-only");
    assert!(read_process_context(service.pid()).is_ok());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let child: i32 = rt.block_on(async {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Empty<bytes::Bytes>>();
        let res = client
            .get(
                format!("http://127.0.0.1:{}/fork", service.port)
                    .parse()
                    .unwrap(),
            )
            .await
            .expect("fork request");
        let body = http_body_util::BodyExt::collect(res.into_body())
            .await
            .unwrap()
            .to_bytes();
        String::from_utf8_lossy(&body)
            .parse()
            .expect("the child's pid")
    });
    assert!(child > 0, "fork failed");
    // The child is a copy of the service (the same executable, its memory but for
    // mappings marked MADV_DONTFORK), sleeping.
    let maps = std::fs::read_to_string(format!("/proc/{child}/maps")).expect("the child's maps");
    assert!(
        maps.contains("otel_ctx_service"),
        "not the service's child:\n{maps}"
    );
    assert!(
        !maps.contains("OTEL_CTX"),
        "the child inherited the mapping:\n{maps}"
    );
    assert_eq!(
        read_process_context(child),
        Err(ProcessContextError::NoMapping)
    );
    assert!(
        read_process_context(service.pid()).is_ok(),
        "the parent keeps its context"
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child),
        nix::sys::signal::Signal::SIGKILL,
    );
}
