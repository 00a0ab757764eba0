//! The shop's business logic, with the performance problems the seed articles
//! describe, so their spans have something to show: a price-rule regex compiled for
//! every line item, discount rules parsed from JSON on every request, and a cart
//! serializer that looks each attribute up one at a time (N+1).

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};
use tracing::info_span;

/// One line of a cart.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LineItem {
    /// Stock keeping unit.
    pub sku: String,
    /// Quantity.
    pub quantity: u32,
    /// Unit price in cents.
    pub price_cents: u64,
}

/// `POST /checkout` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckoutRequest {
    /// The cart.
    pub cart_id: String,
    /// Its lines.
    pub items: Vec<LineItem>,
    /// An optional coupon code.
    pub coupon: Option<String>,
}

/// A priced cart.
#[derive(Debug, Clone, Serialize)]
pub struct PricedCart {
    /// The cart.
    pub cart_id: String,
    /// Lines with tax.
    pub lines: Vec<PricedLine>,
    /// Discount in cents.
    pub discount_cents: u64,
    /// Total in cents.
    pub total_cents: u64,
}

/// A priced line.
#[derive(Debug, Clone, Serialize)]
pub struct PricedLine {
    /// The line.
    pub item: LineItem,
    /// Its tax in cents.
    pub tax_cents: u64,
}

/// Why a checkout was refused.
#[derive(Debug)]
pub struct Invalid(pub String);

/// The catalog: 5 000 SKUs with 12 attributes each, kept as a flat list (so a lookup
/// is a scan: the N+1 pattern made visible).
static CATALOG: LazyLock<Vec<(String, &'static str, String)>> = LazyLock::new(|| {
    let mut v = Vec::new();
    for i in 0..5_000 {
        for attr in ATTRIBUTES {
            v.push((format!("SKU-{i:05}"), *attr, format!("{attr}-of-{i}")));
        }
    }
    v
});

const ATTRIBUTES: &[&str] = &[
    "name",
    "brand",
    "color",
    "size",
    "weight",
    "origin",
    "material",
    "warranty",
    "category",
    "rating",
    "stock_zone",
    "hazmat",
];

const PRICE_PATTERN: &str = r"^SKU-(?P<family>\d{2})(?P<item>\d{3})$";

/// Discount rules, as a service would load them from configuration.
const DISCOUNT_RULES: &str = include_str!("discount_rules.json");

/// Validates every line: its SKU against the price rules, then its tax.
#[inline(never)]
pub fn validate_line_items(items: &[LineItem]) -> Result<Vec<PricedLine>, Invalid> {
    let _span = info_span!("validate_line_items", items = items.len()).entered();
    items
        .iter()
        .map(|item| {
            check_price_rules(item)?;
            Ok(PricedLine {
                item: item.clone(),
                tax_cents: calculate_tax(item),
            })
        })
        .collect()
}

/// Checks one line against the price rules. The regex is compiled on every call:
/// the hot path of large carts.
#[inline(never)]
pub fn check_price_rules(item: &LineItem) -> Result<(), Invalid> {
    let re = regex::Regex::new(PRICE_PATTERN).expect("valid pattern");
    let caps = re
        .captures(&item.sku)
        .ok_or_else(|| Invalid(format!("unknown SKU {}", item.sku)))?;
    let family: u32 = caps["family"].parse().unwrap_or(0);
    if item.price_cents == 0 || item.quantity == 0 || family > 99 {
        return Err(Invalid(format!("bad line {}", item.sku)));
    }
    Ok(())
}

/// Tax of one line (a few tax bands, computed the slow way).
#[inline(never)]
pub fn calculate_tax(item: &LineItem) -> u64 {
    let mut tax = 0u64;
    let gross = item.price_cents * u64::from(item.quantity);
    for band in 0..64u64 {
        tax = tax.wrapping_add(black_box(gross * (band % 7 + 1) / 1000));
    }
    tax / 64
}

#[derive(Debug, Deserialize)]
struct DiscountRule {
    min_items: usize,
    percent: u64,
    coupon: Option<String>,
    sku_prefix: Option<String>,
}

/// Applies discounts: loads the rules (parsing JSON on every request) and evaluates
/// them.
#[inline(never)]
pub fn apply_discounts(lines: &[PricedLine], coupon: Option<&str>) -> u64 {
    let _span = info_span!("apply_discounts").entered();
    let rules = load_discount_rules();
    evaluate_rules(&rules, lines, coupon)
}

#[inline(never)]
fn load_discount_rules() -> Vec<DiscountRule> {
    serde_json::from_str(DISCOUNT_RULES).expect("valid rules")
}

#[inline(never)]
fn evaluate_rules(rules: &[DiscountRule], lines: &[PricedLine], coupon: Option<&str>) -> u64 {
    let subtotal: u64 = lines
        .iter()
        .map(|l| l.item.price_cents * u64::from(l.item.quantity))
        .sum();
    let mut best = 0;
    for r in rules {
        let coupon_ok = r.coupon.as_deref().is_none_or(|c| Some(c) == coupon);
        let prefix_ok = r
            .sku_prefix
            .as_deref()
            .is_none_or(|p| lines.iter().any(|l| l.item.sku.starts_with(p)));
        if coupon_ok && prefix_ok && lines.len() >= r.min_items {
            best = best.max(subtotal * r.percent / 100);
        }
    }
    best
}

/// Serializes carts for the response.
pub struct CartSerializer;

impl CartSerializer {
    /// The cart as JSON, with every line's catalog attributes looked up one by one.
    #[inline(never)]
    pub fn to_json(cart: &PricedCart) -> String {
        let mut lines = Vec::with_capacity(cart.lines.len());
        for l in &cart.lines {
            let mut attrs = HashMap::new();
            for attr in ATTRIBUTES {
                if let Some(v) = load_attribute(&l.item.sku, attr) {
                    attrs.insert(*attr, v);
                }
            }
            lines.push(serde_json::json!({
                "sku": l.item.sku, "quantity": l.item.quantity,
                "price_cents": l.item.price_cents, "tax_cents": l.tax_cents, "attributes": attrs,
            }));
        }
        serde_json::json!({
            "cart_id": cart.cart_id, "lines": lines,
            "discount_cents": cart.discount_cents, "total_cents": cart.total_cents,
        })
        .to_string()
    }
}

/// One attribute of one SKU: a scan of the catalog (the "N" of N+1).
#[inline(never)]
pub fn load_attribute(sku: &str, attr: &str) -> Option<String> {
    CATALOG
        .iter()
        .find(|(s, a, _)| s == sku && *a == attr)
        .map(|(_, _, v)| v.clone())
}

/// Prices a validated cart.
#[inline(never)]
pub fn price(cart_id: &str, lines: Vec<PricedLine>, discount_cents: u64) -> PricedCart {
    let total: u64 = lines
        .iter()
        .map(|l| l.item.price_cents * u64::from(l.item.quantity) + l.tax_cents)
        .sum();
    PricedCart {
        cart_id: cart_id.to_owned(),
        lines,
        discount_cents,
        total_cents: total.saturating_sub(discount_cents),
    }
}

/// Builds the response body (the `format_response` step).
#[inline(never)]
pub fn format_response(cart: &PricedCart) -> String {
    let _span = info_span!("format_response").entered();
    CartSerializer::to_json(cart)
}

/// Makes the catalog before the first request (not part of any request's cost).
pub fn warm_up() {
    LazyLock::force(&CATALOG);
}

/// A cart of `n` lines with valid SKUs.
pub fn sample_cart(cart_id: &str, n: usize, seed: u64) -> CheckoutRequest {
    CheckoutRequest {
        cart_id: cart_id.to_owned(),
        items: (0..n)
            .map(|i| LineItem {
                sku: format!("SKU-{:05}", (seed as usize * 7919 + i * 104_729) % 5_000),
                quantity: 1 + (i % 3) as u32,
                price_cents: 199 + (i as u64 * 37) % 5_000,
            })
            .collect(),
        coupon: seed.is_multiple_of(4).then(|| "WELCOME10".to_owned()),
    }
}
