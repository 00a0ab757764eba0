//! Where a request's trace identity comes from: the OpenTelemetry context of the
//! current `tracing` span (tracing-opentelemetry), else an incoming W3C
//! `traceparent` header (parsed by OpenTelemetry's own propagator), else none.

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Headers longer than this are ignored before parsing (W3C bounds `tracestate` at
/// 512 characters; `traceparent` is 55).
pub(crate) const MAX_TRACE_HEADER_LEN: usize = 1024;

/// The trace identity of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestTrace {
    pub(crate) trace_id: u128,
    pub(crate) span_id: u64,
    pub(crate) parent_span_id: u64,
    pub(crate) sampled: bool,
    /// Whether `span_id` is a real OpenTelemetry span (its attributes can be set).
    pub(crate) otel_span: bool,
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let v = self.0.get(key)?;
        if v.len() > MAX_TRACE_HEADER_LEN {
            return None;
        }
        let v = v.to_str().ok()?;
        if key == "traceparent" && !traceparent_shape_ok(v) {
            return None;
        }
        Some(v)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// W3C's shape rules for `traceparent`, checked before OpenTelemetry's propagator
/// parses it: the propagator accepts trace and span ids shorter than 32 and 16 hex
/// digits (it parses them as numbers), which the W3C says must be ignored.
fn traceparent_shape_ok(v: &str) -> bool {
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let mut parts = v.trim().split('-');
    let (Some(version), Some(trace), Some(span), Some(flags)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let rest_ok = match version {
        "00" => parts.next().is_none(),
        _ => true, // later versions may append fields
    };
    hex(version, 2)
        && version != "ff"
        && hex(trace, 32)
        && hex(span, 16)
        && hex(flags, 2)
        && rest_ok
}

fn new_span_id() -> u64 {
    u64::from_be_bytes(RandomIdGenerator::default().new_span_id().to_bytes())
}

/// The trace identity of the request about to be served.
pub(crate) fn current(headers: &http::HeaderMap) -> RequestTrace {
    let span = tracing::Span::current();
    if !span.is_disabled() {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        if sc.is_valid() {
            return RequestTrace {
                trace_id: u128::from_be_bytes(sc.trace_id().to_bytes()),
                span_id: u64::from_be_bytes(sc.span_id().to_bytes()),
                parent_span_id: 0,
                sampled: sc.is_sampled(),
                otel_span: true,
            };
        }
    }
    if headers.contains_key("traceparent") {
        let cx = TraceContextPropagator::new().extract(&Headers(headers));
        let sc = cx.span().span_context().clone();
        if sc.is_valid() {
            return RequestTrace {
                trace_id: u128::from_be_bytes(sc.trace_id().to_bytes()),
                span_id: new_span_id(),
                parent_span_id: u64::from_be_bytes(sc.span_id().to_bytes()),
                sampled: sc.is_sampled(),
                otel_span: false,
            };
        }
    }
    RequestTrace {
        trace_id: 0,
        span_id: new_span_id(),
        parent_span_id: 0,
        sampled: true,
        otel_span: false,
    }
}

#[cfg(test)]
mod tests {
    use super::traceparent_shape_ok;

    #[test]
    fn traceparent_shapes() {
        assert!(traceparent_shape_ok(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!traceparent_shape_ok("00-1234-5678-01"));
        assert!(!traceparent_shape_ok(
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01"
        ));
        assert!(!traceparent_shape_ok(
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"
        ));
        assert!(!traceparent_shape_ok(
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!traceparent_shape_ok(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"
        ));
    }
}
