//! The OTLP profiles sink (experimental) against local receivers on 127.0.0.1 — HTTP
//! and gRPC — decoded with `opentelemetry-proto`'s types: each sample's link
//! resolves to the trace and span whose function it sampled.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_server::ProfilesServiceServer;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use spanprof::{Profiler, SpanLabels};
use spanprof_export::{OtlpProfilesConfig, OtlpProfilesExporter, OtlpProtocol, ProfileSource};
use support::receiver::{OtlpCollector, Receiver};

/// Checks one request: resource, profile type, and that every linked sample's
/// burner function is the class function of the span its link names. Returns the CPU time
/// (ns) of the linked class samples.
fn check(req: &ExportProfilesServiceRequest, labels: &[SpanLabels; 2]) -> i64 {
    let dict = req.dictionary.as_ref().expect("dictionary");
    let s = |i: i32| dict.string_table[i as usize].as_str();
    assert_eq!(s(0), "", "string 0 is empty");
    let rp = &req.resource_profiles[0];
    let service = rp
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name");
    assert!(matches!(
        service.and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref()),
        Some(any_value::Value::StringValue(name)) if name == "checkout"
    ));
    let profile = &rp.scope_profiles[0].profiles[0];
    let st = profile.sample_type.as_ref().unwrap();
    assert_eq!(
        (s(st.type_strindex), s(st.unit_strindex)),
        ("cpu", "nanoseconds")
    );
    assert!(profile.period > 0);
    let mut linked = 0;
    for sample in &profile.samples {
        if sample.link_index == 0 {
            continue;
        }
        let link = &dict.link_table[sample.link_index as usize];
        let trace = u128::from_be_bytes(link.trace_id.clone().try_into().unwrap());
        let span = u64::from_be_bytes(link.span_id.clone().try_into().unwrap());
        let stack = &dict.stack_table[sample.stack_index as usize];
        // The burner's frame, wherever it is on the stack: the leaf may be code
        // inlined into it or the clock read between its rounds.
        let burner = stack.location_indices.iter().find_map(|&l| {
            dict.location_table[l as usize]
                .lines
                .iter()
                .find_map(|line| {
                    let name = s(dict.function_table[line.function_index as usize].name_strindex);
                    name.contains("burn_class_").then_some(name)
                })
        });
        let class = labels
            .iter()
            .position(|l| l.span_id() == span)
            .unwrap_or_else(|| panic!("link to unknown span {span:016x}"));
        assert_eq!(trace, labels[class].trace_id());
        if let Some(name) = burner {
            assert!(
                name.ends_with(&format!("burn_class_{class}")),
                "{name} linked to span of class {class}"
            );
            linked += sample.values[0];
        }
        assert!(sample.values[0] > 0);
    }
    linked
}

fn run_exporter(endpoint: String, protocol: OtlpProtocol) -> [SpanLabels; 2] {
    let profiler = Profiler::builder().start().expect("profiler");
    let mut cfg = OtlpProfilesConfig::new(endpoint, protocol);
    cfg.service_name = "checkout".into();
    cfg.interval = Duration::from_millis(300);
    let exporter = OtlpProfilesExporter::start(cfg, ProfileSource::profiler(&profiler)).unwrap();
    let (_, labels) = support::labelled_burn(600);
    profiler.flush();
    let stats = exporter.shutdown(Duration::from_secs(5));
    profiler.stop();
    assert!(stats.sent >= 1 && stats.dropped() == 0, "{stats:?}");
    labels
}

#[test]
fn http_profiles_link_samples_to_spans() {
    let _serial = support::serial();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let receiver = rt.block_on(Receiver::start(vec![]));
    // The endpoint from the standard variables.
    let cfg = OtlpProfilesConfig::from_lookup(|k| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(receiver.url()),
        _ => None,
    })
    .unwrap()
    .unwrap();
    assert_eq!(
        cfg.endpoint,
        format!("{}/v1development/profiles", receiver.url())
    );
    let labels = run_exporter(cfg.endpoint, OtlpProtocol::HttpProtobuf);
    let got = receiver.received();
    assert!(!got.is_empty());
    let mut linked = 0i64;
    for r in &got {
        assert_eq!(r.path, "/v1development/profiles");
        assert_eq!(r.headers["content-type"], "application/x-protobuf");
        let req = ExportProfilesServiceRequest::decode(r.body.as_ref()).expect("OTLP profiles");
        linked += check(&req, &labels);
    }
    // Two threads burned 600 ms of CPU each.
    assert!(
        linked >= 1_000_000_000,
        "{linked} ns of linked class samples"
    );
}

/// A recording OTLP profiles gRPC server on 127.0.0.1 that answers
/// `UNAUTHENTICATED` to a request without every `required` metadata entry.
fn start_collector(
    rt: &tokio::runtime::Runtime,
    required: &'static [(&'static str, &'static str)],
) -> (OtlpCollector, std::net::SocketAddr) {
    let collector = OtlpCollector::default();
    let svc = ProfilesServiceServer::with_interceptor(
        collector.clone(),
        move |req: tonic::Request<()>| {
            let md = req.metadata();
            if required
                .iter()
                .all(|(k, v)| md.get(*k).is_some_and(|got| got == *v))
            {
                Ok(req)
            } else {
                Err(tonic::Status::unauthenticated("missing or wrong metadata"))
            }
        },
    );
    let addr = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap()
        });
        addr
    });
    (collector, addr)
}

#[test]
fn grpc_profiles_link_samples_to_spans() {
    let _serial = support::serial();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (collector, addr) = start_collector(&rt, &[]);
    let cfg = OtlpProfilesConfig::from_lookup(|k| match k {
        "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT" => Some(format!("http://{addr}")),
        "OTEL_EXPORTER_OTLP_PROTOCOL" => Some("grpc".into()),
        _ => None,
    })
    .unwrap()
    .unwrap();
    assert_eq!(cfg.protocol, OtlpProtocol::Grpc);
    let labels = run_exporter(cfg.endpoint, OtlpProtocol::Grpc);
    let got = collector.0.lock().unwrap().clone();
    assert!(!got.is_empty());
    let linked: i64 = got.iter().map(|r| check(r, &labels)).sum();
    assert!(
        linked >= 1_000_000_000,
        "{linked} ns of linked class samples"
    );
    drop(rt);
}

#[test]
fn protocol_errors_name_the_variable() {
    let e = OtlpProfilesConfig::from_lookup(|k| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://collector:4318".into()),
        "OTEL_EXPORTER_OTLP_PROTOCOL" => Some("http/json".into()),
        _ => None,
    })
    .unwrap_err();
    assert!(e.to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{e}");
}

/// Runs an exporter of `cfg` at a 200 ms interval for 700 ms (three or four
/// profiles), then shuts it down.
fn export_for_700ms(mut cfg: OtlpProfilesConfig) -> spanprof_export::DeliveryStats {
    cfg.interval = Duration::from_millis(200);
    let exporter = OtlpProfilesExporter::start(cfg, support::receiver::numbered_source()).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    exporter.shutdown(Duration::from_secs(5))
}

/// Issue 10.7: an authenticated collector accepted traces and rejected every
/// profile, because `OTEL_EXPORTER_OTLP_HEADERS` was ignored for profiles. Over
/// HTTP, against a receiver that answers 401 without the header, as the variable
/// gives it (percent-encoded).
#[test]
fn http_profiles_carry_the_standard_headers() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let receiver = rt.block_on(Receiver::start(vec![]));
    receiver.require_header("authorization", "Bearer s3cret token");
    let cfg = OtlpProfilesConfig::from_lookup(|k| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(receiver.url()),
        "OTEL_EXPORTER_OTLP_HEADERS" => {
            Some("authorization=Bearer%20s3cret%20token, x-team = checkout".into())
        }
        _ => None,
    })
    .unwrap()
    .unwrap();
    let stats = export_for_700ms(cfg);
    assert!(stats.sent >= 2 && stats.dropped() == 0, "{stats:?}");
    for r in receiver.received() {
        assert_eq!(r.headers["authorization"], "Bearer s3cret token");
        assert_eq!(r.headers["x-team"], "checkout");
    }
}

/// Issue 10.7 over gRPC: the headers go as metadata; the profiles variable wins
/// over the general one for a key set in both, and both apply.
#[test]
fn grpc_profiles_carry_the_standard_headers_profiles_variable_first() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (collector, addr) = start_collector(&rt, &[("x-api-key", "right"), ("x-team", "checkout")]);
    let cfg = OtlpProfilesConfig::from_lookup(|k| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(format!("http://{addr}")),
        "OTEL_EXPORTER_OTLP_PROTOCOL" => Some("grpc".into()),
        "OTEL_EXPORTER_OTLP_HEADERS" => Some("x-api-key=wrong,x-team=checkout".into()),
        "OTEL_EXPORTER_OTLP_PROFILES_HEADERS" => Some("X-Api-Key=right".into()),
        _ => None,
    })
    .unwrap()
    .unwrap();
    assert_eq!(cfg.protocol, OtlpProtocol::Grpc);
    let stats = export_for_700ms(cfg);
    assert!(stats.sent >= 2 && stats.dropped() == 0, "{stats:?}");
    assert_eq!(collector.0.lock().unwrap().len() as u64, stats.sent);
    drop(rt);
}

/// The other exporter variables, as for traces, `_PROFILES_` first; bad values are
/// errors naming the variable, never echoing a header's value.
#[test]
fn otel_exporter_variables_profiles_first_and_errors_name_them() {
    let base = |extra: &'static [(&'static str, &'static str)]| {
        move |k: &str| match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://collector:4318/?org=7".to_owned()),
            _ => extra
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| (*v).to_owned()),
        }
    };
    let cfg = OtlpProfilesConfig::from_lookup(base(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")]))
        .unwrap()
        .unwrap();
    assert_eq!(cfg.delivery.request_timeout, Duration::from_millis(2500));
    assert_eq!(cfg.protocol, OtlpProtocol::HttpProtobuf);
    // The signal path goes before the query string.
    assert_eq!(
        cfg.endpoint,
        "http://collector:4318/v1development/profiles?org=7"
    );
    let cfg = OtlpProfilesConfig::from_lookup(base(&[
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ("OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT", "700"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "grpc"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(cfg.delivery.request_timeout, Duration::from_millis(700));
    assert_eq!(cfg.protocol, OtlpProtocol::Grpc);
    assert_eq!(cfg.endpoint, "http://collector:4318/?org=7", "gRPC: as is");

    for (var, value) in [
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
        ("OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT", "0"),
        ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "http/json"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization"),
        ("OTEL_EXPORTER_OTLP_PROFILES_HEADERS", "bad name=hunter2"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=hunter2%0A"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=hunter2%zz"),
    ] {
        let e = OtlpProfilesConfig::from_lookup(|k| match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://collector:4318".into()),
            k if k == var => Some(value.into()),
            _ => None,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains(var), "{var}={value}: {e}");
        assert!(!e.contains("hunter2"), "{var}: the value is echoed: {e}");
    }
    let e = OtlpProfilesConfig::from_lookup(|k| {
        (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "collector:4318".to_owned())
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("`OTEL_EXPORTER_OTLP_ENDPOINT`"), "{e}");
}

/// A collector that refuses every profile over gRPC (`UNAUTHENTICATED`): the refusal
/// is counted, not retried, and logged once with its gRPC status code, never passed
/// off as an HTTP status (issue 13: code 16 used to read as "status=16").
#[test]
fn a_grpc_refusal_is_counted_and_logged_once_with_its_grpc_code() {
    let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    tracing::subscriber::set_global_default(support::capture_logs(logs.clone())).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (collector, addr) = start_collector(&rt, &[("x-api-key", "right")]);
    let cfg = OtlpProfilesConfig::from_lookup(|k| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(format!("http://{addr}")),
        "OTEL_EXPORTER_OTLP_PROTOCOL" => Some("grpc".into()),
        _ => None,
    })
    .unwrap()
    .unwrap();
    let stats = export_for_700ms(cfg);
    assert!(
        stats.dropped_rejected >= 2 && stats.sent == 0 && stats.retried == 0,
        "{stats:?}"
    );
    assert!(collector.0.lock().unwrap().is_empty());
    // The server's runtime first: its threads log too, and must not be left blocked
    // on the log while it shuts down.
    drop(rt);
    let logs = logs.lock().unwrap();
    let refusals: Vec<&String> = logs
        .iter()
        .filter(|l| l.contains("rejected a profile"))
        .collect();
    assert_eq!(refusals.len(), 1, "logged once per status: {logs:#?}");
    assert!(
        refusals[0].contains("status=gRPC code 16 "),
        "{}",
        refusals[0]
    );
}
