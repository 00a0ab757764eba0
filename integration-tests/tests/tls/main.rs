//! The network sinks over HTTPS: Pyroscope push, OTLP over HTTP and over gRPC, each
//! against a real TLS server on 127.0.0.1 whose certificate (for `localhost`) is
//! made at test time and trusted only through the sink's CA setting. Without that
//! setting the handshake fails and nothing is delivered.

#[path = "../support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_server::ProfilesServiceServer;
use prost::Message;
use spanprof::Profiler;
use spanprof_export::pyroscope::proto::push::v1::PushRequest;
use spanprof_export::{
    DeliveryConfig, DeliveryStats, OtlpProfilesConfig, OtlpProfilesExporter, OtlpProtocol,
    ProfileSource, PyroscopeAuth, PyroscopeConfig, PyroscopeExporter,
};
use support::receiver::{OtlpCollector, Receiver};
use tokio_rustls::rustls;

/// A self-signed certificate for `localhost`: (certificate PEM, key PEM, TLS
/// acceptor serving it).
fn localhost_cert() -> (String, String, tokio_rustls::TlsAcceptor) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key)
    .unwrap();
    (
        ck.cert.pem(),
        ck.signing_key.serialize_pem(),
        tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    )
}

/// Few, quick retries: the failing cases end in about a second.
fn quick_delivery() -> DeliveryConfig {
    let mut d = DeliveryConfig::default();
    d.max_attempts = Some(2);
    d.base_backoff = Duration::from_millis(50);
    d.max_backoff = Duration::from_millis(100);
    d.request_timeout = Duration::from_secs(3);
    d
}

/// Burns labelled CPU while `start` runs an exporter, then shuts it down.
async fn export_with<E: Send + 'static>(
    start: impl FnOnce(ProfileSource) -> E,
    shutdown: impl FnOnce(E) -> DeliveryStats + Send + 'static,
) -> DeliveryStats {
    let profiler = Profiler::current_or_start().expect("profiler");
    let exporter = start(ProfileSource::profiler(&profiler));
    support::burn_and_flush(&profiler, 300).await;
    tokio::task::spawn_blocking(move || shutdown(exporter))
        .await
        .unwrap()
}

fn pyroscope(server: String, ca: Option<&str>) -> PyroscopeConfig {
    let mut cfg = PyroscopeConfig::new(server);
    cfg.service_name = "checkout".into();
    cfg.auth = PyroscopeAuth::Bearer("t0ken".into());
    cfg.interval = Duration::from_millis(200);
    cfg.delivery = quick_delivery();
    cfg.ca_certificates_pem = ca.map(|c| c.as_bytes().to_vec());
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyroscope_pushes_over_https_to_a_server_signed_by_a_private_ca() {
    let (cert, _, acceptor) = localhost_cert();
    let receiver = Receiver::start_tls(vec![], acceptor).await;
    let cfg = pyroscope(receiver.https_url(), Some(&cert));
    let stats = export_with(
        |src| PyroscopeExporter::start(cfg, src).unwrap(),
        |e| e.shutdown(Duration::from_secs(5)),
    )
    .await;
    assert!(stats.sent >= 1 && stats.dropped() == 0, "{stats:?}");
    assert_eq!(receiver.tls_failures(), 0);
    let got = receiver.received();
    assert_eq!(got.len() as u64, stats.sent);
    for r in &got {
        assert_eq!(r.path, "/push.v1.PusherService/Push");
        assert_eq!(r.headers["authorization"], "Bearer t0ken");
        let push = PushRequest::decode(r.body.as_ref()).expect("a PushRequest");
        let pprof = spanprof::pprof::decode(&push.series[0].samples[0].raw_profile).unwrap();
        assert!(!pprof.sample.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyroscope_refuses_a_server_it_cannot_verify_and_counts_the_drop() {
    let (_, _, acceptor) = localhost_cert();
    let receiver = Receiver::start_tls(vec![], acceptor).await;
    // Only the public roots: the self-signed certificate is not trusted.
    let cfg = pyroscope(receiver.https_url(), None);
    let stats = export_with(
        |src| PyroscopeExporter::start(cfg, src).unwrap(),
        |e| e.shutdown(Duration::from_secs(3)),
    )
    .await;
    assert_eq!(stats.sent, 0, "{stats:?}");
    assert!(stats.dropped() >= 1, "{stats:?}");
    assert!(receiver.received().is_empty());
    assert!(receiver.tls_failures() >= 1, "the handshake was refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_trusts_the_certificate_named_by_the_standard_variable() {
    let (cert, _, acceptor) = localhost_cert();
    let receiver = Receiver::start_tls(vec![], acceptor).await;
    let dir = support::artifact_dir().join("tls-otlp-http");
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &cert).unwrap();
    let mut cfg = OtlpProfilesConfig::from_lookup(|k| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(receiver.https_url()),
        "OTEL_EXPORTER_OTLP_CERTIFICATE" => Some(ca_file.display().to_string()),
        _ => None,
    })
    .unwrap()
    .unwrap();
    assert_eq!(cfg.ca_certificates_pem.as_deref(), Some(cert.as_bytes()));
    cfg.interval = Duration::from_millis(200);
    cfg.delivery = quick_delivery();
    let stats = export_with(
        |src| OtlpProfilesExporter::start(cfg, src).unwrap(),
        |e| e.shutdown(Duration::from_secs(5)),
    )
    .await;
    assert!(stats.sent >= 1 && stats.dropped() == 0, "{stats:?}");
    for r in receiver.received() {
        assert_eq!(r.path, "/v1development/profiles");
        let req = ExportProfilesServiceRequest::decode(r.body.as_ref()).expect("OTLP profiles");
        assert!(!req.resource_profiles.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_grpc_over_tls() {
    let (cert, key, _) = localhost_cert();
    let collector = OtlpCollector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let svc = ProfilesServiceServer::new(collector.clone());
    let identity = tonic::transport::Identity::from_pem(&cert, &key);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .unwrap()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap()
    });
    let mut cfg = OtlpProfilesConfig::new(format!("https://localhost:{port}"), OtlpProtocol::Grpc);
    cfg.interval = Duration::from_millis(200);
    cfg.delivery = quick_delivery();
    cfg.ca_certificates_pem = Some(cert.into_bytes());
    let stats = export_with(
        |src| OtlpProfilesExporter::start(cfg, src).unwrap(),
        |e| e.shutdown(Duration::from_secs(5)),
    )
    .await;
    assert!(stats.sent >= 1 && stats.dropped() == 0, "{stats:?}");
    let got = collector.0.lock().unwrap().clone();
    assert_eq!(got.len() as u64, stats.sent);
    assert!(got.iter().all(|r| !r.resource_profiles.is_empty()));
}

#[test]
fn a_bad_certificate_setting_names_its_variable() {
    let missing = OtlpProfilesConfig::from_lookup(|k| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("https://collector:4318".into()),
        "OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE" => Some("/nonexistent/ca.pem".into()),
        _ => None,
    })
    .unwrap_err()
    .to_string();
    assert!(
        missing.contains("OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE")
            && missing.contains("/nonexistent/ca.pem"),
        "{missing}"
    );

    let dir = support::artifact_dir().join("tls-bad-ca");
    std::fs::create_dir_all(&dir).unwrap();
    let not_pem = dir.join("not.pem");
    std::fs::write(&not_pem, "password=hunter2\n").unwrap();
    let garbage = PyroscopeConfig::from_lookup(|k| match k {
        "PYROSCOPE_SERVER_ADDRESS" => Some("https://pyroscope:4040".into()),
        "PYROSCOPE_CA_CERT_FILE" => Some(not_pem.display().to_string()),
        _ => None,
    })
    .unwrap_err()
    .to_string();
    assert!(garbage.contains("PYROSCOPE_CA_CERT_FILE"), "{garbage}");
    assert!(
        !garbage.contains("hunter2"),
        "the file's content is not echoed: {garbage}"
    );

    // Certificate armour around bytes that are no certificate.
    let bogus = dir.join("bogus.pem");
    std::fs::write(
        &bogus,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let bogus_err = OtlpProfilesConfig::from_lookup(|k| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("https://collector:4318".into()),
        "OTEL_EXPORTER_OTLP_CERTIFICATE" => Some(bogus.display().to_string()),
        _ => None,
    })
    .unwrap_err()
    .to_string();
    assert!(
        bogus_err.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"),
        "{bogus_err}"
    );

    // A certificate and its key in one file: only the certificate is kept, so the
    // key can never be printed with the configuration.
    let (cert, key, _) = localhost_cert();
    let both = dir.join("both.pem");
    std::fs::write(&both, format!("{key}{cert}")).unwrap();
    let cfg = PyroscopeConfig::from_lookup(|k| match k {
        "PYROSCOPE_SERVER_ADDRESS" => Some("https://pyroscope:4040".into()),
        "PYROSCOPE_CA_CERT_FILE" => Some(both.display().to_string()),
        _ => None,
    })
    .unwrap()
    .unwrap();
    let kept = String::from_utf8(cfg.ca_certificates_pem.clone().unwrap()).unwrap();
    assert!(kept.contains("BEGIN CERTIFICATE") && !kept.contains("PRIVATE KEY"));
    assert!(!format!("{cfg:?}").contains("PRIVATE"));

    let mut cfg = pyroscope("https://pyroscope:4040".into(), Some("not a certificate"));
    cfg.interval = Duration::from_secs(1);
    let profiler = Profiler::current_or_start().expect("profiler");
    let err = PyroscopeExporter::start(cfg, ProfileSource::profiler(&profiler))
        .unwrap_err()
        .to_string();
    assert!(err.contains("ca_certificates_pem"), "{err}");
}
