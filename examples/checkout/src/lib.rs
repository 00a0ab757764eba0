//! spanprof's example service: a small shop backend in three services — the checkout
//! API (axum), inventory (tonic gRPC) and payments (plain hyper) — profiled per span,
//! with the embedded viewer at `/debug/spanprof/`.
//!
//! `cargo run --release -p checkout` starts it, runs load for 20 s and prints the
//! viewer's URL.

pub mod api;
pub mod inventory;
pub mod load;
pub mod payments;
pub mod shop;
pub mod telemetry;

/// The generated gRPC code of `proto/inventory.proto` (see `tests/bootstrap.rs`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    include!("inventory_proto.rs");
}

use std::net::SocketAddr;

use spanprof::Profiler;
use spanprof_viewer::{RecentSpans, Viewer};

/// Where the services listen.
#[derive(Debug, Clone)]
pub struct ShopConfig {
    /// The API (and viewer) address. Defaults to 127.0.0.1:3000.
    pub listen: SocketAddr,
}

impl Default for ShopConfig {
    fn default() -> Self {
        ShopConfig {
            listen: "127.0.0.1:3000".parse().expect("an address"),
        }
    }
}

/// The running shop.
#[derive(Debug)]
pub struct Shop {
    /// The API address (the viewer is at `/debug/spanprof/` there).
    pub api: SocketAddr,
    /// The inventory gRPC address.
    pub inventory: SocketAddr,
    /// The payments address.
    pub payments: SocketAddr,
    /// The profiler.
    pub profiler: Profiler,
    /// Recent spans (what the viewer lists).
    pub spans: RecentSpans,
}

impl Shop {
    /// The viewer's URL.
    pub fn viewer_url(&self) -> String {
        format!("http://{}/debug/spanprof/", self.api)
    }
}

/// Starts the three services on loopback (the API on `cfg.listen`, the others on
/// the next free ports) on the current runtime. The profiler and tracing must be
/// started first ([`Profiler::current_or_start`], [`telemetry::init`]).
pub async fn start(
    cfg: &ShopConfig,
    profiler: Profiler,
    spans: RecentSpans,
) -> std::io::Result<Shop> {
    shop::warm_up();
    let loopback = |port: u16| SocketAddr::new(cfg.listen.ip(), port);
    let next = if cfg.listen.port() == 0 {
        0
    } else {
        cfg.listen.port() + 1
    };
    let inventory = bind_near(loopback(next), inventory::serve).await?;
    let payments = bind_near(
        loopback(if next == 0 { 0 } else { inventory.port() + 1 }),
        payments::serve,
    )
    .await?;
    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    let api = listener.local_addr()?;
    let app = api::router(api::AppState::new(inventory, payments))
        .merge(Viewer::new(profiler.clone(), spans.clone()).router());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "checkout API stopped");
        }
    });
    Ok(Shop {
        api,
        inventory,
        payments,
        profiler,
        spans,
    })
}

/// Binds at `addr` or, if taken, the next free port (up to 50 tries).
async fn bind_near<F, Fut>(addr: SocketAddr, serve: F) -> std::io::Result<SocketAddr>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<SocketAddr>>,
{
    let mut last = None;
    for i in 0..50u16 {
        let port = if addr.port() == 0 {
            0
        } else {
            addr.port().saturating_add(i)
        };
        match serve(SocketAddr::new(addr.ip(), port)).await {
            Ok(a) => return Ok(a),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free port")))
}
