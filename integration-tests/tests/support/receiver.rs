//! A recording HTTP receiver on 127.0.0.1 for the sink tests: it keeps every request
//! (path, headers, body) and answers with scripted statuses.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_server::ProfilesService;
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};

/// One received request.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// What the receiver answers.
#[derive(Debug, Clone)]
pub enum Reply {
    Status(u16, &'static str),
    /// Never answer (the sender must time out).
    Stall,
    /// Answer 200 after a delay.
    Slow(Duration),
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    script: VecDeque<Reply>,
    /// A header every request must carry (else 401).
    required: Option<(String, String)>,
    /// Connections whose TLS handshake failed (HTTPS receivers).
    tls_failures: u64,
}

/// Serves one connection, recording each request and answering from the script.
async fn serve<I>(io: I, st: Arc<Mutex<State>>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req: http::Request<Incoming>| {
        let st = st.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let reply = {
                let mut s = st.lock().unwrap();
                let authorized = s.required.as_ref().is_none_or(|(k, v)| {
                    parts
                        .headers
                        .get(k.as_str())
                        .is_some_and(|got| got == v.as_str())
                });
                s.received.push(Received {
                    path: parts.uri.path().to_owned(),
                    headers: parts.headers,
                    body,
                });
                if authorized {
                    s.script.pop_front().unwrap_or(Reply::Status(200, ""))
                } else {
                    Reply::Status(401, "missing or wrong credentials")
                }
            };
            let (status, text) = match reply {
                Reply::Status(s, t) => (s, t),
                Reply::Stall => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    (200, "")
                }
                Reply::Slow(d) => {
                    tokio::time::sleep(d).await;
                    (200, "")
                }
            };
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(status)
                    .body(Full::new(Bytes::from_static(text.as_bytes())))
                    .unwrap(),
            )
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

/// A running receiver.
#[derive(Clone)]
pub struct Receiver {
    state: Arc<Mutex<State>>,
    pub addr: SocketAddr,
}

impl Receiver {
    /// Starts on `addr` (port 0: any) on the current tokio runtime. Once the script
    /// runs out it answers 200.
    pub async fn start_on(addr: SocketAddr, script: Vec<Reply>) -> Receiver {
        Receiver::start_inner(addr, script, None).await
    }

    /// Starts an HTTPS receiver on any free port, serving `tls`.
    pub async fn start_tls(script: Vec<Reply>, tls: tokio_rustls::TlsAcceptor) -> Receiver {
        Receiver::start_inner("127.0.0.1:0".parse().unwrap(), script, Some(tls)).await
    }

    async fn start_inner(
        addr: SocketAddr,
        script: Vec<Reply>,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Receiver {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind receiver");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            script: script.into(),
            ..State::default()
        }));
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((io, _)) = listener.accept().await else {
                    return;
                };
                let st = st.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        None => serve(io, st).await,
                        Some(acceptor) => match acceptor.accept(io).await {
                            Ok(io) => serve(io, st).await,
                            Err(_) => st.lock().unwrap().tls_failures += 1,
                        },
                    }
                });
            }
        });
        Receiver { state, addr }
    }

    /// Starts on any free port.
    pub async fn start(script: Vec<Reply>) -> Receiver {
        Receiver::start_on("127.0.0.1:0".parse().unwrap(), script).await
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The URL of an HTTPS receiver, by the name its certificate has.
    pub fn https_url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// Connections whose TLS handshake failed.
    pub fn tls_failures(&self) -> u64 {
        self.state.lock().unwrap().tls_failures
    }

    /// From now on, answers 401 to a request without header `name: value`.
    pub fn require_header(&self, name: &str, value: &str) {
        self.state.lock().unwrap().required = Some((name.to_owned(), value.to_owned()));
    }
}

/// A source of small numbered profiles, no profiler needed: the `n`th profile's one
/// sample is in function `payload_<n>`.
pub fn numbered_source() -> spanprof_export::ProfileSource {
    let mut n = 0u64;
    spanprof_export::ProfileSource::from_fn(move || {
        n += 1;
        let mut p = spanprof::Profile::empty(10_000_000);
        p.samples.push(spanprof::ProfileSample {
            stack: Arc::from(vec![spanprof::Frame {
                function: Arc::from(format!("payload_{n}")),
                file: None,
                line: 0,
                address: n,
                inlined: false,
            }]),
            labels: None,
            count: 1,
            cpu_ns: 10_000_000,
            wall_ns: 0,
        });
        p
    })
}

/// The numbers of the [`numbered_source`] profiles in the Pyroscope pushes a
/// receiver got, in arrival order.
pub fn pushed_numbers(r: &Receiver) -> Vec<u64> {
    use prost::Message;
    r.received()
        .iter()
        .map(|r| {
            let req =
                spanprof_export::pyroscope::proto::push::v1::PushRequest::decode(r.body.as_ref())
                    .expect("a PushRequest");
            let p = spanprof::pprof::decode(&req.series[0].samples[0].raw_profile)
                .expect("gzip'd pprof");
            let f = p.function[0].name;
            p.string_table[f as usize]
                .strip_prefix("payload_")
                .expect("a numbered profile")
                .parse()
                .unwrap()
        })
        .collect()
}

/// A recording OTLP profiles gRPC service.
#[derive(Default, Clone)]
pub struct OtlpCollector(pub Arc<Mutex<Vec<ExportProfilesServiceRequest>>>);

#[tonic::async_trait]
impl ProfilesService for OtlpCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportProfilesServiceRequest>,
    ) -> Result<tonic::Response<ExportProfilesServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(
            ExportProfilesServiceResponse::default(),
        ))
    }
}
