//! Naming a request's route: the framework's route template, never the raw path;
//! and the per-layer bound on distinct route names.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The route label of requests no route template matched.
pub const UNMATCHED_ROUTE: &str = "(unmatched)";

/// The route label of requests whose route was new after their layer had already
/// named [`DEFAULT_MAX_ROUTES`] (or its configured bound) distinct routes.
pub const UNKNOWN_ROUTE: &str = "/{unknown}";

/// Default bound on the distinct span names (`METHOD route`, or the gRPC method
/// path) one layer hands out; see
/// [`crate::ProfileCorrelationLayerBuilder::max_routes`].
pub const DEFAULT_MAX_ROUTES: usize = 512;

/// Names the route of a request: a template such as `/cart/{id}` or the gRPC method
/// path `/package.Service/Method`. Returning `None` labels the request
/// [`UNMATCHED_ROUTE`]. Never return a raw path with ids or a query string: routes
/// become labels, and labels must stay few and free of secrets.
///
/// Closures `FnMut(&http::Request<B>) -> Option<String>` implement it.
pub trait MakeRoute<B> {
    /// The route template of `request`.
    fn make_route(&mut self, request: &http::Request<B>) -> Option<Cow<'static, str>>;

    /// Whether this can name HTTP routes at all. Only [`DefaultRoute`] built without
    /// spanprof's `axum` feature cannot (and [`GrpcRoute`], which names gRPC methods
    /// only); the layer then reports per-route settings that could never apply.
    fn names_http_routes(&self) -> bool {
        true
    }
}

impl<B, F> MakeRoute<B> for F
where
    F: FnMut(&http::Request<B>) -> Option<String>,
{
    fn make_route(&mut self, request: &http::Request<B>) -> Option<Cow<'static, str>> {
        self(request).map(Cow::Owned)
    }
}

/// The default: axum's `MatchedPath` when present (feature `axum`), else the gRPC
/// method path for gRPC requests, else [`UNMATCHED_ROUTE`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultRoute;

impl<B> MakeRoute<B> for DefaultRoute {
    fn make_route(&mut self, request: &http::Request<B>) -> Option<Cow<'static, str>> {
        #[cfg(feature = "axum")]
        if let Some(m) = request.extensions().get::<axum::extract::MatchedPath>() {
            return Some(Cow::Owned(m.as_str().to_owned()));
        }
        GrpcRoute.make_route(request)
    }

    fn names_http_routes(&self) -> bool {
        cfg!(feature = "axum")
    }
}

/// gRPC: the route is the method path `/package.Service/Method`; anything else is
/// unmatched.
///
/// The path comes from the client, and tonic answers methods it does not serve
/// (`Unimplemented`) itself, after the layer named the request. So a client calling
/// made-up methods would make new names; the layer's bound on distinct routes
/// ([`crate::ProfileCorrelationLayerBuilder::max_routes`], [`DEFAULT_MAX_ROUTES`])
/// keeps them few: the first distinct names keep their own name for good (a server's
/// real methods, called from its first minutes on, are among them), later new ones
/// read [`UNKNOWN_ROUTE`], with one warning.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcRoute;

impl<B> MakeRoute<B> for GrpcRoute {
    fn make_route(&mut self, request: &http::Request<B>) -> Option<Cow<'static, str>> {
        is_grpc(request.headers()).then_some(())?;
        let path = request.uri().path();
        let mut parts = path.strip_prefix('/')?.split('/');
        let (service, method) = (parts.next()?, parts.next()?);
        let ok = parts.next().is_none()
            && service.contains('.')
            && !method.is_empty()
            && path.len() <= 128
            && path
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/._".contains(&b));
        ok.then(|| Cow::Owned(path.to_owned()))
    }

    fn names_http_routes(&self) -> bool {
        false
    }
}

pub(crate) fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The HTTP method as span names carry it: the nine standard methods as they are,
/// any other `_OTHER` (as OpenTelemetry's HTTP conventions say), so made-up methods
/// make no new names.
pub(crate) fn method_name(method: &http::Method) -> &str {
    use http::Method;
    const KNOWN: [Method; 9] = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::HEAD,
        Method::OPTIONS,
        Method::CONNECT,
        Method::PATCH,
        Method::TRACE,
    ];
    if KNOWN.contains(method) {
        method.as_str()
    } else {
        "_OTHER"
    }
}

/// One layer's bound on the distinct span names it hands out (each a route and a
/// span name in the process-wide interner, which never forgets one). Past the bound,
/// new routes read [`UNKNOWN_ROUTE`], counted, with one warning.
#[derive(Debug)]
pub(crate) struct RouteNames {
    seen: RwLock<HashSet<String, foldhash::fast::RandomState>>,
    max: usize,
    unknown: AtomicU64,
    warned: AtomicBool,
}

impl RouteNames {
    pub(crate) fn new(max: usize) -> Self {
        RouteNames {
            seen: RwLock::new(HashSet::default()),
            max,
            unknown: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        }
    }

    /// The route and span name of a request whose route is `route`: its own, or
    /// [`UNKNOWN_ROUTE`] when the name would be new past the bound.
    pub(crate) fn admit(
        &self,
        method: &str,
        route: Cow<'static, str>,
        grpc: bool,
    ) -> (Cow<'static, str>, String) {
        let span_name = |route: &str| {
            if grpc {
                route.to_owned()
            } else {
                format!("{method} {route}")
            }
        };
        let name = span_name(&route);
        if self
            .seen
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&name)
        {
            return (route, name);
        }
        let mut seen = self.seen.write().unwrap_or_else(|e| e.into_inner());
        if seen.len() < self.max || seen.contains(&name) {
            seen.insert(name.clone());
            return (route, name);
        }
        drop(seen);
        self.unknown.fetch_add(1, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max_routes = self.max,
                "spanprof: this layer has named {} distinct routes; requests of new routes are labelled {UNKNOWN_ROUTE} from now on. \
                 Routes must be templates, not raw paths: for gRPC, clients are calling methods this server does not serve \
                 (tonic answers them Unimplemented); for HTTP, name routes with a template (axum's MatchedPath, or a \
                 make_route closure returning templates); a server with more routes needs a larger \
                 ProfileCorrelationLayerBuilder::max_routes",
                self.max
            );
        }
        (Cow::Borrowed(UNKNOWN_ROUTE), span_name(UNKNOWN_ROUTE))
    }

    /// Requests labelled [`UNKNOWN_ROUTE`] because the bound was reached.
    pub(crate) fn unknown(&self) -> u64 {
        self.unknown.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bound_new_routes_are_unknown_and_counted() {
        let names = RouteNames::new(2);
        let admit = |m, r: &'static str, grpc| names.admit(m, Cow::Borrowed(r), grpc);
        assert_eq!(admit("GET", "/a", false).1, "GET /a");
        assert_eq!(admit("/p.S/M", "/p.S/M", true).1, "/p.S/M");
        assert_eq!(
            admit("GET", "/b", false),
            (Cow::Borrowed(UNKNOWN_ROUTE), "GET /{unknown}".to_owned())
        );
        assert_eq!(admit("/p.S/N", "/p.S/N", true).0, UNKNOWN_ROUTE);
        // Names seen before the bound keep theirs.
        assert_eq!(admit("GET", "/a", false).0, "/a");
        assert_eq!(names.unknown(), 2);
    }

    #[test]
    fn made_up_http_methods_read_other() {
        assert_eq!(method_name(&http::Method::PATCH), "PATCH");
        let made_up = http::Method::from_bytes(b"X-SCAN-4111").unwrap();
        assert_eq!(method_name(&made_up), "_OTHER");
    }
}
