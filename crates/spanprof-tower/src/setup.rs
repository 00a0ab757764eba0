//! Set-up mistakes the layer can see at a request, each reported once per process at
//! warn level with the fix in the message: no `tracing` span around the requests (its
//! level is filtered out, or the layer order is reversed), a span without an
//! OpenTelemetry context (no `tracing-opentelemetry` layer), per-route settings the
//! layer cannot apply (no route matching), route keys no request has matched, and
//! two layers that set different profile scopes (seen as the second is built).
//! The core's checks (frame pointers, `tokio_unstable`, runtime hooks) are in
//! `spanprof_core::setup`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use spanprof_core::{NameId, ProfileScope};
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
static WARNED_SCOPES: AtomicBool = AtomicBool::new(false);

fn first_time(flag: &AtomicBool) -> bool {
    // A load first, so the common case (already warned) writes nothing.
    !flag.load(Ordering::Relaxed) && !flag.swap(true, Ordering::Relaxed)
}

/// Sets the process's profile scope for a layer built with one (the builder's
/// `scope` or the policy file's); warns, once, if an earlier layer set another.
pub(crate) fn set_scope(scope: ProfileScope) {
    if let Some(before) = spanprof_core::scope::set_scope(scope)
        && before != scope
        && first_time(&WARNED_SCOPES)
    {
        tracing::warn!(
            "spanprof: two layers set different profile scopes, {before:?} then {scope:?}; \
             the scope is process-wide (spans' profile ids and every sink's span_id labels), \
             so {scope:?} now applies to both: give every layer the same scope, or set it on one"
        );
    }
}

/// The warning for requests of `routes` that arrive with no current `tracing` span,
/// given the most verbose level the subscriber enables.
pub(crate) fn no_span_message(max_level: LevelFilter, routes: &[String]) -> String {
    let head = format!(
        "spanprof: requests ({}) reach ProfileCorrelationLayer with no tracing span current, and no request \
of this layer has had one, so their samples carry no trace id and no span gets pyroscope.profile.id.",
        routes.join(", ")
    );
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

/// After this many requests of a single route with no span current (and none of
/// the layer's with one), the layer reports them: one route alone may be a health
/// check left without a span on purpose, so it takes more evidence than two routes.
pub(crate) const REPORT_ONE_ROUTE_WITHOUT_SPAN_AFTER: u64 = 100;

/// What one layer has seen of the `tracing` span around its requests. Requests with
/// no span current are a set-up mistake (the span's level filtered out, or the layers
/// in the wrong order) only while no request of the layer has had a span: once one
/// has, the set-up works, and routes without a span (a health check whose
/// `make_span` returns `Span::none()`) are so on purpose. Disabled routes are never
/// looked at. The mistake is reported once the evidence is clear: requests of two
/// routes without a span, one from a traced caller (with a `traceparent`), or
/// [`REPORT_ONE_ROUTE_WITHOUT_SPAN_AFTER`] requests of one route.
#[derive(Debug, Default)]
pub(crate) struct SpanEvidence {
    /// A request of this layer has had a span current, or the evidence was clear and
    /// reported: nothing left to check.
    span_seen: AtomicBool,
    without_span: Mutex<WithoutSpan>,
}

#[derive(Debug, Default)]
struct WithoutSpan {
    /// The first two routes (span names) seen without a span.
    routes: Vec<NameId>,
    requests: u64,
}

impl SpanEvidence {
    /// One request of route `span_name` with `headers`, whose trace identity came
    /// from `source`. One relaxed load once a request has had a span, or once the
    /// warning is logged.
    #[inline]
    pub(crate) fn observe(
        &self,
        source: TraceSource,
        span_name: NameId,
        headers: &http::HeaderMap,
    ) {
        match source {
            TraceSource::OtelSpan => self.note_span(),
            TraceSource::SpanWithoutOtel => {
                self.note_span();
                if first_time(&WARNED_NO_OTEL) {
                    tracing::warn!("{NO_OTEL_MESSAGE}");
                }
            }
            TraceSource::NoSpan => {
                if !self.span_seen.load(Ordering::Relaxed)
                    && !WARNED_NO_SPAN.load(Ordering::Relaxed)
                {
                    self.without_span(span_name, headers.contains_key("traceparent"));
                }
            }
        }
    }

    #[inline]
    fn note_span(&self) {
        if !self.span_seen.load(Ordering::Relaxed) {
            self.span_seen.store(true, Ordering::Relaxed);
        }
    }

    #[cold]
    fn without_span(&self, span_name: NameId, traced_caller: bool) {
        let max = LevelFilter::current();
        let routes = {
            let mut w = self.without_span.lock().unwrap_or_else(|e| e.into_inner());
            if w.routes.len() < 2 && !w.routes.contains(&span_name) {
                w.routes.push(span_name);
            }
            w.requests = w.requests.saturating_add(1);
            let clear = w.routes.len() >= 2
                || traced_caller
                || w.requests >= REPORT_ONE_ROUTE_WITHOUT_SPAN_AFTER;
            // Nobody listening yet (the subscriber may come later): keep the
            // evidence, and report it at a request once someone listens.
            if !clear || max == LevelFilter::OFF || self.span_seen.swap(true, Ordering::Relaxed) {
                return;
            }
            std::mem::take(&mut w.routes)
        };
        if first_time(&WARNED_NO_SPAN) {
            let routes: Vec<String> = routes.iter().map(|r| r.resolve().to_string()).collect();
            tracing::warn!("{}", no_span_message(max, &routes));
        }
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

/// Checked at requests that no route names, on layers that cannot name HTTP routes.
pub(crate) fn check_route_keys_visible(keys: &[String]) {
    if !keys.is_empty() && first_time(&WARNED_NO_ROUTES) {
        tracing::warn!("{}", no_routes_message(keys));
    }
}

/// Which configured route keys (per-route policies and disabled routes) requests have
/// matched, and the keys evidently not written as the router's template. A key whose
/// route has had no request is no mistake (GET-only traffic never names
/// `POST /checkout`): it is reported only when a request arrives under a route it was
/// evidently meant for — the same template with other parameter names
/// (`/cart/{cart_id}` where the router says `/cart/{id}`, or axum 0.7's `/cart/:id`),
/// or a raw path of it (`/cart/42`) — once per key, at that route's first request.
/// Costs nothing per request: it runs once per new route of the layer.
#[derive(Debug)]
pub(crate) struct RouteKeys {
    keys: Vec<String>,
    matched: Vec<AtomicBool>,
    reported: Vec<AtomicBool>,
    remaining: AtomicUsize,
}

impl RouteKeys {
    pub(crate) fn new(mut keys: Vec<String>) -> Self {
        keys.sort();
        keys.dedup();
        RouteKeys {
            matched: keys.iter().map(|_| AtomicBool::new(false)).collect(),
            reported: keys.iter().map(|_| AtomicBool::new(false)).collect(),
            remaining: AtomicUsize::new(keys.len()),
            keys,
        }
    }

    /// The configured keys.
    pub(crate) fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The first request of `route` (with its `method`): marks the keys it matches,
    /// and reports the unmatched keys that were evidently meant for it.
    #[inline]
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
        for ((key, matched), reported) in self.keys.iter().zip(&self.matched).zip(&self.reported) {
            if matched.load(Ordering::Relaxed) || reported.load(Ordering::Relaxed) {
                continue;
            }
            let (key_method, key_route) = match key.split_once(' ') {
                Some((m, r)) => (Some(m), r),
                None => (None, key.as_str()),
            };
            if let Some(why) = misnamed(key_route, route)
                && !reported.swap(true, Ordering::Relaxed)
            {
                let fixed = match key_method {
                    Some(m) => format!("{m} {route}"),
                    None => route.to_owned(),
                };
                tracing::warn!(
                    "spanprof: the route key \"{key}\" of ProfileCorrelationLayer never matches: requests of that \
                     route arrive as \"{route}\" ({why}), so its setting does not apply to them. A key must be the \
                     router's template exactly, optionally after an upper-case method: use \"{fixed}\"."
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

/// Why the route of a key is evidently the router's `route` written another way, if
/// it is: the same segments but for parameter names (or axum 0.7's `:name`, which
/// axum 0.8 refuses in a route), or a raw path whose id segments stand where
/// `route` has parameters.
fn misnamed(key: &str, route: &str) -> Option<&'static str> {
    if key == route || key.split('/').count() != route.split('/').count() {
        return None;
    }
    let mut why = None;
    for (k, r) in key.split('/').zip(route.split('/')) {
        if k == r {
            continue;
        }
        match (parameter(k), parameter(r)) {
            (Some(kw), Some(rw)) if kw == rw => {
                why = why.or(Some("the router names its parameters otherwise"));
            }
            (None, Some(Parameter::One)) if looks_like_an_id(k) => {
                why = Some("a key is a route template, not a path");
            }
            _ => return None,
        }
    }
    why
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parameter {
    /// `{name}` (or `:name`): one segment.
    One,
    /// `{*name}` (or `*name`): the rest of the path.
    Rest,
}

fn parameter(segment: &str) -> Option<Parameter> {
    if let Some(inner) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
        return Some(if inner.starts_with('*') {
            Parameter::Rest
        } else {
            Parameter::One
        });
    }
    match segment.as_bytes().first() {
        Some(b':') if segment.len() > 1 => Some(Parameter::One),
        Some(b'*') if segment.len() > 1 => Some(Parameter::Rest),
        _ => None,
    }
}

/// A path segment that is an id rather than a word: digits, or a long run of hex
/// digits and dashes (a UUID).
fn looks_like_an_id(segment: &str) -> bool {
    !segment.is_empty()
        && (segment.bytes().all(|b| b.is_ascii_digit())
            || (segment.len() >= 8 && segment.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_key_is_misnamed_only_when_the_router_evidently_has_its_route_under_another_name() {
        use super::misnamed;
        assert!(misnamed("/cart/{cart_id}", "/cart/{id}").is_some());
        assert!(misnamed("/cart/:id", "/cart/{id}").is_some());
        assert!(misnamed("/files/{*p}", "/files/{*path}").is_some());
        assert!(misnamed("/cart/42", "/cart/{id}").is_some());
        assert!(misnamed("/cart/0b9f6c1e-2d7a-4c1e", "/cart/{id}").is_some());
        // Other routes the router may well have.
        assert!(misnamed("/cart/{id}", "/cart/{id}").is_none());
        assert!(misnamed("/checkout", "/cart/{id}").is_none());
        assert!(misnamed("/cart/{id}/items", "/cart/{id}").is_none());
        assert!(misnamed("/cart/summary", "/cart/{id}").is_none());
        assert!(misnamed("/card/{id}", "/cart/{id}").is_none());
        assert!(misnamed("/files/{id}", "/files/{*path}").is_none());
    }

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
        let routes = ["GET /hash".to_owned(), "GET /cart/{id}".to_owned()];
        let filtered = no_span_message(LevelFilter::INFO, &routes);
        assert!(
            filtered.contains("DEBUG")
                && filtered.contains("Level::INFO")
                && filtered.contains("(GET /hash, GET /cart/{id})"),
            "{filtered}"
        );
        let order = no_span_message(LevelFilter::TRACE, &routes);
        assert!(
            order.contains("outermost") && !order.contains("Level::INFO"),
            "{order}"
        );
    }
}
