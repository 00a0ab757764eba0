//! The inventory service: a tonic gRPC server the checkout API calls over loopback,
//! so one trace spans two services (and the Tonic adapter runs). Its spans and
//! labels are named by the service's own method paths; any other path is
//! `(unmatched)`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use spanprof::tower::{MakeRoute, UNMATCHED_ROUTE};
use tonic::{Code, Request, Response, Status};
use tower_http::classify::GrpcFailureClass;
use tower_http::trace::TraceLayer;

use crate::accept::Acceptor;
use crate::proto::inventory_server::{Inventory, InventoryServer};
use crate::proto::{ReserveReply, ReserveRequest};
use crate::stop::Stop;
use crate::telemetry::{backend_layer, server_span};

/// The methods served (gRPC paths): the only route names this service uses.
pub const METHODS: &[&str] = &["/inventory.Inventory/Reserve"];

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

/// The route of a request: one of [`METHODS`], else [`UNMATCHED_ROUTE`].
pub fn route<B>(req: &http::Request<B>) -> &'static str {
    let path = req.uri().path();
    METHODS
        .iter()
        .find(|m| **m == path)
        .copied()
        .unwrap_or(UNMATCHED_ROUTE)
}

/// Names profile labels by [`route`].
#[derive(Debug, Clone, Copy)]
struct InventoryRoute;

impl<B> MakeRoute<B> for InventoryRoute {
    fn make_route<'a>(&mut self, req: &'a http::Request<B>) -> Option<Cow<'a, str>> {
        Some(Cow::Borrowed(route(req)))
    }
}

/// Whether a gRPC status is the caller's mistake (an unknown method, a bad
/// argument, …) rather than this server's failure.
fn client_error(code: Code) -> bool {
    matches!(
        code,
        Code::Cancelled
            | Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::Unauthenticated
    )
}

/// How a failed call is logged: the caller's mistakes (a client calling methods this
/// server does not serve gets `Unimplemented`) at debug, so that they cannot flood the
/// log; this server's failures at error, as tower-http does.
fn log_failure(class: GrpcFailureClass, latency: Duration, _span: &tracing::Span) {
    match class {
        GrpcFailureClass::Status(status) if client_error(Code::from(status.code_raw())) => {
            tracing::debug!(%status, ?latency, "call refused: the caller's error");
        }
        class => tracing::error!(classification = %class, ?latency, "call failed"),
    }
}

/// Serves the inventory on `acceptor` until `stop`, then finishes the calls in
/// flight.
pub async fn serve(acceptor: Acceptor, stop: Stop) -> std::io::Result<()> {
    let layer = backend_layer()?.make_route(InventoryRoute);
    tonic::transport::Server::builder()
        .layer(
            TraceLayer::new_for_grpc()
                .make_span_with(|req: &http::Request<_>| server_span(req, "inventory", route(req)))
                .on_failure(log_failure),
        )
        .layer(layer)
        .add_service(InventoryServer::new(Stock::default()))
        .serve_with_incoming_shutdown(acceptor.into_stream(), async move { stop.stopped().await })
        .await
        .map_err(std::io::Error::other)
}
