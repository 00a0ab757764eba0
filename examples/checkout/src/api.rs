//! The checkout API (axum): `POST /checkout`, `GET /cart/{id}`, `GET /health`.
//!
//! The handlers' CPU-heavy steps run on the [`CpuPool`], so a slow cart never holds
//! a runtime worker. `/health` says whether the backends answer ([`BackendHealth`])
//! and, like any health check polled every few seconds, makes no span.

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

use crate::cpu::{CpuError, CpuPool};
use crate::health::BackendHealth;
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
    cpu: CpuPool,
    health: BackendHealth,
}

impl AppState {
    /// Clients of the inventory (gRPC) and payments (HTTP) services, whose health
    /// is probed from now on; CPU-heavy steps on `cpu`. Call it inside a tokio
    /// runtime.
    pub fn new(
        inventory_addr: std::net::SocketAddr,
        payments_addr: std::net::SocketAddr,
        cpu: CpuPool,
    ) -> Self {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{inventory_addr}"))
            .expect("a valid address")
            .connect_lazy();
        AppState {
            inventory: InventoryClient::new(channel),
            payments_url: format!("http://{payments_addr}/pay").into(),
            http: Client::builder(TokioExecutor::new()).build_http(),
            cpu,
            health: BackendHealth::probe(inventory_addr, payments_addr),
        }
    }
}

impl From<CpuError> for (StatusCode, String) {
    fn from(e: CpuError) -> Self {
        (StatusCode::INTERNAL_SERVER_ERROR, e.0)
    }
}

/// The route template of an API request (`(unmatched)` for paths no route takes:
/// they could hold ids).
fn route<B>(req: &http::Request<B>) -> &str {
    req.extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or(spanprof::tower::UNMATCHED_ROUTE, |m| m.as_str())
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
        .route("/health", get(health))
        .layer(layer)
        .layer(
            TraceLayer::new_for_http().make_span_with(|req: &http::Request<_>| match route(req) {
                "/health" => tracing::Span::none(),
                r => server_span(req, "checkout", r),
            }),
        )
        .with_state(state)
}

async fn health(State(state): State<AppState>) -> (StatusCode, String) {
    match state.health.problems() {
        None => (StatusCode::OK, "ok\n".into()),
        Some(p) => (StatusCode::SERVICE_UNAVAILABLE, format!("{p}\n")),
    }
}

async fn checkout(
    State(state): State<AppState>,
    Json(req): Json<CheckoutRequest>,
) -> Result<String, (StatusCode, String)> {
    let req = Arc::new(req);
    let r = req.clone();
    let lines = state
        .cpu
        .run(move || shop::validate_line_items(&r.items))
        .await?
        .map_err(|e| (StatusCode::UNPROCESSABLE_ENTITY, e.0))?;
    reserve(&state, &req).await?;
    let r = req.clone();
    let cart = state
        .cpu
        .run(move || {
            let discount = shop::apply_discounts(&lines, r.coupon.as_deref());
            shop::price(&r.cart_id, lines, discount)
        })
        .await?;
    pay(&state, cart.total_cents).await?;
    Ok(state.cpu.run(move || shop::format_response(&cart)).await?)
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
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        if !status.is_success() {
            return Err((
                StatusCode::BAD_GATEWAY,
                format!("payments answered {status}"),
            ));
        }
        Ok(())
    }
    .instrument(span)
    .await
}

async fn cart(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<String, (StatusCode, String)> {
    // A small cart rendered from the catalog.
    Ok(state
        .cpu
        .run(move || {
            let cart = shop::sample_cart(&id, 3, id.len() as u64);
            let lines = shop::validate_line_items(&cart.items).unwrap_or_default();
            let priced = shop::price(&cart.cart_id, lines, 0);
            shop::format_response(&priced)
        })
        .await?)
}
