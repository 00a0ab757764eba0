//! The Pyroscope sink against a local receiver on 127.0.0.1, decoded with the push
//! and pprof protobuf definitions; and the delivery's behaviour under faults.

#[path = "../support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use prost::Message;
use spanprof::{Hotness, Profiler, SpanLabels};
use spanprof_export::pyroscope::proto::push::v1::PushRequest;
use spanprof_export::{
    DeliveryConfig, ProfileSource, PyroscopeAuth, PyroscopeConfig, PyroscopeExporter,
};
use support::receiver::{Receiver, Reply};

fn decode(body: &[u8]) -> (Vec<(String, String)>, spanprof::pprof::proto::Profile) {
    let req = PushRequest::decode(body).expect("a PushRequest");
    assert_eq!(req.series.len(), 1);
    let s = &req.series[0];
    let labels = s
        .labels
        .iter()
        .map(|l| (l.name.clone(), l.value.clone()))
        .collect();
    assert_eq!(s.samples.len(), 1);
    assert!(!s.samples[0].id.is_empty());
    let pprof = spanprof::pprof::decode(&s.samples[0].raw_profile).expect("gzip'd pprof");
    (labels, pprof)
}

fn string(p: &spanprof::pprof::proto::Profile, i: i64) -> &str {
    &p.string_table[i as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_labelled_profiles_with_auth_tenant_and_series_labels() {
    let profiler = Profiler::builder().start().expect("profiler");
    let receiver = Receiver::start(vec![]).await;
    let mut cfg = PyroscopeConfig::from_lookup(|k| match k {
        "PYROSCOPE_SERVER_ADDRESS" => Some(receiver.url()),
        "PYROSCOPE_BASIC_AUTH_USER" => Some("alice".into()),
        "PYROSCOPE_BASIC_AUTH_PASSWORD" => Some("s3cret".into()),
        "PYROSCOPE_TENANT_ID" => Some("team-a".into()),
        "OTEL_SERVICE_NAME" => Some("checkout".into()),
        _ => None,
    })
    .unwrap()
    .expect("configured from the environment");
    cfg.tags.push(("env".into(), "test".into()));
    cfg.interval = Duration::from_millis(500);
    let exporter = PyroscopeExporter::start(cfg, ProfileSource::profiler(&profiler)).unwrap();
    let labels = support::burn_and_flush(&profiler, 800).await;
    let stats = tokio::task::spawn_blocking(move || exporter.shutdown(Duration::from_secs(5)))
        .await
        .unwrap();
    profiler.stop();
    assert!(stats.sent >= 1 && stats.dropped() == 0, "{stats:?}");

    let got = receiver.received();
    assert!(!got.is_empty());
    let mut span_ids = std::collections::HashSet::new();
    for r in &got {
        assert_eq!(r.path, "/push.v1.PusherService/Push");
        assert_eq!(r.headers["content-type"], "application/proto");
        let basic = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        assert_eq!(
            r.headers["authorization"],
            format!("Basic {basic}").as_str()
        );
        assert_eq!(r.headers["x-scope-orgid"], "team-a");
        let (series, pprof) = decode(&r.body);
        for (k, v) in [
            ("__name__", "process_cpu"),
            ("service_name", "checkout"),
            ("env", "test"),
        ] {
            assert!(series.contains(&(k.to_owned(), v.to_owned())), "{series:?}");
        }
        // Profile type process_cpu:cpu:nanoseconds:cpu:nanoseconds.
        let types: Vec<(&str, &str)> = pprof
            .sample_type
            .iter()
            .map(|t| (string(&pprof, t.r#type), string(&pprof, t.unit)))
            .collect();
        assert!(types.contains(&("cpu", "nanoseconds")), "{types:?}");
        let pt = pprof.period_type.as_ref().unwrap();
        assert_eq!(
            (string(&pprof, pt.r#type), string(&pprof, pt.unit)),
            ("cpu", "nanoseconds")
        );
        assert_eq!(pprof.period, 1_000_000_000 / 99);
        for s in &pprof.sample {
            for l in &s.label {
                if string(&pprof, l.key) == "span_id" {
                    let v = string(&pprof, l.str);
                    assert_eq!(v.len(), 16);
                    span_ids.insert(v.to_owned());
                }
                if string(&pprof, l.key) == "trace_id" {
                    assert_eq!(string(&pprof, l.str).len(), 32);
                }
            }
        }
    }
    for l in &labels {
        assert!(span_ids.contains(&l.span_id_hex()), "{span_ids:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_is_sent() {
    let receiver = Receiver::start(vec![]).await;
    let mut cfg = PyroscopeConfig::new(receiver.url());
    cfg.auth = PyroscopeAuth::Bearer("tok-123".into());
    cfg.interval = Duration::from_millis(100);
    let exporter = PyroscopeExporter::start(cfg, synthetic_source()).unwrap();
    let stats = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(300));
        exporter.shutdown(Duration::from_secs(5))
    })
    .await
    .unwrap();
    assert!(stats.sent >= 1, "{stats:?}");
    assert_eq!(
        receiver.received()[0].headers["authorization"],
        "Bearer tok-123"
    );
}

fn synthetic_source() -> ProfileSource {
    support::receiver::numbered_source()
}

fn payload_numbers(r: &Receiver) -> Vec<u64> {
    support::receiver::pushed_numbers(r)
}

fn fast_delivery(capacity: usize) -> DeliveryConfig {
    let mut d = DeliveryConfig::default();
    d.queue_capacity = capacity;
    d.max_attempts = None;
    d.base_backoff = Duration::from_millis(50);
    d.max_backoff = Duration::from_millis(200);
    d.request_timeout = Duration::from_millis(500);
    d
}

/// Receiver down for a while, then up: everything the queue held arrives; to make
/// room for new payloads a full queue dropped its oldest, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_down_then_up() {
    // Reserve a port, then free it: nothing listens there for now.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = PyroscopeConfig::new(format!("http://{addr}"));
    cfg.interval = Duration::from_millis(100);
    cfg.delivery = fast_delivery(3);
    let exporter = PyroscopeExporter::start(cfg, synthetic_source()).unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let during = exporter.stats();
    assert_eq!(during.sent, 0);
    assert!(during.retried > 0, "{during:?}");
    assert!(during.dropped_queue_full > 0, "{during:?}");
    assert!(during.pending <= 3, "{during:?}");
    let receiver = Receiver::start_on(addr, vec![]).await;
    let stats = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(1500));
        exporter.shutdown(Duration::from_secs(5))
    })
    .await
    .unwrap();
    let got = payload_numbers(&receiver);
    assert_eq!(stats.sent as usize, got.len(), "{stats:?}");
    // Every payload queued was sent or dropped, and counted.
    assert_eq!(stats.queued, stats.sent + stats.dropped(), "{stats:?}");
    assert_eq!(stats.dropped_retries_exhausted, 0, "{stats:?}");
    // The oldest made room: the first payload that arrived is a recent one; they
    // arrived in the order they were made.
    assert!(got.len() >= 3 && got[0] > 1, "{got:?}");
    assert!(got.windows(2).all(|w| w[1] > w[0]), "{got:?}");
    assert!(stats.dropped_queue_full >= during.dropped_queue_full);
}

/// 500 then 200: retried, then delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried() {
    let receiver =
        Receiver::start(vec![Reply::Status(500, "busy"), Reply::Status(503, "busy")]).await;
    let mut cfg = PyroscopeConfig::new(receiver.url());
    cfg.interval = Duration::from_millis(100);
    cfg.delivery = fast_delivery(8);
    let exporter = PyroscopeExporter::start(cfg, synthetic_source()).unwrap();
    let stats = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(600));
        exporter.shutdown(Duration::from_secs(5))
    })
    .await
    .unwrap();
    assert!(stats.retried >= 2, "{stats:?}");
    assert_eq!(stats.dropped(), 0, "{stats:?}");
    let got = payload_numbers(&receiver);
    // Payload 1 was sent three times (500, 503, 200).
    assert_eq!(got.iter().filter(|n| **n == 1).count(), 3, "{got:?}");
}

/// 400: not retried, counted, logged once with the server's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_are_not_retried_and_logged() {
    // The sender logs from its own thread: capture process-wide.
    let logs = Arc::new(Mutex::new(Vec::<String>::new()));
    tracing::subscriber::set_global_default(support::capture_logs(logs.clone()))
        .expect("no other subscriber in this test binary");
    let receiver = Receiver::start(vec![
        Reply::Status(400, "invalid profile: bad labels"),
        Reply::Status(400, "invalid profile: bad labels"),
    ])
    .await;
    let mut cfg = PyroscopeConfig::new(receiver.url());
    cfg.interval = Duration::from_millis(100);
    cfg.delivery = fast_delivery(8);
    let exporter = PyroscopeExporter::start(cfg, synthetic_source()).unwrap();
    let stats = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(500));
        exporter.shutdown(Duration::from_secs(5))
    })
    .await
    .unwrap();
    assert_eq!(stats.dropped_rejected, 2, "{stats:?}");
    assert_eq!(stats.retried, 0, "{stats:?}");
    let got = payload_numbers(&receiver);
    assert_eq!(
        &got[..2],
        &[1, 2],
        "each rejected payload was sent once: {got:?}"
    );
    let logs = logs.lock().unwrap();
    let rejected: Vec<_> = logs.iter().filter(|l| l.contains("bad labels")).collect();
    assert_eq!(rejected.len(), 1, "logged once: {logs:?}");
    assert!(rejected[0].contains("400"), "{rejected:?}");
}

/// A receiver that never answers: sends time out and are retried, then dropped and
/// counted; enqueueing never waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_receiver_times_out_and_drops() {
    let receiver = Receiver::start(vec![Reply::Stall; 100]).await;
    let mut cfg = PyroscopeConfig::new(receiver.url());
    cfg.interval = Duration::from_millis(100);
    cfg.delivery.queue_capacity = 2;
    cfg.delivery.max_attempts = Some(2);
    cfg.delivery.base_backoff = Duration::from_millis(20);
    cfg.delivery.max_backoff = Duration::from_millis(50);
    cfg.delivery.request_timeout = Duration::from_millis(150);
    let exporter = PyroscopeExporter::start(cfg, synthetic_source()).unwrap();
    let stats = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(1500));
        exporter.shutdown(Duration::from_millis(100))
    })
    .await
    .unwrap();
    assert_eq!(stats.sent, 0);
    assert!(
        stats.retried >= 1 && stats.dropped_retries_exhausted >= 1,
        "{stats:?}"
    );
    assert!(stats.dropped_queue_full >= 1, "{stats:?}");
    assert_eq!(stats.queued, stats.dropped(), "{stats:?}");
}

/// Shutdown with a pending queue flushes it within its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_pending_queue() {
    // The receiver is slow (300 ms a request) so payloads pile up.
    let receiver = Receiver::start(vec![Reply::Slow(Duration::from_millis(300)); 100]).await;
    let mut cfg = PyroscopeConfig::new(receiver.url());
    cfg.interval = Duration::from_millis(100);
    cfg.delivery = fast_delivery(16);
    let exporter = PyroscopeExporter::start(cfg, synthetic_source()).unwrap();
    let stats = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(1000));
        let before = exporter.stats();
        assert!(before.pending >= 3, "a queue to flush: {before:?}");
        exporter.shutdown(Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert_eq!(stats.dropped_shutdown, 0, "{stats:?}");
    assert_eq!(stats.sent, stats.queued, "{stats:?}");
    assert_eq!(receiver.received().len() as u64, stats.sent);
}

#[test]
fn environment_errors_name_the_variable() {
    let e = PyroscopeConfig::from_lookup(|k| match k {
        "PYROSCOPE_SERVER_ADDRESS" => Some("pyroscope:4040".into()),
        _ => None,
    })
    .unwrap_err();
    assert!(
        e.to_string().contains("`server`") && e.to_string().contains("http://"),
        "{e}"
    );
    let e = PyroscopeConfig::from_lookup(|k| match k {
        "PYROSCOPE_SERVER_ADDRESS" => Some("http://pyroscope:4040".into()),
        "PYROSCOPE_BASIC_AUTH_USER" => Some("alice".into()),
        _ => None,
    })
    .unwrap_err();
    assert!(
        e.to_string().contains("PYROSCOPE_BASIC_AUTH_PASSWORD"),
        "{e}"
    );
    assert!(PyroscopeConfig::from_lookup(|_| None).unwrap().is_none());
    let latency = |v: &'static str| {
        PyroscopeConfig::from_lookup(move |k| match k {
            "PYROSCOPE_SERVER_ADDRESS" => Some("http://pyroscope:4040".into()),
            "PYROSCOPE_LATENCY_LABEL" => Some(v.into()),
            _ => None,
        })
    };
    assert!(latency("true").unwrap().unwrap().latency_label);
    assert!(!latency("off").unwrap().unwrap().latency_label);
    let e = latency("maybe").unwrap_err();
    assert!(
        e.to_string().contains("PYROSCOPE_LATENCY_LABEL") && e.to_string().contains("maybe"),
        "{e}"
    );
}

/// The series Pyroscope's distributor makes of one push, by its rule
/// (grafana/pyroscope `pkg/model/pprofsplit`): a `profile_id` sample label is renamed
/// `span_id`; `span_id` and `trace_id` stay sample labels; every other string label
/// of a sample is added to the push's series labels (which win on a clash), and each
/// distinct label set is one series.
fn pyroscope_series(body: &[u8]) -> BTreeSet<BTreeMap<String, String>> {
    let req = PushRequest::decode(body).expect("a PushRequest");
    let mut series = BTreeSet::new();
    for s in &req.series {
        let base: BTreeMap<String, String> = s
            .labels
            .iter()
            .map(|l| (l.name.clone(), l.value.clone()))
            .collect();
        for raw in &s.samples {
            let p = spanprof::pprof::decode(&raw.raw_profile).expect("gzip'd pprof");
            for sample in &p.sample {
                let mut labels = base.clone();
                for l in &sample.label {
                    let key = match string(&p, l.key) {
                        "profile_id" => "span_id",
                        k => k,
                    };
                    if l.str > 0 && key != "span_id" && key != "trace_id" {
                        labels
                            .entry(key.to_owned())
                            .or_insert_with(|| string(&p, l.str).to_owned());
                    }
                }
                series.insert(labels);
            }
        }
    }
    series
}

/// `8-4-4-4-12` lowercase hex digits, version 4, RFC 4122 variant.
fn is_uuid_v4(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| {
            g.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
        && groups[2].starts_with('4')
        && groups[3].starts_with(['8', '9', 'a', 'b'])
}

/// Burns `cpu` of this thread's CPU time under `labels`.
fn burn_under(labels: &SpanLabels, cpu: Duration) {
    let _g = labels.enter();
    let start = spanprof::stats::thread_cpu_time();
    while spanprof::stats::thread_cpu_time() - start < cpu {
        std::hint::black_box(spanprof_workloads::BURNERS[0].1(5_000));
    }
}

/// `requests` checkout requests, one after another on one thread: each a root span
/// and an inner `calculate_total` span with CPU work in both, with new trace and span
/// ids every time, half of them sampled and half promoted as slow. Pushed to a local
/// receiver; returns what it got and the requests' root span ids.
fn push_requests(
    profiler: &Profiler,
    rt: &tokio::runtime::Runtime,
    first: u64,
    requests: u64,
    latency_label: bool,
) -> (Vec<support::receiver::Received>, Vec<String>) {
    let receiver = rt.block_on(Receiver::start(vec![]));
    let mut cfg = PyroscopeConfig::new(receiver.url());
    cfg.service_name = "checkout".into();
    cfg.interval = Duration::from_millis(500);
    cfg.latency_label = latency_label;
    let exporter = PyroscopeExporter::start(cfg, ProfileSource::profiler(profiler)).unwrap();
    let roots = std::thread::spawn(move || {
        spanprof::register_current_thread();
        (first..first + requests)
            .map(|i| {
                let root = SpanLabels::builder()
                    .trace_id(0x7ace_0000_0000_0000_0000_0000_0000_0000 | u128::from(i))
                    .span_id(0x5_0000 + 2 * i)
                    .span_name("POST /checkout")
                    .route("POST /checkout")
                    .hot(if i % 2 == 0 {
                        Hotness::Sampled
                    } else {
                        Hotness::Slow
                    })
                    .build();
                burn_under(&root, Duration::from_millis(8));
                let inner = root.child(0x5_0000 + 2 * i + 1, "calculate_total");
                burn_under(&inner, Duration::from_millis(8));
                // The request is over: its samples get its latency class.
                root.record_latency();
                root.span_id_hex()
            })
            .collect::<Vec<_>>()
    })
    .join()
    .unwrap();
    profiler.flush();
    let stats = exporter.shutdown(Duration::from_secs(5));
    assert!(stats.sent >= 1 && stats.dropped() == 0, "{stats:?}");
    (receiver.received(), roots)
}

/// Issue 9.4: Pyroscope turns every sample label but `span_id`/`trace_id` into a
/// series label, and a tenant gets 5 000 series by default. Ten times the requests
/// must make the same series, while every request's `span_id` still reaches
/// Pyroscope as a sample label (what Tempo's "profiles for this span" queries).
/// Each push's profile id is a UUID, as Pyroscope's ingester parses it.
#[test]
fn series_do_not_grow_with_requests() {
    let _serial = support::serial();
    let profiler = Profiler::current_or_start().expect("profiler");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut ids = HashSet::new();
    let mut phases = Vec::new();
    for (first, requests) in [(0, 10), (1_000, 100)] {
        let (got, roots) = push_requests(&profiler, &rt, first, requests, false);
        let mut series = BTreeSet::new();
        let mut span_ids = HashSet::new();
        for r in &got {
            // Unlabelled samples (between requests, other threads) make the push's
            // own series, in some pushes and not others: the request series count.
            series.extend(
                pyroscope_series(&r.body)
                    .into_iter()
                    .filter(|s| s.contains_key("span_name")),
            );
            let (_, pprof) = decode(&r.body);
            let req = PushRequest::decode(r.body.as_ref()).unwrap();
            let id = &req.series[0].samples[0].id;
            assert!(is_uuid_v4(id), "RawSample.ID `{id}` is not a UUID");
            assert!(ids.insert(id.clone()), "RawSample.ID `{id}` sent twice");
            for s in &pprof.sample {
                for l in &s.label {
                    if string(&pprof, l.key) == "span_id" {
                        span_ids.insert(string(&pprof, l.str).to_owned());
                    }
                }
            }
        }
        let missing: Vec<_> = roots.iter().filter(|r| !span_ids.contains(*r)).collect();
        assert!(missing.is_empty(), "span ids not pushed: {missing:?}");
        phases.push((requests, series));
    }
    profiler.stop();
    let (few, many) = (&phases[0], &phases[1]);
    assert_eq!(
        few.1.len(),
        many.1.len(),
        "{} requests made {} series, {} requests {} series; e.g. {:?}",
        few.0,
        few.1.len(),
        many.0,
        many.1.len(),
        many.1.iter().take(3).collect::<Vec<_>>()
    );
    assert_eq!(few.1, many.1);
    let allowed = ["__name__", "service_name", "span_name", "route", "hot"];
    for s in &many.1 {
        assert!(s.keys().all(|k| allowed.contains(&k.as_str())), "{s:?}");
    }
    // Two span names times two hotness values, at most: the latency class the
    // samples carry (`span_latency`) is left out by default.
    assert!(many.1.len() <= 4, "{:?}", many.1);
}

/// With `latency_label`, the push carries each sample's latency class, so Grafana can
/// select a route's slow requests: each series splits by class, five ways at most,
/// and no other way.
#[test]
fn the_latency_label_splits_each_series_by_class_only() {
    let _serial = support::serial();
    let profiler = Profiler::current_or_start().expect("profiler");
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Past the 100 requests a route needs for classes.
    let (got, _) = push_requests(&profiler, &rt, 20_000, 150, true);
    profiler.stop();
    let series: BTreeSet<_> = got
        .iter()
        .flat_map(|r| pyroscope_series(&r.body))
        .filter(|s| s.contains_key("span_name"))
        .collect();
    let classes: BTreeSet<&str> = series
        .iter()
        .filter_map(|s| s.get("span_latency").map(String::as_str))
        .collect();
    assert!(!classes.is_empty(), "no span_latency in {series:?}");
    for c in &classes {
        assert!(
            ["p0-50", "p50-90", "p90-99", "p99+", "open"].contains(c),
            "{c}"
        );
    }
    let without: BTreeSet<_> = series
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.remove("span_latency");
            s
        })
        .collect();
    let allowed = ["__name__", "service_name", "span_name", "route", "hot"];
    for s in &without {
        assert!(s.keys().all(|k| allowed.contains(&k.as_str())), "{s:?}");
    }
    assert!(without.len() <= 4, "{without:?}");
    assert!(series.len() <= 5 * without.len(), "{series:?}");
}

/// A synchronous call inside a hot poll: blocked, no CPU.
#[inline(never)]
fn blocking_lookup() {
    std::thread::sleep(Duration::from_millis(80));
}

/// An interval with wall-clock samples of a hot poll pushes a second series,
/// `__name__=wall`, whose pprof (type `wall/nanoseconds`, read by `go tool pprof`)
/// holds the blocked stack under the span's id; the CPU series stays as it was.
#[test]
fn wall_clock_samples_are_pushed_as_a_wall_series() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let receiver = rt.block_on(Receiver::start(vec![]));
    let mut cfg = PyroscopeConfig::new(receiver.url());
    cfg.service_name = "checkout".into();
    cfg.interval = Duration::from_millis(300);
    let exporter = PyroscopeExporter::start(cfg, ProfileSource::profiler(&profiler)).unwrap();
    let labels = SpanLabels::builder()
        .trace_id(0x3a11)
        .span_id(0x3a11)
        .span_name("GET /lookup")
        .route("GET /lookup")
        .hot(Hotness::Sampled)
        .build();
    let span_id = labels.span_id_hex();
    std::thread::spawn(move || {
        spanprof::register_current_thread();
        let mut timer = spanprof_core::PollTimer::new(None);
        timer.poll(&labels, blocking_lookup);
    })
    .join()
    .unwrap();
    profiler.flush();
    let stats = exporter.shutdown(Duration::from_secs(5));
    profiler.stop();
    assert!(stats.sent >= 1 && stats.dropped() == 0, "{stats:?}");

    let mut walls = vec![];
    for r in receiver.received() {
        let req = PushRequest::decode(r.body.as_ref()).unwrap();
        let name = |s: &spanprof_export::pyroscope::proto::push::v1::RawProfileSeries| {
            s.labels
                .iter()
                .find(|l| l.name == "__name__")
                .map(|l| l.value.clone())
        };
        assert_eq!(name(&req.series[0]).as_deref(), Some("process_cpu"));
        assert!(req.series.len() <= 2, "{} series", req.series.len());
        if let Some(wall) = req.series.get(1) {
            assert_eq!(name(wall).as_deref(), Some("wall"));
            assert!(
                wall.labels
                    .iter()
                    .any(|l| l.name == "service_name" && l.value == "checkout")
            );
            assert_ne!(wall.samples[0].id, req.series[0].samples[0].id);
            walls.push(wall.samples[0].raw_profile.clone());
        }
    }
    assert!(!walls.is_empty(), "no wall series pushed");
    let path = support::artifact_dir().join("pyroscope-wall.pb.gz");
    std::fs::write(&path, &walls[0]).unwrap();
    let path = path.to_str().unwrap();
    let pprof = spanprof::pprof::decode(&walls[0]).unwrap();
    let types: Vec<(&str, &str)> = pprof
        .sample_type
        .iter()
        .map(|t| (string(&pprof, t.r#type), string(&pprof, t.unit)))
        .collect();
    assert_eq!(types, [("wall", "nanoseconds")]);
    let pt = pprof.period_type.as_ref().unwrap();
    assert_eq!(
        (string(&pprof, pt.r#type), string(&pprof, pt.unit)),
        ("wall", "nanoseconds")
    );
    let top = support::go_pprof(&[
        "-top",
        "-cum",
        "-nodecount=200",
        &format!("-tagfocus=span_id={span_id}"),
        path,
    ]);
    assert!(
        top.contains("pyroscope::blocking_lookup"),
        "the span's wall profile misses the blocking call:\n{top}"
    );
    assert!(support::total_ns(&top) >= 40_000_000, "{top}");
}
