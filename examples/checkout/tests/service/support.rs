//! What the service tests share: the example's binary as a child process (its printed
//! addresses, its output), a real HTTP client, and a recording OTLP collector (traces
//! and profiles over gRPC) on loopback.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_server::{
    ProfilesService, ProfilesServiceServer,
};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};

/// The example's binary, running.
pub struct Example {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

fn collect(stream: impl Read + Send + 'static, into: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let mut s = into.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
}

impl Example {
    /// Starts `checkout ARGS` with `env` added, its output collected.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Example {
        Example::start(Command::new(env!("CARGO_BIN_EXE_checkout")), args, env)
    }

    /// Starts it with its open-file limit lowered to `nofile` (through the shell's
    /// `ulimit`, which the child inherits).
    pub fn spawn_with_nofile(nofile: u32, args: &[&str], env: &[(&str, &str)]) -> Example {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_checkout"));
        Example::start(cmd, args, env)
    }

    fn start(mut cmd: Command, args: &[&str], env: &[(&str, &str)]) -> Example {
        cmd.args(args)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("PYROSCOPE_SERVER_ADDRESS")
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start the checkout binary");
        let (stdout, stderr) = (Arc::default(), Arc::default());
        collect(child.stdout.take().unwrap(), Arc::clone(&stdout));
        collect(child.stderr.take().unwrap(), Arc::clone(&stderr));
        Example {
            child,
            stdout,
            stderr,
        }
    }

    /// Everything printed so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Everything logged so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (up to `deadline`) for a printed line starting with `prefix`; returns it.
    #[track_caller]
    pub fn line(&mut self, prefix: &str, deadline: Duration) -> String {
        let end = Instant::now() + deadline;
        loop {
            if let Some(l) = self.stdout().lines().find(|l| l.starts_with(prefix)) {
                return l.to_owned();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "checkout exited ({status}) before printing `{prefix}`:\n{}\n{}",
                    self.stdout(),
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < end,
                "no `{prefix}` line within {deadline:?}:\n{}\n{}",
                self.stdout(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The addresses in the `checkout API` line: (api, inventory, payments).
    #[track_caller]
    pub fn addresses(&mut self) -> (SocketAddr, SocketAddr, SocketAddr) {
        let line = self.line("checkout API", Duration::from_secs(120));
        let addrs: Vec<SocketAddr> = line
            .split([' ', ',', '(', ')'])
            .filter_map(|w| w.trim_start_matches("http://").parse().ok())
            .collect();
        assert_eq!(addrs.len(), 3, "three addresses in `{line}`");
        (addrs[0], addrs[1], addrs[2])
    }

    /// The viewer's URL, from its printed line.
    #[track_caller]
    pub fn viewer_url(&mut self, deadline: Duration) -> String {
        let line = self.line("viewer", deadline);
        line.split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("a URL in `{line}`"))
            .to_owned()
    }

    /// Sends `signal` (`TERM`, `INT`) with kill(1).
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args(["-s", signal, &self.child.id().to_string()])
            .status()
            .expect("kill(1)")
            .success();
        assert!(ok, "kill -s {signal}");
    }

    /// Waits up to `deadline` for the process to exit.
    pub fn wait(&mut self, deadline: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the reader threads take the last lines.
                std::thread::sleep(Duration::from_millis(200));
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1 client.
pub fn client() -> hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
> {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// Sends `req` (with a 30 s bound); the status and body, or the error.
pub async fn send(req: http::Request<Full<Bytes>>) -> Result<(http::StatusCode, String), String> {
    let fut = async {
        let resp = client().request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .map_err(|_| "no answer within 30 s".to_owned())?
}

/// GET `url`.
pub async fn get(url: &str) -> Result<(http::StatusCode, String), String> {
    send(
        http::Request::get(url)
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await
}

/// A small `POST /checkout` to the API at `api`.
pub async fn checkout(api: SocketAddr, seed: u64) -> Result<(http::StatusCode, String), String> {
    let cart = checkout::shop::sample_cart(&format!("cart-{seed}"), 3, seed);
    send(
        http::Request::post(format!("http://{api}/checkout"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(&cart).unwrap())))
            .unwrap(),
    )
    .await
}

/// What the collector received.
#[derive(Default)]
pub struct Received {
    /// Trace export requests.
    pub traces: Vec<ExportTraceServiceRequest>,
    /// Profile export requests, with when each arrived.
    pub profiles: Vec<(Instant, ExportProfilesServiceRequest)>,
}

/// A recording OTLP collector: traces and profiles over gRPC.
#[derive(Clone, Default)]
pub struct Collector(pub Arc<Mutex<Received>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().traces.push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl ProfilesService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportProfilesServiceRequest>,
    ) -> Result<tonic::Response<ExportProfilesServiceResponse>, tonic::Status> {
        self.0
            .lock()
            .unwrap()
            .profiles
            .push((Instant::now(), request.into_inner()));
        Ok(tonic::Response::new(
            ExportProfilesServiceResponse::default(),
        ))
    }
}

/// One exported span.
#[derive(Debug, Clone)]
pub struct ExportedSpan {
    pub trace_id: Vec<u8>,
    pub name: String,
    /// `key=value` of every attribute.
    pub attributes: Vec<String>,
}

impl Collector {
    /// Serves on a free loopback port on the current runtime; returns its URL.
    pub async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let me = self.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(me.clone()))
                .add_service(ProfilesServiceServer::new(me))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        format!("http://{addr}")
    }

    /// Every span received.
    pub fn spans(&self) -> Vec<ExportedSpan> {
        let r = self.0.lock().unwrap();
        r.traces
            .iter()
            .flat_map(|t| &t.resource_spans)
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| &ss.spans)
            .map(|s| ExportedSpan {
                trace_id: s.trace_id.clone(),
                name: s.name.clone(),
                attributes: s
                    .attributes
                    .iter()
                    .map(|kv| format!("{}={:?}", kv.key, kv.value))
                    .collect(),
            })
            .collect()
    }

    /// When each profiles export arrived.
    pub fn profile_exports(&self) -> Vec<Instant> {
        self.0
            .lock()
            .unwrap()
            .profiles
            .iter()
            .map(|p| p.0)
            .collect()
    }
}

/// The shop in this process, its spans exported to a recording collector.
pub struct InProcess {
    pub rt: tokio::runtime::Runtime,
    pub shop: checkout::Shop,
    pub provider: opentelemetry_sdk::trace::SdkTracerProvider,
    pub collector: Collector,
}

impl InProcess {
    /// Starts the profiler, tracing (exporting to a collector) and the shop on
    /// loopback ports, on a 2-worker runtime with spanprof's hooks.
    pub fn start() -> InProcess {
        let profiler = spanprof::Profiler::builder().start().expect("profiler");
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        spanprof::install_runtime_hooks(&mut builder);
        let rt = builder.worker_threads(2).enable_all().build().unwrap();
        let collector = Collector::default();
        let (shop, provider) = rt.block_on(async {
            let telemetry = checkout::telemetry::Telemetry {
                otlp_endpoint: Some(collector.start().await),
                log_filter: None,
                ..Default::default()
            };
            checkout::start_local(profiler, &telemetry)
                .await
                .expect("start")
        });
        InProcess {
            rt,
            shop,
            provider,
            collector,
        }
    }

    /// The viewer's base URL (ends in `/debug/spanprof/`).
    pub fn viewer(&self) -> String {
        self.shop.viewer_url()
    }

    /// Sends every finished span to the collector.
    pub fn flush_spans(&self) {
        self.provider.force_flush().expect("flush spans");
    }
}
