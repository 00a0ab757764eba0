//! Set-up mistakes the layer can see at a request, each reported once per process at
//! warn level with the fix in the message: no `tracing` span around the request (its
//! level is filtered out, or the layer order is reversed), a span without an
//! OpenTelemetry context (no `tracing-opentelemetry` layer), per-route settings the
//! layer cannot apply (no route matching), and route keys no request has matched.
//! The core's checks (frame pointers, `tokio_unstable`, runtime hooks) are in
//! `spanprof_core::setup`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use tracing::level_filters::LevelFilter;

/// How the layer found the request's trace identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TraceSource {
    /// The current `tracing` span's OpenTelemetry context: the full workflow.
    OtelSpan,
    /// A current span without a valid OpenTelemetry context.
    SpanWithoutOtel,
    /// No current span (then a `traceparent` header, or nothing).
    NoSpan,
}

static WARNED_NO_SPAN: AtomicBool = AtomicBool::new(false);
static WARNED_NO_OTEL: AtomicBool = AtomicBool::new(false);
static WARNED_NO_ROUTES: AtomicBool = AtomicBool::new(false);

fn first_time(flag: &AtomicBool) -> bool {
    // A load first, so the common case (already warned) writes nothing.
    !flag.load(Ordering::Relaxed) && !flag.swap(true, Ordering::Relaxed)
}

/// The warning for requests that arrive with no current `tracing` span, given the
/// most verbose level the subscriber enables.
pub(crate) fn no_span_message(max_level: LevelFilter) -> String {
    let head = "spanprof: requests reach ProfileCorrelationLayer with no tracing span current, so their samples \
carry no trace id and no span gets pyroscope.profile.id.";
    if max_level < LevelFilter::DEBUG {
        format!(
            "{head} Your subscriber enables nothing more verbose than {max_level}, and tower-http's TraceLayer makes \
its request spans at DEBUG, so they are never created: make them at INFO with \
TraceLayer::new_for_http().make_span_with(tower_http::trace::DefaultMakeSpan::new().level(tracing::Level::INFO)) \
(new_for_grpc() likewise), or enable tower_http=debug in your filter."
        )
    } else {
        format!(
            "{head} The layer that makes the request span (tower-http's TraceLayer) must run outside \
ProfileCorrelationLayer. axum's Router::layer: add ProfileCorrelationLayer first, then TraceLayer (the last layer \
added is the outermost). tower::ServiceBuilder and tonic's Server::builder(): add TraceLayer first, then \
ProfileCorrelationLayer (the first layer added is the outermost)."
        )
    }
}

/// The warning for a current span that has no OpenTelemetry context.
pub(crate) const NO_OTEL_MESSAGE: &str = "spanprof: the current tracing span of requests has no OpenTelemetry \
context, so samples carry no trace or span id of an exported span and no span gets pyroscope.profile.id: add \
tracing_opentelemetry::layer().with_tracer(tracer) to your tracing subscriber (and spanprof::SpanProfileProcessor \
to the tracer provider).";

/// The warning for per-route settings on a layer that cannot see HTTP routes.
pub(crate) fn no_routes_message(keys: &[String]) -> String {
    format!(
        "spanprof: ProfileCorrelationLayer has settings for routes ({}) but cannot see HTTP routes, so every \
request is labelled (unmatched) and gets the default policy: enable the `axum` feature of spanprof \
(spanprof = {{ version = \"…\", features = [\"axum\"] }}) for axum routers, or name routes with \
.make_route(|req| …) for other servers.",
        keys.join(", ")
    )
}

/// Checked at every request (one relaxed load once warned).
#[inline]
pub(crate) fn check_trace_source(source: TraceSource) {
    match source {
        TraceSource::OtelSpan => {}
        TraceSource::NoSpan => {
            let max = LevelFilter::current();
            if max != LevelFilter::OFF && first_time(&WARNED_NO_SPAN) {
                tracing::warn!("{}", no_span_message(max));
            }
        }
        TraceSource::SpanWithoutOtel => {
            if first_time(&WARNED_NO_OTEL) {
                tracing::warn!("{NO_OTEL_MESSAGE}");
            }
        }
    }
}

/// Checked at requests that no route names, on layers that cannot name HTTP routes.
pub(crate) fn check_route_keys_visible(keys: &[String]) {
    if !keys.is_empty() && first_time(&WARNED_NO_ROUTES) {
        tracing::warn!("{}", no_routes_message(keys));
    }
}

/// After this many requests a layer reports the route keys none of them matched.
pub(crate) const REPORT_UNMATCHED_AFTER: u64 = 1000;

/// Which configured route keys (per-route policies and disabled routes) requests have
/// matched: a key that never matches is a typo or a raw path, and its setting never
/// applies. Tracking costs one comparison per unmatched key per request and stops
/// once all have matched.
#[derive(Debug)]
pub(crate) struct RouteKeys {
    keys: Vec<String>,
    matched: Vec<AtomicBool>,
    remaining: AtomicUsize,
    requests: AtomicU64,
}

impl RouteKeys {
    pub(crate) fn new(mut keys: Vec<String>) -> Self {
        keys.sort();
        keys.dedup();
        RouteKeys {
            matched: keys.iter().map(|_| AtomicBool::new(false)).collect(),
            remaining: AtomicUsize::new(keys.len()),
            keys,
            requests: AtomicU64::new(0),
        }
    }

    /// The configured keys.
    pub(crate) fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The first request of `route` (with its `method`): marks the keys it matches.
    pub(crate) fn observe(&self, method: &str, route: &str) {
        if self.remaining.load(Ordering::Relaxed) == 0 {
            return;
        }
        for (key, matched) in self.keys.iter().zip(&self.matched) {
            if !matched.load(Ordering::Relaxed)
                && (key == route || key.split_once(' ') == Some((method, route)))
                && !matched.swap(true, Ordering::Relaxed)
            {
                self.remaining.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// One request: the first [`REPORT_UNMATCHED_AFTER`] are counted (while some key
    /// is unmatched), and after them the keys still unmatched are reported, once.
    #[inline]
    pub(crate) fn count_request(&self) {
        if self.remaining.load(Ordering::Relaxed) == 0
            || self.requests.load(Ordering::Relaxed) >= REPORT_UNMATCHED_AFTER
        {
            return;
        }
        if self.requests.fetch_add(1, Ordering::Relaxed) + 1 == REPORT_UNMATCHED_AFTER {
            let unmatched = self.unmatched();
            if !unmatched.is_empty() {
                tracing::warn!(
                    "spanprof: route keys configured on ProfileCorrelationLayer matched none of its first \
                     {REPORT_UNMATCHED_AFTER} requests: {}. A key must be a route template exactly as the router has it \
                     (axum: \"/cart/{{id}}\"; gRPC: \"/package.Service/Method\"), optionally after an upper-case \
                     method (\"POST /checkout\"); requests of a route whose key does not match get the default policy.",
                    unmatched.join(", ")
                );
            }
        }
    }

    /// Keys no request has matched so far.
    pub(crate) fn unmatched(&self) -> Vec<String> {
        self.keys
            .iter()
            .zip(&self.matched)
            .filter(|(_, m)| !m.load(Ordering::Relaxed))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn route_keys_track_what_matched() {
        let keys = RouteKeys::new(vec![
            "POST /checkout".into(),
            "/health".into(),
            "/cart/{cart_id}".into(),
        ]);
        keys.observe("GET", "/cart/{id}");
        keys.observe("GET", "/checkout");
        assert_eq!(
            keys.unmatched(),
            ["/cart/{cart_id}", "/health", "POST /checkout"]
        );
        keys.observe("POST", "/checkout");
        keys.observe("GET", "/health");
        assert_eq!(keys.unmatched(), ["/cart/{cart_id}"]);
    }

    use super::*;

    #[test]
    fn the_no_span_message_names_the_fix_for_the_filter_or_the_order() {
        let filtered = no_span_message(LevelFilter::INFO);
        assert!(
            filtered.contains("DEBUG") && filtered.contains("Level::INFO"),
            "{filtered}"
        );
        let order = no_span_message(LevelFilter::TRACE);
        assert!(
            order.contains("outermost") && !order.contains("Level::INFO"),
            "{order}"
        );
    }
}
