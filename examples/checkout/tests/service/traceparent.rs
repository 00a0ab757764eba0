//! Only W3C `traceparent` headers are honoured: a malformed one starts a new trace
//! instead of joining (or inventing) one.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use spanprof_viewer::SpanRecord;

use crate::support::{InProcess, send};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN: &str = "00f067aa0ba902b7";

/// Headers the W3C says to ignore (each one is honoured by a lenient parser that
/// reads ids as numbers or versions as any hex).
fn malformed() -> Vec<String> {
    vec![
        "00-1-2-01".into(),
        format!("00-{}-{SPAN}-01", &TRACE[..16]), // 16-hex trace id
        format!("0-{TRACE}-{SPAN}-01"),           // one-digit version
        format!("000-{TRACE}-{SPAN}-01"),         // three-digit version
        format!("+0-{TRACE}-{SPAN}-01"),          // signed version
        format!("00-{}-{SPAN}-01", &TRACE[..31]), // 31-hex trace id
        format!("00-{}-{SPAN}-01", &TRACE[1..]),  // ditto, other end
        format!("00-+{}-{SPAN}-01", &TRACE[1..]), // signed trace id
        format!("00-{TRACE}-{}-01", &SPAN[..8]),  // 8-hex span id
        format!("00-{TRACE}-{}-01", &SPAN[1..]),  // 15-hex span id
        format!("00-{TRACE}-+{}-01", &SPAN[1..]), // signed span id
        format!("00-{TRACE}-{SPAN}-1"),           // one-digit flags
        format!("00-{TRACE}-{SPAN}-001"),         // three-digit flags
        format!("00-{TRACE}-{SPAN}-01-"),         // version 00, trailing dash
        format!("00-{TRACE}-{SPAN}-01-extra"),    // version 00, extra field
        format!("00-{}-{SPAN}-01", TRACE.to_uppercase()), // upper-case trace id
        format!("00-{TRACE}-{}-01", SPAN.to_uppercase()), // upper-case span id
        format!("00-{TRACE}-{SPAN}-0B"),          // upper-case flags
        format!("ff-{TRACE}-{SPAN}-01"),          // forbidden version
        format!("00-{}-{SPAN}-01", "0".repeat(32)), // zero trace id
        format!("00-{TRACE}-{}-01", "0".repeat(16)), // zero span id
        format!("00-{}g-{SPAN}-01", &TRACE[..31]), // not hex
        format!("00_{TRACE}_{SPAN}_01"),          // wrong separator
        format!("00-{TRACE}-{SPAN}"),             // no flags
        format!("00-{TRACE}{SPAN}-01"),           // missing dash
        String::new(),
    ]
}

/// Valid headers, each with its own trace id (all sampled).
fn valid() -> Vec<(String, String)> {
    let id = |n: u32| format!("{TRACE:.24}{n:08x}");
    vec![
        format!("00-{}-{SPAN}-01", id(1)),
        format!("00-{}-{SPAN}-03", id(2)), // unknown flag bits are ignored
        format!("cc-{}-{SPAN}-01", id(3)), // a later version
        format!("cc-{}-{SPAN}-01-what-the-future-will-be-like", id(4)),
        format!("01-{}-{SPAN}-09", id(5)),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, h)| (h, id(i as u32 + 1)))
    .collect()
}

/// The `GET /cart/{id}` server spans the viewer recorded.
fn cart_spans(shop: &InProcess) -> Vec<SpanRecord> {
    let spans = &shop.shop.spans;
    spans
        .traces(None, 100_000)
        .iter()
        .flat_map(|t| spans.trace(&t.trace_id).unwrap_or_default())
        .filter(|s| s.name == "GET /cart/{id}")
        .collect()
}

/// Sends `GET /cart/…` with `traceparent` and returns the (trace id, parent span id)
/// of the server span it made, as the viewer recorded it.
fn server_span_of(shop: &InProcess, traceparent: &str) -> (String, String) {
    let known: HashSet<String> = cart_spans(shop).into_iter().map(|s| s.span_id).collect();
    let api = shop.shop.api;
    shop.rt.block_on(async {
        let (status, _) = send(
            http::Request::get(format!("http://{api}/cart/c1"))
                .header("traceparent", traceparent)
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(status, 200);
    });
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let new: Vec<SpanRecord> = cart_spans(shop)
            .into_iter()
            .filter(|s| !known.contains(&s.span_id))
            .collect();
        match &new[..] {
            [s] => return (s.trace_id.clone(), s.parent_span_id.clone()),
            [] => assert!(
                Instant::now() < end,
                "no server span recorded for `{traceparent}`"
            ),
            more => panic!("one request, one server span: {more:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn only_w3c_traceparents_are_honoured() {
    let shop = InProcess::start();
    let mut honoured = Vec::new();
    for h in malformed() {
        let (trace, parent) = server_span_of(&shop, &h);
        if !parent.is_empty() {
            honoured.push(format!("`{h}` → trace {trace}, parent {parent}"));
        }
    }
    assert!(
        honoured.is_empty(),
        "{} of {} malformed headers honoured:\n{}",
        honoured.len(),
        malformed().len(),
        honoured.join("\n")
    );
    for (h, trace_id) in valid() {
        let (trace, parent) = server_span_of(&shop, &h);
        assert_eq!(
            (trace.as_str(), parent.as_str()),
            (trace_id.as_str(), SPAN),
            "`{h}`"
        );
    }
}
