//! A checkout exports the application's spans only (no h2/tonic/hyper internals): a
//! handful per request, so a trace backend and the viewer's trace memory hold
//! requests, not transport chatter.

use std::collections::{BTreeSet, HashMap};

use crate::support::{InProcess, checkout};

/// Spans a checkout makes: the API's server span, its three steps and two client
/// calls, and the two backends' server spans.
const CHECKOUT_SPANS: &[&str] = &[
    "POST /checkout",
    "validate_line_items",
    "reserve_inventory",
    "POST /inventory.Inventory/Reserve",
    "apply_discounts",
    "charge_payment",
    "POST /pay",
    "format_response",
];

#[test]
fn a_checkout_exports_only_its_application_spans() {
    let shop = InProcess::start();
    let api = shop.shop.api;
    shop.rt.block_on(async {
        for i in 0..CHECKOUTS {
            let (status, body) = checkout(api, i).await.unwrap();
            assert_eq!(status, 200, "{body}");
        }
    });
    shop.flush_spans();
    // What the viewer keeps, then what went to the collector.
    let recorded: Vec<(String, String)> = shop
        .shop
        .spans
        .traces(None, 100_000)
        .iter()
        .flat_map(|t| shop.shop.spans.trace(&t.trace_id).unwrap_or_default())
        .map(|s| (s.trace_id, s.name))
        .collect();
    check("recorded for the viewer", &recorded);
    let exported: Vec<(String, String)> = shop
        .collector
        .spans()
        .into_iter()
        .map(|s| (format!("{:02x?}", s.trace_id), s.name))
        .collect();
    check("exported", &exported);
}

const CHECKOUTS: u64 = 20;

/// `spans` (trace id, name) hold the checkouts' traces, each with at most 10 spans,
/// all of them the application's, and nothing else.
#[track_caller]
fn check(what: &str, spans: &[(String, String)]) {
    let mut by_trace: HashMap<&str, Vec<&str>> = HashMap::new();
    for (trace, name) in spans {
        by_trace.entry(trace).or_default().push(name);
    }
    let names: BTreeSet<&str> = spans.iter().map(|(_, n)| n.as_str()).collect();
    let unexpected: Vec<_> = names
        .iter()
        .filter(|n| !CHECKOUT_SPANS.contains(n))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{what}: {} spans in {} traces for {CHECKOUTS} checkouts, not the application's: {unexpected:?}",
        spans.len(),
        by_trace.len()
    );
    let counts: Vec<usize> = by_trace.values().map(Vec::len).collect();
    assert_eq!(
        by_trace.len() as u64,
        CHECKOUTS,
        "{what}: traces: {by_trace:#?}"
    );
    assert!(
        counts.iter().all(|&n| n <= 10),
        "{what}: spans per checkout: {counts:?}"
    );
}
