//! The inventory service: a tonic gRPC server the checkout API calls over loopback,
//! so one trace spans two services (and the Tonic adapter runs).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use spanprof::tower::GrpcRoute;
use tonic::{Request, Response, Status};
use tower_http::trace::TraceLayer;

use crate::proto::inventory_server::{Inventory, InventoryServer};
use crate::proto::{ReserveReply, ReserveRequest};
use crate::telemetry::{backend_layer, server_span};

/// Stock by SKU.
#[derive(Debug, Default)]
pub struct Stock {
    levels: Mutex<HashMap<String, u32>>,
}

#[tonic::async_trait]
impl Inventory for Stock {
    async fn reserve(
        &self,
        req: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        let req = req.into_inner();
        let reserved = check_stock(&self.levels, &req);
        // The stock database round trip.
        tokio::time::sleep(Duration::from_millis(3)).await;
        Ok(Response::new(ReserveReply { ok: true, reserved }))
    }
}

#[inline(never)]
fn check_stock(levels: &Mutex<HashMap<String, u32>>, req: &ReserveRequest) -> u32 {
    let mut levels = levels.lock().unwrap_or_else(|e| e.into_inner());
    let mut reserved = 0;
    for line in &req.lines {
        let level = levels.entry(line.sku.clone()).or_insert(1_000_000);
        *level = level.saturating_sub(line.quantity);
        reserved += line.quantity;
    }
    reserved
}

/// Serves the inventory on `addr` (loopback); returns the bound address.
pub async fn serve(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let layer = backend_layer()?.make_route(GrpcRoute);
    tokio::spawn(async move {
        let r = tonic::transport::Server::builder()
            .layer(
                TraceLayer::new_for_grpc()
                    .make_span_with(|req: &http::Request<_>| server_span(req, "inventory")),
            )
            .layer(layer)
            .add_service(InventoryServer::new(Stock::default()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "inventory server stopped");
        }
    });
    Ok(bound)
}
