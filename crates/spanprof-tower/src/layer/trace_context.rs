//! Where a request's trace identity comes from: the OpenTelemetry context of the
//! current `tracing` span (tracing-opentelemetry), else an incoming W3C
//! `traceparent` header (checked against the W3C's rules, then parsed by
//! OpenTelemetry's own propagator), else none. [`extract_trace_context`] offers the
//! same strict extraction to services that make their own server spans.

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

use crate::otel_context::{AttachedContext, LookupSite, SpanIds};
use crate::setup::TraceSource;

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
    /// Where the identity came from (for the set-up checks).
    pub(crate) source: TraceSource,
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

/// The caller's trace context from `traceparent` / `tracestate`, parsed strictly as
/// the [W3C Trace Context](https://www.w3.org/TR/trace-context/) says: a header that
/// breaks its rules is ignored and the result is an empty context (the request
/// starts a new trace), as the W3C requires.
///
/// OpenTelemetry's `TraceContextPropagator` reads ids as numbers and versions as any
/// hex, so it honours headers such as `00-1-2-01` (trace id 1, span id 2), 16-hex
/// trace ids, one- or three-digit versions and flags, `+`-signed fields and a
/// trailing `-`. This function first checks the header's shape — two lowercase hex
/// digits of version (not `ff`), 32 of trace id, 16 of span id, two of flags; for
/// version `00` nothing after the flags — and hands only well-formed headers (of at
/// most 1 024 bytes) to the propagator, which rejects all-zero ids. It is what
/// [`ProfileCorrelationLayer`](crate::ProfileCorrelationLayer) uses; call it where
/// you make a request's server span yourself:
///
/// ```
/// use tracing_opentelemetry::OpenTelemetrySpanExt;
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("traceparent", "00-1-2-01".parse().unwrap());
/// let span = tracing::info_span!("request");
/// let _ = span.set_parent(spanprof_tower::extract_trace_context(&headers)); // ignored: not W3C
/// ```
pub fn extract_trace_context(headers: &http::HeaderMap) -> opentelemetry::Context {
    if !headers.contains_key("traceparent") {
        return opentelemetry::Context::new();
    }
    TraceContextPropagator::new().extract(&Headers(headers))
}

fn new_span_id() -> u64 {
    u64::from_be_bytes(RandomIdGenerator::default().new_span_id().to_bytes())
}

/// Whether the request span's context can be read from OpenTelemetry's attached one.
static REQUEST_SPAN: AttachedContext = AttachedContext::new(LookupSite::Request);

/// The trace identity of the request about to be served.
#[inline]
pub(crate) fn current(headers: &http::HeaderMap) -> RequestTrace {
    let mut source = TraceSource::NoSpan;
    if tracing::dispatcher::get_default(|d| d.current_span().id().is_some()) {
        source = TraceSource::SpanWithoutOtel;
        // A request served inside another's labels (a router called from a handler):
        // the other request's attached context is not this one's.
        let enclosing = spanprof_core::current_span_id();
        let ids = REQUEST_SPAN
            .current_span_ids(enclosing, || SpanIds::of_span(&tracing::Span::current()));
        if let Some(ids) = ids {
            return RequestTrace {
                trace_id: ids.trace_id,
                span_id: ids.span_id,
                parent_span_id: 0,
                sampled: ids.sampled,
                otel_span: true,
                source: TraceSource::OtelSpan,
            };
        }
    }
    if headers.contains_key("traceparent") {
        let cx = extract_trace_context(headers);
        let sc = cx.span().span_context().clone();
        if sc.is_valid() {
            return RequestTrace {
                trace_id: u128::from_be_bytes(sc.trace_id().to_bytes()),
                span_id: new_span_id(),
                parent_span_id: u64::from_be_bytes(sc.span_id().to_bytes()),
                sampled: sc.is_sampled(),
                otel_span: false,
                source,
            };
        }
    }
    RequestTrace {
        trace_id: 0,
        span_id: new_span_id(),
        parent_span_id: 0,
        sampled: true,
        otel_span: false,
        source,
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TraceContextExt;

    use super::{extract_trace_context, traceparent_shape_ok};

    /// The remote span context `traceparent` gives, if honoured.
    fn honoured(traceparent: &str) -> Option<(String, String, bool)> {
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", traceparent.parse().unwrap());
        headers.insert("tracestate", "vendor=value".parse().unwrap());
        let cx = extract_trace_context(&headers);
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| {
            (
                sc.trace_id().to_string(),
                sc.span_id().to_string(),
                sc.is_sampled(),
            )
        })
    }

    const T: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const S: &str = "00f067aa0ba902b7";

    #[test]
    fn the_request_span_is_read_from_opentelemetry_once_checked() {
        // Inside TraceLayer's entered span, tracing-opentelemetry (context activation
        // on, its default) has attached the span's context, whatever the layer order.
        use tracing_opentelemetry::OpenTelemetrySpanExt;

        use crate::otel_context::CHECKS;
        use crate::otel_context::tests::{EXACT_LOOKUPS, otel_dispatch};

        let (dispatch, warnings) = otel_dispatch(true);
        let requests = 3 * u64::from(CHECKS);
        tracing::dispatcher::with_default(&dispatch, || {
            for _ in 0..requests {
                let span = tracing::info_span!("request");
                let sc = span.context().span().span_context().clone();
                let trace = span.in_scope(|| super::current(&http::HeaderMap::new()));
                assert_eq!(trace.source, crate::setup::TraceSource::OtelSpan);
                assert_eq!(trace.span_id, u64::from_be_bytes(sc.span_id().to_bytes()));
                assert_eq!(
                    trace.trace_id,
                    u128::from_be_bytes(sc.trace_id().to_bytes())
                );
                assert_eq!(trace.sampled, sc.is_sampled());
            }
            let outside = super::current(&http::HeaderMap::new());
            assert_eq!(outside.source, crate::setup::TraceSource::NoSpan);
        });
        let asked = EXACT_LOOKUPS.with(|n| n.get());
        assert!(
            asked <= u64::from(CHECKS),
            "{asked} of {requests} requests asked tracing-opentelemetry for their context"
        );
        assert_eq!(warnings.get(), 0);
    }

    #[test]
    fn extraction_ignores_what_the_w3c_says_to_ignore() {
        let malformed = [
            "00-1-2-01".to_owned(),
            format!("00-{}-{S}-01", &T[..16]),
            format!("0-{T}-{S}-01"),
            format!("000-{T}-{S}-01"),
            format!("+0-{T}-{S}-01"),
            format!("00-{}-{S}-01", &T[1..]),
            format!("00-+{}-{S}-01", &T[1..]),
            format!("00-{T}-{}-01", &S[..8]),
            format!("00-{T}-+{}-01", &S[1..]),
            format!("00-{T}-{S}-1"),
            format!("00-{T}-{S}-001"),
            format!("00-{T}-{S}-01-"),
            format!("00-{T}-{S}-01-extra"),
            format!("00-{}-{S}-01", T.to_uppercase()),
            format!("00-{T}-{S}-0B"),
            format!("ff-{T}-{S}-01"),
            format!("00-{}-{S}-01", "0".repeat(32)),
            format!("00-{T}-{}-01", "0".repeat(16)),
            format!("00-{T}-{S}"),
            String::new(),
        ];
        for h in &malformed {
            assert_eq!(honoured(h), None, "`{h}`");
        }
        let mut none = http::HeaderMap::new();
        none.insert("tracestate", "vendor=value".parse().unwrap());
        assert!(
            !extract_trace_context(&none)
                .span()
                .span_context()
                .is_valid()
        );
    }

    #[test]
    fn extraction_honours_w3c_headers() {
        for (h, sampled) in [
            (format!("00-{T}-{S}-01"), true),
            (format!("00-{T}-{S}-00"), false),
            (format!("00-{T}-{S}-03"), true),
            (format!("cc-{T}-{S}-01-what-the-future-will-be-like"), true),
            (format!("01-{T}-{S}-09"), true),
        ] {
            assert_eq!(
                honoured(&h),
                Some((T.to_owned(), S.to_owned(), sampled)),
                "`{h}`"
            );
        }
    }

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
