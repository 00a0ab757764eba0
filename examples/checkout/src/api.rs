//! The checkout API (axum): `POST /checkout`, `GET /cart/{id}`, `GET /health`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use spanprof::tower::{ProfileCorrelationLayer, RoutePolicy};
use tower_http::trace::TraceLayer;
use tracing::Instrument;

use crate::proto::inventory_client::InventoryClient;
use crate::proto::{Line, ReserveRequest};
use crate::shop::{self, CheckoutRequest};
use crate::telemetry::{inject, server_span};

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    inventory: InventoryClient<tonic::transport::Channel>,
    payments_url: Arc<str>,
    http: Client<HttpConnector, Full<Bytes>>,
}

impl AppState {
    /// Clients of the inventory (gRPC) and payments (HTTP) services.
    pub fn new(inventory_addr: std::net::SocketAddr, payments_addr: std::net::SocketAddr) -> Self {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{inventory_addr}"))
            .expect("a valid address")
            .connect_lazy();
        AppState {
            inventory: InventoryClient::new(channel),
            payments_url: format!("http://{payments_addr}/pay").into(),
            http: Client::builder(TokioExecutor::new()).build_http(),
        }
    }
}

/// The API with spanprof's layer: `/checkout` 10 % hot and slow after 250 ms,
/// `/health` not profiled.
pub fn router(state: AppState) -> Router {
    let layer = ProfileCorrelationLayer::builder()
        .route(
            "/checkout",
            RoutePolicy::new()
                .sample_rate(0.1)
                .slow_after(Duration::from_millis(250)),
        )
        .route("/cart/{id}", RoutePolicy::new().sample_rate(0.05))
        .disable_route("/health")
        .build()
        .expect("valid profiling policy");
    Router::new()
        .route("/checkout", post(checkout))
        .route("/cart/{id}", get(cart))
        .route("/health", get(|| async { "ok" }))
        .layer(layer)
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &http::Request<_>| server_span(req, "checkout")),
        )
        .with_state(state)
}

async fn checkout(
    State(state): State<AppState>,
    Json(req): Json<CheckoutRequest>,
) -> Result<String, (StatusCode, String)> {
    let lines = shop::validate_line_items(&req.items)
        .map_err(|e| (StatusCode::UNPROCESSABLE_ENTITY, e.0))?;
    reserve(&state, &req).await?;
    let discount = shop::apply_discounts(&lines, req.coupon.as_deref());
    let cart = shop::price(&req.cart_id, lines, discount);
    pay(&state, cart.total_cents).await?;
    Ok(shop::format_response(&cart))
}

async fn reserve(state: &AppState, req: &CheckoutRequest) -> Result<(), (StatusCode, String)> {
    let span = tracing::info_span!("reserve_inventory");
    async {
        let mut request = tonic::Request::new(ReserveRequest {
            cart_id: req.cart_id.clone(),
            lines: req
                .items
                .iter()
                .map(|i| Line {
                    sku: i.sku.clone(),
                    quantity: i.quantity,
                })
                .collect(),
        });
        let mut headers = http::HeaderMap::new();
        inject(&mut headers);
        for (k, v) in &headers {
            if let Ok(v) = v.to_str()
                && let Ok(v) = v.parse()
            {
                request.metadata_mut().insert(
                    tonic::metadata::MetadataKey::from_bytes(k.as_str().as_bytes())
                        .expect("a valid key"),
                    v,
                );
            }
        }
        state
            .inventory
            .clone()
            .reserve(request)
            .await
            .map(drop)
            .map_err(|e| {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("inventory: {}", e.message()),
                )
            })
    }
    .instrument(span)
    .await
}

async fn pay(state: &AppState, total_cents: u64) -> Result<(), (StatusCode, String)> {
    let span = tracing::info_span!("charge_payment");
    async {
        let mut req = http::Request::post(&*state.payments_url)
            .body(Full::new(Bytes::from(format!(
                "{{\"amount_cents\":{total_cents}}}"
            ))))
            .expect("a valid request");
        inject(req.headers_mut());
        let resp = state
            .http
            .request(req)
            .await
            .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, format!("payments: {e}")))?;
        let _ = resp.into_body().collect().await;
        Ok(())
    }
    .instrument(span)
    .await
}

async fn cart(Path(id): Path<String>) -> String {
    // A small cart rendered from the catalog.
    let cart = shop::sample_cart(&id, 3, id.len() as u64);
    let lines = shop::validate_line_items(&cart.items).unwrap_or_default();
    let priced = shop::price(&cart.cart_id, lines, 0);
    shop::format_response(&priced)
}
