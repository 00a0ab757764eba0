//! The example speaks the OTLP protocol the standard variables ask for: with
//! `OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf` its spans (and profiles) go over
//! OTLP/HTTP to `/v1/traces` (and `/v1development/profiles`) under the endpoint; an
//! unknown protocol stops it with an error naming the variable; credentials in the
//! endpoint are never printed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

use crate::support::{Example, checkout};

/// What the receiver got: (path, span names in the request).
type Received = Arc<Mutex<Vec<(String, Vec<String>)>>>;

/// A plain OTLP/HTTP receiver on loopback that decodes trace exports.
async fn http_receiver(received: Received) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let received = received.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<_>| {
                    let received = received.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let body: Bytes = BodyExt::collect(req.into_body())
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let names = if path == "/v1/traces" {
                            ExportTraceServiceRequest::decode(body)
                                .map(|r| {
                                    r.resource_spans
                                        .iter()
                                        .flat_map(|rs| &rs.scope_spans)
                                        .flat_map(|ss| &ss.spans)
                                        .map(|s| s.name.clone())
                                        .collect()
                                })
                                .unwrap_or_default()
                        } else {
                            Vec::new()
                        };
                        received.lock().unwrap().push((path, names));
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::new(),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[test]
fn otlp_http_protocol_sends_spans_over_http_and_hides_credentials() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let received: Received = Arc::default();
    let addr = rt.block_on(http_receiver(received.clone()));
    let endpoint = format!("http://spanprof:S3CRETPW@{addr}");
    let mut ex = Example::spawn(
        &["--listen", "127.0.0.1:0", "--load", "0"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ],
    );
    let (api, _, _) = ex.addresses();
    rt.block_on(async {
        for i in 0..3 {
            let (status, body) = checkout(api, i).await.unwrap();
            assert_eq!(status, 200, "{body}");
        }
    });
    ex.signal("TERM");
    let status = ex.wait(Duration::from_secs(30)).expect("stopped");
    let (out, err) = (ex.stdout(), ex.stderr());
    assert!(status.success(), "exit {status}\n{out}\n{err}");
    let got = received.lock().unwrap().clone();
    let spans: Vec<&String> = got
        .iter()
        .filter(|(p, _)| p == "/v1/traces")
        .flat_map(|(_, n)| n)
        .collect();
    assert!(
        spans.iter().any(|n| *n == "POST /checkout"),
        "spans over OTLP/HTTP at /v1/traces: {got:?}\n{out}\n{err}"
    );
    assert!(
        got.iter().any(|(p, _)| p == "/v1development/profiles"),
        "profiles follow the traces' protocol: {got:?}\n{out}"
    );
    assert!(
        out.contains("OTLP (http/protobuf)"),
        "the start-up line names the protocol:\n{out}"
    );
    assert!(
        !out.contains("S3CRETPW") && !err.contains("S3CRETPW"),
        "credentials printed:\n{out}\n{err}"
    );
}

#[test]
fn an_unknown_otlp_protocol_is_refused_by_name() {
    let mut ex = Example::spawn(
        &["--listen", "127.0.0.1:0", "--load", "0"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ],
    );
    let status = ex.wait(Duration::from_secs(30)).expect("exits at once");
    let err = format!("{}{}", ex.stdout(), ex.stderr());
    assert!(!status.success(), "{err}");
    assert!(err.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{err}");
}
