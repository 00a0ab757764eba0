//! spanprof's example service: a small shop backend in three services — the checkout
//! API (axum), inventory (tonic gRPC) and payments (plain hyper) — profiled per span,
//! with the embedded viewer on a loopback listener of its own.
//!
//! `cargo run --release -p checkout` starts it, runs load for 20 s and prints the
//! viewer's URL. It behaves as a service should: only the API listens where
//! `--listen` says (the viewer, the profile endpoint and the backends stay on
//! loopback), CPU-heavy steps run off the runtime's workers, accept errors are
//! retried, names are route templates, only W3C trace contexts are honoured, and
//! SIGINT/SIGTERM drain requests and flush profiles and spans before exiting.

pub mod accept;
pub mod api;
pub mod cpu;
pub mod health;
pub mod inventory;
pub mod load;
pub mod payments;
pub mod shop;
pub mod stop;
pub mod telemetry;

/// The generated gRPC code of `proto/inventory.proto` (see `tests/bootstrap.rs`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    include!("inventory_proto.rs");
}

use std::future::Future;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use spanprof::Profiler;
use spanprof_viewer::{Exposure, RecentSpans, Viewer, ViewerThread};
use tokio::task::JoinHandle;

use crate::accept::Acceptor;
use crate::cpu::CpuPool;
use crate::stop::StopTrigger;

/// Where the services listen, and how much CPU the shop's heavy steps may use.
#[derive(Debug, Clone)]
pub struct ShopConfig {
    /// The API address, the only one that may be public. Defaults to
    /// 127.0.0.1:3000. Inventory and payments take the next free ports on loopback.
    pub listen: SocketAddr,
    /// The viewer's and the profile endpoint's address: loopback only (profiles
    /// show code, routes and timings). Defaults to 127.0.0.1:6060 (or the next free
    /// port).
    pub viewer: SocketAddr,
    /// Threads for the CPU-heavy steps of requests. Defaults to one per core.
    pub cpu_threads: usize,
}

impl Default for ShopConfig {
    fn default() -> Self {
        ShopConfig {
            listen: "127.0.0.1:3000".parse().expect("an address"),
            viewer: "127.0.0.1:6060".parse().expect("an address"),
            cpu_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        }
    }
}

/// The running shop.
#[derive(Debug)]
pub struct Shop {
    /// The API address.
    pub api: SocketAddr,
    /// The inventory gRPC address (loopback).
    pub inventory: SocketAddr,
    /// The payments address (loopback).
    pub payments: SocketAddr,
    /// The viewer's address (loopback), also serving `/debug/spanprof/profile`.
    pub viewer: SocketAddr,
    /// The profiler.
    pub profiler: Profiler,
    /// Recent spans (what the viewer lists).
    pub spans: RecentSpans,
    servers: Servers,
}

#[derive(Debug)]
struct Servers {
    stop_api: StopTrigger,
    api: JoinHandle<()>,
    stop_backends: StopTrigger,
    backends: Vec<JoinHandle<()>>,
    viewer: ViewerThread,
    viewer_handle: Viewer,
}

/// How a shutdown went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Whether every request in flight finished before the deadline.
    pub in_time: bool,
    /// How long it took.
    pub took: Duration,
}

impl Shop {
    /// The viewer's URL.
    pub fn viewer_url(&self) -> String {
        format!("http://{}{}", self.viewer, spanprof_viewer::VIEWER_PATH)
    }

    /// Stops the shop within `deadline`: open profile captures of the viewer end at
    /// once (each answers what it collected), the API stops accepting and finishes
    /// its requests in flight (which still reach the backends), then the backends do
    /// the same, then the viewer. Whatever is still running at `deadline` is cut.
    pub async fn shutdown(self, deadline: Duration) -> Drained {
        let started = Instant::now();
        let s = self.servers;
        s.viewer_handle.close();
        let drain = async {
            s.stop_api.stop();
            let _ = s.api.await;
            s.stop_backends.stop();
            for b in s.backends {
                let _ = b.await;
            }
        };
        let drained = tokio::time::timeout(deadline, drain).await.is_ok();
        let viewer = s.viewer;
        let left = deadline.saturating_sub(started.elapsed());
        let viewer_stopped = tokio::task::spawn_blocking(move || viewer.stop_within(left))
            .await
            .unwrap_or(false);
        Drained {
            in_time: drained && viewer_stopped,
            took: started.elapsed(),
        }
    }
}

/// The loopback address of the same family as `addr`.
fn loopback_like(addr: SocketAddr) -> std::net::IpAddr {
    if addr.is_ipv6() {
        Ipv6Addr::LOCALHOST.into()
    } else {
        Ipv4Addr::LOCALHOST.into()
    }
}

/// Starts the three services (the API on `cfg.listen`, inventory and payments on
/// loopback at the next free ports) on the current runtime, and the viewer on its
/// own loopback listener and thread. The profiler and tracing must be started first
/// ([`Profiler::current_or_start`], [`telemetry::init`]).
pub async fn start(
    cfg: &ShopConfig,
    profiler: Profiler,
    spans: RecentSpans,
) -> std::io::Result<Shop> {
    if !cfg.viewer.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "the viewer's address {} is not loopback: profiles show code, routes and timings \
                 (reach it from elsewhere through an SSH tunnel)",
                cfg.viewer
            ),
        ));
    }
    shop::warm_up();
    let (stop_backends, backend_stop) = stop::channel();
    let next = |port: u16| if port == 0 { 0 } else { port.saturating_add(1) };
    let local = loopback_like(cfg.listen);
    let inventory = bind_near(SocketAddr::new(local, next(cfg.listen.port()))).await?;
    let inventory_addr = inventory.local_addr()?;
    let payments = bind_near(SocketAddr::new(local, next(inventory_addr.port()))).await?;
    let payments_addr = payments.local_addr()?;
    let backends = vec![
        spawn_server(
            "inventory",
            inventory::serve(Acceptor::new(inventory, "inventory"), backend_stop.clone()),
        ),
        spawn_server(
            "payments",
            payments::serve(Acceptor::new(payments, "payments"), backend_stop),
        ),
    ];
    let viewer_handle = Viewer::new(profiler.clone(), spans.clone());
    let viewer = start_viewer(viewer_handle.clone(), cfg.viewer)?;

    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    let api_addr = listener.local_addr()?;
    let app = api::router(api::AppState::new(
        inventory_addr,
        payments_addr,
        CpuPool::new(cfg.cpu_threads),
    ));
    let (stop_api, api_stop) = stop::channel();
    let api = spawn_server("checkout API", async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { api_stop.stopped().await })
            .await
    });
    Ok(Shop {
        api: api_addr,
        inventory: inventory_addr,
        payments: payments_addr,
        viewer: viewer.local_addr(),
        profiler,
        spans,
        servers: Servers {
            stop_api,
            api,
            stop_backends,
            backends,
            viewer,
            viewer_handle,
        },
    })
}

/// Starts tracing (`telemetry`, with the viewer's recent spans) and the shop on
/// ports the system picks on loopback, API and viewer included: what the tests and
/// the benchmark run. Call it on a runtime with spanprof's hooks.
pub async fn start_local(
    profiler: Profiler,
    telemetry: &telemetry::Telemetry,
) -> Result<(Shop, opentelemetry_sdk::trace::SdkTracerProvider), String> {
    let spans = RecentSpans::new(spanprof_viewer::DEFAULT_MAX_TRACES);
    let provider = telemetry::init(&spans, telemetry)?.provider;
    let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let cfg = ShopConfig {
        listen: any,
        viewer: any,
        ..ShopConfig::default()
    };
    let shop = start(&cfg, profiler, spans)
        .await
        .map_err(|e| e.to_string())?;
    Ok((shop, provider))
}

fn spawn_server(
    name: &'static str,
    serve: impl Future<Output = std::io::Result<()>> + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "{name} stopped");
        }
    })
}

/// The viewer on `addr` or, if taken, the next free port (up to 50 tries).
fn start_viewer(viewer: Viewer, addr: SocketAddr) -> std::io::Result<ViewerThread> {
    let mut last = None;
    for port in ports_from(addr.port()) {
        match ViewerThread::start(
            viewer.clone(),
            SocketAddr::new(addr.ip(), port),
            Exposure::LoopbackOnly,
        ) {
            Ok(v) => return Ok(v),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free port")))
}

/// Ports to try: `port` and the 49 after it (port 0: any, once).
fn ports_from(port: u16) -> impl Iterator<Item = u16> {
    let n = if port == 0 { 1 } else { 50 };
    (0..n).map(move |i| port.saturating_add(i))
}

/// Binds at `addr` or, if taken, the next free port (up to 50 tries).
async fn bind_near(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = None;
    for port in ports_from(addr.port()) {
        match tokio::net::TcpListener::bind(SocketAddr::new(addr.ip(), port)).await {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free port")))
}
