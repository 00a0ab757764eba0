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
