//! SIGTERM and SIGINT stop the example cleanly at any time, during the built-in load
//! too: it stops accepting, finishes what is in flight, flushes the last profile
//! interval and the spans, and exits 0.

use std::time::{Duration, Instant};

use crate::support::{Collector, Example, checkout};

/// When the signal is sent.
enum When {
    DuringLoad,
    Idle,
}

fn stops_cleanly(signal: &str, when: When) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let collector = Collector::default();
    let endpoint = rt.block_on(collector.start());
    let load = match when {
        When::DuringLoad => "60s",
        When::Idle => "0",
    };
    let mut ex = Example::spawn(
        &["--listen", "127.0.0.1:0", "--load", load],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
    );
    let (api, _, _) = ex.addresses();
    match when {
        When::DuringLoad => {
            ex.line("load", Duration::from_secs(60));
        }
        When::Idle => {
            ex.viewer_url(Duration::from_secs(60));
            rt.block_on(async {
                for i in 0..5 {
                    let (status, body) = checkout(api, i).await.unwrap();
                    assert_eq!(status, 200, "{body}");
                }
            });
        }
    }
    // Some seconds of work, and fewer than the 10 s export interval since the start:
    // only a flush at shutdown exports a profile.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        collector.profile_exports().is_empty(),
        "no interval ended yet"
    );
    let sent = Instant::now();
    ex.signal(signal);
    let status = ex.wait(Duration::from_secs(30)).unwrap_or_else(|| {
        panic!(
            "still running 30 s after SIG{signal}:\n{}\n{}",
            ex.stdout(),
            ex.stderr()
        )
    });
    let (out, err) = (ex.stdout(), ex.stderr());
    assert!(status.success(), "SIG{signal}: exit {status}\n{out}\n{err}");
    assert!(
        collector.profile_exports().iter().any(|t| *t >= sent),
        "the last profile interval was exported at shutdown\n{out}\n{err}"
    );
    assert!(
        collector.spans().iter().any(|s| s.name == "POST /checkout"),
        "spans were exported\n{out}\n{err}"
    );
    if let When::DuringLoad = when {
        let done = out
            .lines()
            .find(|l| l.starts_with("load stopped"))
            .unwrap_or_else(|| panic!("a `load stopped` line:\n{out}"));
        assert!(
            done.contains(" 0 errors"),
            "requests in flight were finished, not cut: {done}"
        );
    }
    assert!(
        out.lines().any(|l| l.starts_with("stopped")),
        "a final `stopped` line:\n{out}"
    );
}

#[test]
fn sigterm_during_the_load_drains_and_flushes() {
    stops_cleanly("TERM", When::DuringLoad);
}

#[test]
fn sigint_during_the_load_drains_and_flushes() {
    stops_cleanly("INT", When::DuringLoad);
}

#[test]
fn sigterm_when_idle_drains_and_flushes() {
    stops_cleanly("TERM", When::Idle);
}

/// `go tool pprof` asks for 30 s by default: a capture open at SIGTERM is answered at
/// once with what it collected, and the shutdown keeps its one deadline instead of
/// waiting for the capture's end.
#[test]
fn sigterm_with_a_profile_capture_open_answers_it_and_stops_in_time() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let collector = Collector::default();
    let endpoint = rt.block_on(collector.start());
    let mut ex = Example::spawn(
        &[
            "--listen",
            "127.0.0.1:0",
            "--viewer",
            "127.0.0.1:0",
            "--load",
            "0",
        ],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
    );
    let (api, _, _) = ex.addresses();
    let viewer = ex.viewer_url(Duration::from_secs(60));
    let url = format!("{viewer}profile?seconds=60");
    let capture = rt.spawn(async move { crate::support::get(&url).await });
    rt.block_on(async {
        for i in 0..3 {
            let (status, body) = checkout(api, i).await.unwrap();
            assert_eq!(status, 200, "{body}");
        }
    });
    // The capture is open by now.
    std::thread::sleep(Duration::from_secs(1));
    ex.signal("TERM");
    let status = ex.wait(Duration::from_secs(30));
    let (out, err) = (ex.stdout(), ex.stderr());
    assert!(
        status.is_some_and(|s| s.success()),
        "not stopped within 30 s of SIGTERM with a 60 s capture open: {status:?}\n{out}\n{err}"
    );
    let (status, body) = rt
        .block_on(capture)
        .unwrap()
        .expect("the capture was answered");
    assert_eq!(status, 200, "{body}");
    let stopped = out
        .lines()
        .find(|l| l.starts_with("stopped"))
        .unwrap_or_else(|| panic!("a `stopped` line:\n{out}"));
    assert!(stopped.contains("requests drained"), "{stopped}");
    assert!(stopped.contains("spans flushed"), "{stopped}");
}

/// A collector that is down for a while: the example says so once as it begins and
/// once as it ends, keeps the spans of the outage and sends them once the collector
/// is up, and its `stopped` line says every span was flushed.
#[test]
fn a_span_collector_outage_is_logged_and_loses_no_span() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Reserve a port, then free it: the collector is down for now.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut ex = Example::spawn(
        &[
            "--listen",
            "127.0.0.1:0",
            "--viewer",
            "127.0.0.1:0",
            "--load",
            "0",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{addr}")),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );
    let (api, _, _) = ex.addresses();
    let checkouts = |from: u64| {
        rt.block_on(async {
            for i in from..from + 3 {
                let (status, body) = checkout(api, i).await.unwrap();
                assert_eq!(status, 200, "{body}");
            }
        })
    };
    checkouts(0);
    let end = Instant::now() + Duration::from_secs(30);
    while !ex.stderr().contains("otlp-spans sink is failing") && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    // The collector comes up; later spans get through.
    let collector = Collector::default();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let me = collector.clone();
        tokio::spawn(async move {
            use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(me))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
    });
    let end = Instant::now() + Duration::from_secs(30);
    let mut seed = 10;
    while collector.spans().is_empty() && Instant::now() < end {
        checkouts(seed);
        seed += 3;
        std::thread::sleep(Duration::from_millis(300));
    }
    ex.signal("TERM");
    let status = ex.wait(Duration::from_secs(30));
    let (out, err) = (ex.stdout(), ex.stderr());
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{out}\n{err}"
    );
    let warned = |needle: &str| {
        err.lines()
            .filter(|l| l.contains(" WARN ") && l.contains(needle))
            .count()
    };
    assert_eq!(warned("otlp-spans sink is failing"), 1, "{err}");
    assert_eq!(warned("otlp-spans sink recovered"), 1, "{err}");
    // The checkouts made while the collector was down arrived too.
    let spans = collector.spans();
    assert!(
        spans.iter().filter(|s| s.name == "POST /checkout").count() >= 6,
        "{} spans, of which the outage's:\n{out}\n{err}",
        spans.len()
    );
    let stopped = out
        .lines()
        .find(|l| l.starts_with("stopped"))
        .unwrap_or_else(|| panic!("a `stopped` line:\n{out}"));
    assert!(stopped.contains("spans flushed"), "{stopped}");
}

/// A collector that accepts connections and never answers, and a shorter deadline
/// given with `--stop-deadline`: the example exits within it (plus the process's own
/// start of exit), not after the default 8 s, and says the spans were not all sent.
#[test]
fn a_hung_collector_is_given_no_more_than_the_stop_deadline() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = hung.local_addr().unwrap();
    std::thread::spawn(move || {
        // Held open, never read from or answered.
        let held: Vec<_> = hung.incoming().collect();
        drop(held);
    });
    let mut ex = Example::spawn(
        &[
            "--listen",
            "127.0.0.1:0",
            "--viewer",
            "127.0.0.1:0",
            "--load",
            "0",
            "--stop-deadline",
            "2s",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{addr}")),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );
    let (api, _, _) = ex.addresses();
    rt.block_on(async {
        for i in 0..3 {
            let (status, body) = checkout(api, i).await.unwrap();
            assert_eq!(status, 200, "{body}");
        }
    });
    let signalled = Instant::now();
    ex.signal("TERM");
    let status = ex.wait(Duration::from_secs(30));
    let took = signalled.elapsed();
    let (out, err) = (ex.stdout(), ex.stderr());
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{out}\n{err}"
    );
    // The default deadline is 8 s: well past this bound.
    assert!(
        took < Duration::from_secs(5),
        "stopped {took:?} after SIGTERM with --stop-deadline 2s\n{out}\n{err}"
    );
    let stopped = out
        .lines()
        .find(|l| l.starts_with("stopped"))
        .unwrap_or_else(|| panic!("a `stopped` line:\n{out}"));
    assert!(!stopped.contains("spans flushed"), "{stopped}");
}

#[test]
fn a_stop_deadline_too_short_to_flush_is_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_checkout"))
        .args(["--stop-deadline", "100ms"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--stop-deadline: at least 1s"), "{err}");
}
