//! Naming a request's route: the framework's route template, never the raw path;
//! and the per-layer bound on distinct route names.

use std::borrow::Cow;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use spanprof_core::NameId;

use crate::policy::RoutePolicy;

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
    /// The route template of `request` (borrowed from it where it can be: the layer
    /// looks the name up in its route table and keeps no copy of a name it has seen).
    fn make_route<'a>(&mut self, request: &'a http::Request<B>) -> Option<Cow<'a, str>>;

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
    fn make_route<'a>(&mut self, request: &'a http::Request<B>) -> Option<Cow<'a, str>> {
        self(request).map(Cow::Owned)
    }
}

/// The default: axum's `MatchedPath` when present (feature `axum`), else the gRPC
/// method path for gRPC requests, else [`UNMATCHED_ROUTE`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultRoute;

impl<B> MakeRoute<B> for DefaultRoute {
    fn make_route<'a>(&mut self, request: &'a http::Request<B>) -> Option<Cow<'a, str>> {
        #[cfg(feature = "axum")]
        if let Some(m) = request.extensions().get::<axum::extract::MatchedPath>() {
            return Some(Cow::Borrowed(m.as_str()));
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
    fn make_route<'a>(&mut self, request: &'a http::Request<B>) -> Option<Cow<'a, str>> {
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
        ok.then_some(Cow::Borrowed(path))
    }

    fn names_http_routes(&self) -> bool {
        false
    }
}

#[inline]
pub(crate) fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The HTTP methods span names carry: the nine standard ones as they are, any other
/// `_OTHER` (as OpenTelemetry's HTTP conventions say), so made-up methods make no
/// new names.
const METHOD_NAMES: [&str; 10] = [
    "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "CONNECT", "PATCH", "TRACE", "_OTHER",
];
/// The bit of a [`method_tag`] set for gRPC requests.
pub(crate) const GRPC_TAG: u8 = 0x10;
/// Distinct tags: ten method names, each with and without [`GRPC_TAG`].
const TAGS: usize = 2 * METHOD_NAMES.len();

/// A request's method as an index into [`METHOD_NAMES`], with [`GRPC_TAG`] for gRPC:
/// with the route, the key of the layer's route table.
#[inline]
pub(crate) fn method_tag(method: &http::Method, grpc: bool) -> u8 {
    use http::Method;
    // In METHOD_NAMES' order.
    let i = match *method {
        Method::GET => 0,
        Method::POST => 1,
        Method::PUT => 2,
        Method::DELETE => 3,
        Method::HEAD => 4,
        Method::OPTIONS => 5,
        Method::CONNECT => 6,
        Method::PATCH => 7,
        Method::TRACE => 8,
        _ => 9,
    };
    if grpc { i | GRPC_TAG } else { i }
}

#[inline]
fn tag_index(tag: u8) -> usize {
    usize::from(tag & !GRPC_TAG)
        + if tag & GRPC_TAG != 0 {
            METHOD_NAMES.len()
        } else {
            0
        }
}

/// The largest [`crate::ProfileCorrelationLayerBuilder::max_routes`]: the layer's
/// route table reserves 16 bytes per slot, at least two slots per route of its bound
/// rounded up to a power of two (2 MiB at this one, 16 KiB at the default), and past
/// spanprof's interner bound ([`spanprof_core::DEFAULT_MAX_NAMES`], 4 096) new names
/// read `(other)` anyway.
pub const MAX_MAX_ROUTES: usize = 65_536;

/// What a layer decided, once, for one name (a method and a route): the route and
/// span name as interned ids and the route's policy (`None`: the route is disabled).
#[derive(Debug)]
pub(crate) struct RouteEntry {
    tag: u8,
    key: Box<str>,
    pub(crate) route: NameId,
    pub(crate) span_name: NameId,
    pub(crate) policy: Option<RoutePolicy>,
}

/// One layer's routes: each name it has seen, with what it decided for it, found again
/// without a lock, a write to shared memory or an allocation (the path of every
/// request); and the bound on the distinct names it hands out (each a route and a span
/// name in the process-wide interner, which never forgets one). Past the bound, new
/// routes read [`UNKNOWN_ROUTE`], counted, with one warning.
///
/// An open-addressing table of write-once slots, at most half full: readers probe
/// from the name's hash until they find it or an empty slot; a miss takes the insert
/// lock, probes again and fills the empty slot it ends on. Entries are never removed,
/// so a slot once read full stays so.
#[derive(Debug)]
pub(crate) struct RouteTable {
    slots: Box<[OnceLock<Box<RouteEntry>>]>,
    /// The entries of requests past the bound, one per method tag.
    unknown_entries: [OnceLock<Box<RouteEntry>>; TAGS],
    hasher: foldhash::fast::RandomState,
    /// Names admitted; held while inserting.
    admitted: Mutex<usize>,
    /// Set once `max` names are admitted (after they are all in `slots`).
    full: AtomicBool,
    max: usize,
    unknown: AtomicU64,
    warned: AtomicBool,
}

impl RouteTable {
    /// A table for at most `max` names (1 to [`MAX_MAX_ROUTES`]).
    pub(crate) fn new(max: usize) -> Self {
        let max = max.clamp(1, MAX_MAX_ROUTES);
        RouteTable {
            slots: (0..(2 * max).next_power_of_two())
                .map(|_| OnceLock::new())
                .collect(),
            unknown_entries: std::array::from_fn(|_| OnceLock::new()),
            hasher: foldhash::fast::RandomState::default(),
            admitted: Mutex::new(0),
            full: AtomicBool::new(false),
            max,
            unknown: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        }
    }

    /// The entry of requests with method tag `tag` ([`method_tag`]) and route `route`:
    /// their own, or the [`UNKNOWN_ROUTE`] one when the name would be new past the
    /// bound. A new entry's policy comes from `decide(method, route)`.
    #[inline]
    pub(crate) fn entry(
        &self,
        tag: u8,
        route: &str,
        decide: impl FnOnce(&str, &str) -> Option<RoutePolicy>,
    ) -> &RouteEntry {
        let hash = self.hash(tag, route);
        if let (Some(entry), _) = self.probe(hash, tag, route) {
            return entry;
        }
        self.after_miss(hash, tag, route, decide)
    }

    #[inline]
    fn hash(&self, tag: u8, route: &str) -> usize {
        self.hasher.hash_one((tag, route)) as usize
    }

    /// The rest of [`RouteTable::entry`] once a probe has missed.
    fn after_miss(
        &self,
        hash: usize,
        tag: u8,
        route: &str,
        decide: impl FnOnce(&str, &str) -> Option<RoutePolicy>,
    ) -> &RouteEntry {
        if self.full.load(Ordering::Acquire) {
            // Every admitted name is in `slots` by now (the Acquire pairs with the
            // Release that set `full` after the last one), but the name may have been
            // admitted between the probe that missed and this load: probe again.
            if let (Some(entry), _) = self.probe(hash, tag, route) {
                return entry;
            }
            return self.unknown_entry(tag, decide);
        }
        let mut admitted = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
        let (found, empty) = self.probe(hash, tag, route);
        if let Some(entry) = found {
            return entry;
        }
        if *admitted >= self.max {
            drop(admitted);
            return self.unknown_entry(tag, decide);
        }
        let entry = Self::decide_entry(tag, route, decide);
        // The lock is held and `empty` was empty under it: this fills it.
        let slot = &self.slots[empty];
        let _ = slot.set(Box::new(entry));
        *admitted += 1;
        if *admitted == self.max {
            self.full.store(true, Ordering::Release);
        }
        slot.get().expect("filled above")
    }

    /// The entry of `(tag, route)` if present, and the empty slot its probe ended on.
    /// The table is at most half full, so a probe always ends.
    #[inline]
    fn probe(&self, hash: usize, tag: u8, route: &str) -> (Option<&RouteEntry>, usize) {
        let mask = self.slots.len() - 1;
        let mut i = hash & mask;
        while let Some(e) = self.slots[i].get() {
            if e.tag == tag && *e.key == *route {
                return (Some(e), i);
            }
            i = (i + 1) & mask;
        }
        (None, i)
    }

    fn decide_entry(
        tag: u8,
        route: &str,
        decide: impl FnOnce(&str, &str) -> Option<RoutePolicy>,
    ) -> RouteEntry {
        let method = METHOD_NAMES[usize::from(tag & !GRPC_TAG)];
        let span_name = if tag & GRPC_TAG != 0 {
            NameId::intern(route)
        } else {
            NameId::intern(&format!("{method} {route}"))
        };
        RouteEntry {
            tag,
            key: route.into(),
            route: NameId::intern(route),
            span_name,
            policy: decide(method, route),
        }
    }

    fn unknown_entry(
        &self,
        tag: u8,
        decide: impl FnOnce(&str, &str) -> Option<RoutePolicy>,
    ) -> &RouteEntry {
        self.unknown.fetch_add(1, Ordering::Relaxed);
        if !self.warned.load(Ordering::Relaxed) && !self.warned.swap(true, Ordering::Relaxed) {
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
        self.unknown_entries[tag_index(tag)]
            .get_or_init(|| Box::new(Self::decide_entry(tag, UNKNOWN_ROUTE, decide)))
    }

    /// Requests labelled [`UNKNOWN_ROUTE`] because the bound was reached.
    pub(crate) fn unknown(&self) -> u64 {
        self.unknown.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(
        table: &RouteTable,
        method: &http::Method,
        route: &str,
        grpc: bool,
    ) -> (String, String) {
        let e = table.entry(method_tag(method, grpc), route, |_, _| {
            Some(RoutePolicy::new())
        });
        (
            e.route.resolve().to_string(),
            e.span_name.resolve().to_string(),
        )
    }

    #[test]
    fn past_the_bound_new_routes_are_unknown_and_counted() {
        let table = RouteTable::new(2);
        let post = http::Method::POST;
        let get = http::Method::GET;
        assert_eq!(names(&table, &get, "/a", false).1, "GET /a");
        assert_eq!(names(&table, &post, "/p.S/M", true).1, "/p.S/M");
        assert_eq!(
            names(&table, &get, "/b", false),
            (UNKNOWN_ROUTE.to_owned(), "GET /{unknown}".to_owned())
        );
        assert_eq!(names(&table, &post, "/p.S/N", true).0, UNKNOWN_ROUTE);
        // Names seen before the bound keep theirs.
        assert_eq!(names(&table, &get, "/a", false).0, "/a");
        assert_eq!(table.unknown(), 2);
    }

    #[test]
    fn a_name_is_decided_once() {
        let table = RouteTable::new(8);
        let decided = std::cell::Cell::new(0);
        let decide = |_: &str, _: &str| {
            decided.set(decided.get() + 1);
            None
        };
        for _ in 0..3 {
            let e = table.entry(method_tag(&http::Method::GET, false), "/x", decide);
            assert!(e.policy.is_none());
        }
        // The same route with another method is another name.
        table.entry(method_tag(&http::Method::PUT, false), "/x", decide);
        assert_eq!(decided.get(), 2);
    }

    #[test]
    fn a_name_admitted_between_a_probe_and_the_full_check_is_found() {
        // Reader B probes for the last name and misses; writer A admits it, which fills
        // the table; then B goes on. B must find A's entry, not read the name as new
        // past the bound.
        let table = RouteTable::new(1);
        let tag = method_tag(&http::Method::GET, false);
        let hash = table.hash(tag, "/a");
        assert!(table.probe(hash, tag, "/a").0.is_none()); // B misses
        let admitted = table.entry(tag, "/a", |_, _| Some(RoutePolicy::new())); // A
        let b = table.after_miss(hash, tag, "/a", |_, _| Some(RoutePolicy::new()));
        assert!(std::ptr::eq(admitted, b));
        assert_eq!(table.unknown(), 0);
    }

    #[test]
    fn made_up_http_methods_read_other() {
        let table = RouteTable::new(8);
        assert_eq!(
            names(&table, &http::Method::PATCH, "/x", false).1,
            "PATCH /x"
        );
        let made_up = http::Method::from_bytes(b"X-SCAN-4111").unwrap();
        assert_eq!(names(&table, &made_up, "/x", false).1, "_OTHER /x");
    }
}
