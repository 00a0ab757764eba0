//! The service the `overhead` benchmark measures, shared word for word with the
//! pyroscope-rs anchor (`benches/anchors/pyroscope-overhead` includes this file with
//! `#[path]`, so both servers run the same handlers): a light JSON API handler and
//! the checkout example's handler mix (on this crate's frozen copy of its shop), the "user's existing stack" (tower-http's
//! `TraceLayer` and `tracing-opentelemetry` exporting through a batch span processor
//! to an in-process exporter that discards), and the control channel the benchmark
//! reads the server's CPU time through.
//!
//! This file uses only crates both packages depend on, and reaches the shop's
//! business logic as `crate::shop` (`workloads/src/shop.rs`, included by the anchor
//! too).

use std::io::{BufRead, Write};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::{get, post};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanData, SpanExporter};
use serde::{Deserialize, Serialize};

/// The JSON API route.
pub const ORDERS_ROUTE: &str = "/api/orders";

/// Line items in each generated order: about 50 µs of CPU per request (parse,
/// validate, price, serialize) in a release build on the project's machines.
pub const ORDER_ITEMS: usize = 80;

/// A customer placing an order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Customer {
    /// Customer id.
    pub id: u64,
    /// E-mail address.
    pub email: String,
    /// Display name.
    pub name: String,
    /// Loyalty tier: `basic`, `silver` or `gold`.
    pub tier: String,
}

/// One line of an order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderItem {
    /// Stock keeping unit, `SKU-` and five digits.
    pub sku: String,
    /// Quantity, 1 to 99.
    pub quantity: u32,
    /// Unit price in cents.
    pub unit_price_cents: u64,
    /// Free-form tags.
    pub tags: Vec<String>,
    /// Gift message, if any.
    pub gift_message: Option<String>,
}

/// Where the order goes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Shipping {
    /// ISO country code.
    pub country: String,
    /// Postcode, digits only.
    pub postcode: String,
    /// Street address.
    pub street: String,
    /// Express delivery.
    pub express: bool,
}

/// `POST /api/orders` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order {
    /// Client-chosen id.
    pub order_id: String,
    /// Who orders.
    pub customer: Customer,
    /// ISO currency code.
    pub currency: String,
    /// The lines.
    pub items: Vec<OrderItem>,
    /// Delivery.
    pub shipping: Shipping,
    /// Notes for the warehouse.
    pub notes: Option<String>,
}

/// One priced line of the response.
#[derive(Debug, Serialize)]
pub struct PricedItem {
    /// The SKU.
    pub sku: String,
    /// Quantity.
    pub quantity: u32,
    /// Line total before tax.
    pub net_cents: u64,
    /// Tax on the line.
    pub tax_cents: u64,
    /// Loyalty discount on the line.
    pub discount_cents: u64,
}

/// `POST /api/orders` answer.
#[derive(Debug, Serialize)]
pub struct Receipt {
    /// The order.
    pub order_id: String,
    /// Customer id.
    pub customer_id: u64,
    /// Currency.
    pub currency: String,
    /// Priced lines.
    pub items: Vec<PricedItem>,
    /// Shipping cost.
    pub shipping_cents: u64,
    /// Grand total.
    pub total_cents: u64,
    /// Distinct tags over all lines.
    pub tags: Vec<String>,
}

/// A generated order (deterministic in `seed`), as the load generator sends it.
pub fn sample_order(seed: u64) -> Order {
    let countries = ["DE", "FR", "NL", "IT", "ES"];
    Order {
        order_id: format!("ord-{seed:08}"),
        customer: Customer {
            id: 10_000 + seed % 977,
            email: format!("customer{}@example.org", seed % 977),
            name: format!("Customer Number {}", seed % 977),
            tier: ["basic", "silver", "gold"][(seed % 3) as usize].to_owned(),
        },
        currency: "EUR".to_owned(),
        items: (0..ORDER_ITEMS as u64)
            .map(|i| OrderItem {
                sku: format!("SKU-{:05}", (seed * 7919 + i * 104_729) % 50_000),
                quantity: 1 + ((seed + i) % 5) as u32,
                unit_price_cents: 199 + (seed * 31 + i * 37) % 9_000,
                tags: vec![
                    ["books", "garden", "kitchen", "toys"][(i % 4) as usize].to_owned(),
                    format!("batch-{}", (seed + i) % 13),
                ],
                gift_message: (i % 7 == 0).then(|| "Happy birthday, with love".to_owned()),
            })
            .collect(),
        shipping: Shipping {
            country: countries[(seed % 5) as usize].to_owned(),
            postcode: format!("{:05}", 10_000 + seed % 89_999),
            street: format!("{} Long Street", 1 + seed % 300),
            express: seed.is_multiple_of(4),
        },
        notes: seed
            .is_multiple_of(3)
            .then(|| "Leave at the door, ring twice.".to_owned()),
    }
}

/// Why an order was refused.
#[derive(Debug)]
pub struct Rejected(pub String);

fn validate(o: &Order) -> Result<(), Rejected> {
    let _span = tracing::info_span!("validate_order").entered();
    let bad = |what: &str| Err(Rejected(format!("{}: {what}", o.order_id)));
    let email = &o.customer.email;
    match email.split_once('@') {
        Some((user, domain)) if !user.is_empty() && domain.contains('.') => {}
        _ => return bad("e-mail"),
    }
    if !["basic", "silver", "gold"].contains(&o.customer.tier.as_str()) {
        return bad("tier");
    }
    if !["EUR", "USD", "GBP"].contains(&o.currency.as_str()) {
        return bad("currency");
    }
    if o.items.is_empty() || o.items.len() > 100 {
        return bad("item count");
    }
    for item in &o.items {
        let digits = item.sku.strip_prefix("SKU-").unwrap_or("");
        if digits.len() != 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return bad("sku");
        }
        if !(1..100).contains(&item.quantity) || item.unit_price_cents == 0 {
            return bad("quantity or price");
        }
        if item.tags.iter().any(|t| t.is_empty() || t.len() > 32) {
            return bad("tag");
        }
    }
    let s = &o.shipping;
    if s.country.len() != 2
        || s.postcode.is_empty()
        || !s.postcode.bytes().all(|b| b.is_ascii_digit())
    {
        return bad("shipping address");
    }
    Ok(())
}

fn price(o: &Order) -> Receipt {
    let tax_permille = match o.shipping.country.as_str() {
        "DE" => 190,
        "FR" | "IT" => 200,
        "NL" => 210,
        _ => 210,
    };
    let discount_permille = match o.customer.tier.as_str() {
        "gold" => 100,
        "silver" => 50,
        _ => 0,
    };
    let items: Vec<PricedItem> = o
        .items
        .iter()
        .map(|i| {
            let net = i.unit_price_cents * u64::from(i.quantity);
            let discount = net * discount_permille / 1000;
            PricedItem {
                sku: i.sku.clone(),
                quantity: i.quantity,
                net_cents: net - discount,
                tax_cents: (net - discount) * tax_permille / 1000,
                discount_cents: discount,
            }
        })
        .collect();
    let mut tags: Vec<String> = o
        .items
        .iter()
        .flat_map(|i| i.tags.iter().cloned())
        .collect();
    tags.sort_unstable();
    tags.dedup();
    let shipping_cents = if o.shipping.express { 1_490 } else { 490 };
    let total_cents = items.iter().map(|i| i.net_cents + i.tax_cents).sum::<u64>() + shipping_cents;
    Receipt {
        order_id: o.order_id.clone(),
        customer_id: o.customer.id,
        currency: o.currency.clone(),
        items,
        shipping_cents,
        total_cents,
        tags,
    }
}

/// The JSON API handler's work: parse, validate, price, serialize.
#[inline(never)]
pub fn handle_order(body: &[u8]) -> Result<String, Rejected> {
    let order: Order =
        serde_json::from_slice(body).map_err(|e| Rejected(format!("bad JSON: {e}")))?;
    validate(&order)?;
    let receipt = price(&order);
    serde_json::to_string(&receipt).map_err(|e| Rejected(e.to_string()))
}

/// Per-request hooks around each handler's work: the pyroscope-rs anchor sets and
/// removes its thread tag here (`tag_wrapper`). Unset, a handler pays one load.
pub struct RequestHooks {
    /// Called with the route as the handler starts.
    pub enter: Box<dyn Fn(&'static str) + Send + Sync>,
    /// Called with the route as the handler ends.
    pub exit: Box<dyn Fn(&'static str) + Send + Sync>,
}

/// The hooks, set once at start-up by servers that want them.
pub static REQUEST_HOOKS: OnceLock<RequestHooks> = OnceLock::new();

struct HookGuard(&'static str);

impl HookGuard {
    fn new(route: &'static str) -> Option<HookGuard> {
        let hooks = REQUEST_HOOKS.get()?;
        (hooks.enter)(route);
        Some(HookGuard(route))
    }
}

impl Drop for HookGuard {
    fn drop(&mut self) {
        if let Some(hooks) = REQUEST_HOOKS.get() {
            (hooks.exit)(self.0);
        }
    }
}

async fn orders(body: Bytes) -> (StatusCode, String) {
    let _tag = HookGuard::new(ORDERS_ROUTE);
    match handle_order(&body) {
        Ok(receipt) => (StatusCode::OK, receipt),
        Err(Rejected(why)) => (StatusCode::UNPROCESSABLE_ENTITY, why),
    }
}

async fn checkout_handler() -> String {
    let _tag = HookGuard::new("/checkout");
    let cart = crate::shop::sample_cart("bench", 4, 7);
    let lines = crate::shop::validate_line_items(&cart.items).unwrap_or_default();
    let discount = crate::shop::apply_discounts(&lines, cart.coupon.as_deref());
    let priced = crate::shop::price(&cart.cart_id, lines, discount);
    crate::shop::format_response(&priced)
}

async fn cart_handler() -> String {
    let _tag = HookGuard::new("/cart/{id}");
    let cart = crate::shop::sample_cart("bench", 2, 3);
    let lines = crate::shop::validate_line_items(&cart.items).unwrap_or_default();
    crate::shop::format_response(&crate::shop::price(&cart.cart_id, lines, 0))
}

/// The service's routes: `POST /api/orders` (the JSON API) and the checkout mix
/// (`GET /checkout`, `GET /cart/{id}`), without any middleware.
pub fn routes() -> Router {
    crate::shop::warm_up();
    Router::new()
        .route(ORDERS_ROUTE, post(orders))
        .route("/checkout", get(checkout_handler))
        .route("/cart/{id}", get(cart_handler))
}

/// Spans the discarding exporter received (so the export is not optimised away).
pub static SPANS_EXPORTED: AtomicU64 = AtomicU64::new(0);

/// A span exporter that counts the spans of each batch and drops them: the local sink
/// of the user's stack. Spans are built, queued and batched as with a real OTLP
/// exporter; only the encoding and the network send are left out.
#[derive(Debug, Default)]
pub struct DiscardingExporter;

impl SpanExporter for DiscardingExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        SPANS_EXPORTED.fetch_add(batch.len() as u64, Ordering::Relaxed);
        drop(std::hint::black_box(batch));
        Ok(())
    }
}

/// The user's span processor: the SDK's batch processor (its own thread, default
/// queue and batch sizes) in front of [`DiscardingExporter`].
pub fn batch_processor() -> BatchSpanProcessor {
    BatchSpanProcessor::builder(DiscardingExporter).build()
}

/// Binds the server on loopback, prints `port N`, serves `app` on `rt`, and answers
/// each line read from standard input with this process's CPU time in nanoseconds
/// (from `cpu_ns`), until standard input closes.
pub fn serve(rt: &tokio::runtime::Runtime, app: Router, cpu_ns: fn() -> u64) {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    rt.spawn(async move { axum::serve(listener, app).await.expect("serve") });
    let mut out = std::io::stdout().lock();
    writeln!(out, "port {port}").expect("stdout");
    out.flush().expect("stdout");
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
        writeln!(out, "{}", cpu_ns()).expect("stdout");
        out.flush().expect("stdout");
    }
}
