//! What the network sinks say, against real servers on 127.0.0.1: one line at start
//! (where they send, as which service), one when a handle stops them having sent
//! nothing, and an outage logged once as it begins and once as it ends (with what it
//! cost), never once per retry.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use spanprof_export::{
    DeliveryConfig, OtlpProfilesConfig, OtlpProfilesExporter, OtlpProtocol, PyroscopeConfig,
    PyroscopeExporter,
};
use support::receiver::{Receiver, Reply, numbered_source};

use support::global_logs as logs;

/// The lines at `level` (`INFO`, `WARN`) that contain `needle`.
fn lines(level: &str, needle: &str) -> Vec<String> {
    logs()
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with(level) && l.contains(needle))
        .cloned()
        .collect()
}

/// Waits (up to 20 s) until `done`; the assertions after it say what was missing.
fn wait_until(done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn fast_delivery() -> DeliveryConfig {
    let mut d = DeliveryConfig::default();
    d.queue_capacity = 4;
    d.max_attempts = None;
    d.base_backoff = Duration::from_millis(50);
    d.max_backoff = Duration::from_millis(200);
    d.request_timeout = Duration::from_millis(500);
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sink_says_where_it_sends_and_as_which_service_at_start() {
    logs();
    let receiver = Receiver::start(vec![]).await;
    let mut cfg = PyroscopeConfig::new(receiver.url());
    cfg.service_name = "shop-api".into();
    let pyroscope = PyroscopeExporter::start(cfg, numbered_source()).unwrap();
    let mut cfg = OtlpProfilesConfig::new(
        format!("{}/v1development/profiles", receiver.url()),
        OtlpProtocol::HttpProtobuf,
    );
    cfg.service_name = "shop-api".into();
    let otlp = OtlpProfilesExporter::start(cfg, numbered_source()).unwrap();
    let started = lines("INFO", "spanprof: sending profiles");
    assert_eq!(started.len(), 2, "{started:?}");
    for what in ["Pyroscope", "OTLP profiles"] {
        let line = started
            .iter()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("a line for {what}: {started:?}"));
        assert!(
            line.contains(&receiver.url()) && line.contains("shop-api"),
            "{line}"
        );
    }
    tokio::task::spawn_blocking(move || {
        pyroscope.shutdown(Duration::from_secs(1));
        otlp.shutdown(Duration::from_secs(1));
    })
    .await
    .unwrap();
}

/// The front page's snippet once bound the exporter inside an `if let` block: it was
/// dropped, and so stopped, at the end of the block, before its first push, and said
/// nothing. Now the stop says what happened and what to keep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_stopped_before_it_sent_anything_says_so() {
    logs();
    let receiver = Receiver::start(vec![]).await;
    if let Ok(exporter) =
        PyroscopeExporter::start(PyroscopeConfig::new(receiver.url()), numbered_source())
    {
        let _pyroscope = exporter;
    }
    let found = lines("WARN", "sent nothing");
    assert_eq!(found.len(), 1, "{:?}", lines("", "spanprof:"));
    assert!(
        found[0].contains("pyroscope") && found[0].contains("alive"),
        "{}",
        found[0]
    );
    assert!(receiver.received().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_logged_once_as_it_begins_and_once_as_it_ends() {
    logs();
    // 5xx for a while (each retried), then accepted.
    let receiver = Receiver::start(vec![Reply::Status(503, "down for maintenance"); 12]).await;
    let mut cfg = PyroscopeConfig::new(receiver.url());
    cfg.interval = Duration::from_millis(100);
    cfg.delivery = fast_delivery();
    let exporter = PyroscopeExporter::start(cfg, numbered_source()).unwrap();
    wait_until(|| exporter.stats().sent >= 3);
    let stats = tokio::task::spawn_blocking(move || exporter.shutdown(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(
        receiver.received().len() >= 15,
        "12 refused, then sent: {stats:?}"
    );
    let failing = lines("WARN", "is failing");
    assert_eq!(failing.len(), 1, "{:?}", lines("", "spanprof:"));
    assert!(
        failing[0].contains("pyroscope") && failing[0].contains("503"),
        "{}",
        failing[0]
    );
    let recovered = lines("WARN", "recovered");
    assert_eq!(recovered.len(), 1, "{:?}", lines("", "spanprof:"));
    assert!(recovered[0].contains("dropped"), "{}", recovered[0]);
}

/// A receiver that refuses connections (closed port) is an outage too; its stop says
/// what never arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_collector_is_reported_while_it_stays_closed() {
    logs();
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = OtlpProfilesConfig::new(
        format!("http://{addr}/v1development/profiles"),
        OtlpProtocol::HttpProtobuf,
    );
    cfg.interval = Duration::from_millis(100);
    cfg.delivery = fast_delivery();
    let exporter = OtlpProfilesExporter::start(cfg, numbered_source()).unwrap();
    wait_until(|| !lines("WARN", "is failing").is_empty());
    let stats = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(800));
        exporter.shutdown(Duration::from_millis(100))
    })
    .await
    .unwrap();
    assert_eq!(stats.sent, 0, "{stats:?}");
    assert!(stats.dropped() > 0, "{stats:?}");
    let failing = lines("WARN", "is failing");
    assert_eq!(failing.len(), 1, "{:?}", lines("", "spanprof:"));
    assert!(failing[0].contains("otlp-profiles"), "{}", failing[0]);
    let stopped = lines("WARN", "sent nothing");
    assert_eq!(stopped.len(), 1, "{:?}", lines("", "spanprof:"));
    assert!(stopped[0].contains("dropped"), "{}", stopped[0]);
}

/// A failing send is worded as what happened to the connection: a closed port is
/// "connection refused" over gRPC and HTTP alike (tonic's own text was `code: 'The
/// service is currently unavailable', message: "tcp connect error", …`), and a
/// server that accepts and closes at once is "connection closed by the server" or
/// "connection reset", never `Unknown … BrokenPipe`.
#[test]
fn failures_are_worded_as_what_happened_to_the_connection() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // A server that accepts and closes every connection at once.
    let hangs_up = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hangs_up_addr = hangs_up.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in hangs_up.incoming() {
            drop(conn);
        }
    });
    let endpoint = |addr: std::net::SocketAddr, protocol| match protocol {
        OtlpProtocol::Grpc => format!("http://{addr}"),
        OtlpProtocol::HttpProtobuf => format!("http://{addr}/v1development/profiles"),
    };
    for (addr, expected) in [
        (closed, &["connection refused"][..]),
        (
            hangs_up_addr,
            &["connection closed by the server", "connection reset"][..],
        ),
    ] {
        for protocol in [OtlpProtocol::Grpc, OtlpProtocol::HttpProtobuf] {
            let before = lines("WARN", "sink is failing").len();
            let mut cfg = OtlpProfilesConfig::new(endpoint(addr, protocol), protocol);
            cfg.interval = Duration::from_millis(200);
            cfg.delivery = fast_delivery();
            let exporter = OtlpProfilesExporter::start(cfg, numbered_source()).unwrap();
            wait_until(|| lines("WARN", "sink is failing").len() > before);
            drop(exporter);
            let said = lines("WARN", "sink is failing");
            let line = said
                .last()
                .unwrap_or_else(|| panic!("{protocol} to {addr}: no outage logged"));
            assert!(
                expected
                    .iter()
                    .any(|e| line.contains(&format!("failing ({e}"))),
                "{protocol} to {addr}, expected one of {expected:?}: {line}"
            );
        }
    }
}
