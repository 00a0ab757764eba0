//! A route's latency page: its latency histogram, and what its slow requests spend
//! their CPU on that its fast ones do not (a differential flamegraph and a ranking of
//! functions), from the store's spans classed by their request's latency.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Json, Response};
use serde::Serialize;
use spanprof_core::{LatencyClass, Profile, RouteLatency};

use super::{Viewer, off_runtime, svg_response};
use crate::flame;
use crate::query::{FromQuery, Params, QueryError, Strict};

/// Functions listed in [`LatencyAnswer::slow_vs_rest`].
const RANKED: usize = 15;

/// `route=` (required, exact) and `minutes=` (default 5, 1 to 60).
pub(super) struct RouteQuery {
    route: String,
    minutes: u64,
}

impl FromQuery for RouteQuery {
    const KNOWN: &'static [&'static str] = &["route", "minutes"];

    fn from_query(p: &Params) -> Result<Self, QueryError> {
        let route = p
            .text("route")
            .filter(|r| !r.is_empty())
            .ok_or(QueryError::Missing {
                name: "route",
                expected: "a route, e.g. route=POST /checkout",
            })?;
        Ok(RouteQuery {
            route: route.to_owned(),
            minutes: p
                .parsed::<u64>("minutes", "a whole number")?
                .unwrap_or(5)
                .clamp(1, 60),
        })
    }
}

/// A route's requests split by latency class: the CPU profile of its slow ones
/// (above its 90th percentile) and of the rest, and how many of each.
struct Split {
    /// The route label the query named (directly or by its requests' span name).
    route: String,
    latency: RouteLatency,
    slow: Profile,
    rest: Profile,
    /// Requests with samples, by class.
    requests: HashMap<LatencyClass, u64>,
}

/// The store's spans of `route` sampled in the last `window`, their profiles summed
/// by their request's latency class. `route` is a route label (`/checkout`) or the
/// name of requests' spans (`POST /checkout`, as the trace list shows them).
fn split(v: &Viewer, route: &str, window: Duration) -> Split {
    v.profiler.flush();
    let store = v.profiler.store();
    let since = SystemTime::now() - window;
    let all = store.spans();
    let route: Arc<str> = if spanprof_core::route_latency(route).requests > 0 {
        Arc::from(route)
    } else {
        all.iter()
            .find(|s| &*s.labels.span_name == route && s.labels.span_id == s.labels.root_span_id)
            .map_or_else(|| Arc::from(route), |s| s.labels.route.clone())
    };
    let route = &*route;
    let spans: Vec<_> = all
        .into_iter()
        .filter(|s| &*s.labels.route == route && s.last_sample >= since)
        .collect();
    let roots: Vec<u64> = spans.iter().map(|s| s.labels.root_span_id).collect();
    let classes = spanprof_core::classes_of_roots(&roots);
    let period = store.period_ns();
    let (mut slow, mut rest) = (Profile::empty(period), Profile::empty(period));
    let mut requests: HashMap<LatencyClass, std::collections::HashSet<u64>> = HashMap::new();
    for (s, class) in spans.iter().zip(classes) {
        let Some(class) = class else { continue };
        requests
            .entry(class)
            .or_default()
            .insert(s.labels.root_span_id);
        let side = match class {
            LatencyClass::P90To99 | LatencyClass::P99Plus => &mut slow,
            LatencyClass::P0To50 | LatencyClass::P50To90 => &mut rest,
            // Still running: neither slow nor fast yet.
            LatencyClass::Open => continue,
        };
        if let Some(p) = store.span(s.labels.span_id) {
            side.samples.extend(p.samples);
        }
    }
    Split {
        route: route.to_owned(),
        latency: spanprof_core::route_latency(route),
        slow,
        rest,
        requests: requests
            .into_iter()
            .map(|(c, roots)| (c, roots.len() as u64))
            .collect(),
    }
}

/// One bar of the histogram.
#[derive(Serialize)]
struct Bucket {
    from_ns: u64,
    requests: u64,
}

/// One function's CPU share among slow requests and among the rest.
#[derive(Serialize)]
struct Ranked {
    function: String,
    slow_pct: f64,
    rest_pct: f64,
}

/// What `api/routes/latency` answers.
#[derive(Serialize)]
struct LatencyAnswer {
    route: String,
    /// Requests of the route in the last five minutes.
    requests: u64,
    min_requests: u64,
    /// Why there are no classes, when there are none.
    note: Option<String>,
    histogram: Vec<Bucket>,
    /// Requests with samples in the window, by class.
    sampled_requests: Vec<(&'static str, u64)>,
    slow_cpu_ns: u64,
    rest_cpu_ns: u64,
    /// Functions by how much larger their share of CPU (anywhere on the stack) is
    /// among slow requests than among the rest, largest first; the runtime's, the
    /// server stack's and the standard library's left out.
    slow_vs_rest: Vec<Ranked>,
}

/// The crates of the runtime, the server stack and the standard library: their
/// functions are on every request's stack, or differ with how a request was run
/// (inline or on a blocking pool) rather than with what it did, so the ranking leaves
/// them out (the flamegraph keeps them).
const RUNTIME_CRATES: &[&str] = &[
    "std",
    "core",
    "alloc",
    "tokio",
    "futures",
    "futures_util",
    "futures_core",
    "futures_executor",
    "tower",
    "tower_http",
    "tower_layer",
    "tower_service",
    "hyper",
    "hyper_util",
    "h2",
    "axum",
    "axum_core",
    "tonic",
    "tracing",
    "tracing_core",
    "tracing_subscriber",
    "tracing_opentelemetry",
    "spanprof",
    "spanprof_core",
    "spanprof_tower",
    "pin_project_lite",
];

/// Whether `function` belongs to [`RUNTIME_CRATES`], or is a trait method of a
/// generic parameter (`<F as Future>::poll`).
fn is_runtime(function: &str) -> bool {
    let f = function.trim_start_matches('<');
    let own_type = f.split(" as ").next().unwrap_or_default();
    let root = own_type
        .trim_start_matches('&')
        .trim_start_matches("mut ")
        .trim_start_matches("dyn ")
        .split("::")
        .next()
        .unwrap_or_default();
    RUNTIME_CRATES.contains(&root) || (f.contains(" as ") && !own_type.contains("::"))
}

/// Each function's share of `p`'s CPU, anywhere on the stack, the runtime's left out.
fn shares(p: &Profile) -> HashMap<Arc<str>, f64> {
    let total = p.cpu_ns().max(1) as f64;
    p.top_functions_by_total(usize::MAX)
        .into_iter()
        .filter(|f| !is_runtime(&f.function))
        .map(|f| (f.function, f.total_ns as f64 / total))
        .collect()
}

fn ranking(s: &Split) -> Vec<Ranked> {
    let (slow, rest) = (shares(&s.slow), shares(&s.rest));
    let mut rows: Vec<Ranked> = slow
        .iter()
        .map(|(f, &share)| Ranked {
            function: f.to_string(),
            slow_pct: 100.0 * share,
            rest_pct: 100.0 * rest.get(f).copied().unwrap_or(0.0),
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.slow_pct - b.rest_pct)
            .total_cmp(&(a.slow_pct - a.rest_pct))
            .then_with(|| a.function.cmp(&b.function))
    });
    rows.truncate(RANKED);
    rows
}

fn note(s: &Split) -> Option<String> {
    let n = s.latency.requests;
    if !s.latency.has_classes() {
        return Some(format!(
            "too few requests for latency classes: {n} in the last {} min, {} needed",
            RouteLatency::WINDOW.as_secs() / 60,
            RouteLatency::MIN_REQUESTS
        ));
    }
    if s.slow.samples.is_empty() {
        return Some("no samples of requests above the 90th percentile in the window".into());
    }
    None
}

/// `GET api/routes/latency?route=&minutes=`: the route's histogram, its requests by
/// class and the functions its slow requests spend more of their CPU in.
pub(super) async fn api(State(v): State<Viewer>, Strict(q): Strict<RouteQuery>) -> Response {
    render(&v, move |v| {
        let s = split(v, &q.route, Duration::from_secs(q.minutes * 60));
        let answer = LatencyAnswer {
            route: s.route.clone(),
            requests: s.latency.requests,
            min_requests: RouteLatency::MIN_REQUESTS,
            note: note(&s),
            histogram: s
                .latency
                .buckets
                .iter()
                .map(|&(from_ns, requests)| Bucket { from_ns, requests })
                .collect(),
            sampled_requests: LatencyClass::ALL
                .iter()
                .map(|c| (c.as_str(), s.requests.get(c).copied().unwrap_or(0)))
                .collect(),
            slow_cpu_ns: s.slow.cpu_ns(),
            rest_cpu_ns: s.rest.cpu_ns(),
            slow_vs_rest: ranking(&s),
        };
        Json(answer).into_response()
    })
    .await
}

/// `GET routes/flamegraph?route=&minutes=`: the slow requests' flamegraph, coloured
/// by how their shares differ from the rest's (red: larger among slow requests).
pub(super) async fn flamegraph(State(v): State<Viewer>, Strict(q): Strict<RouteQuery>) -> Response {
    render(&v, move |v| {
        let s = split(v, &q.route, Duration::from_secs(q.minutes * 60));
        if let Some(why) = note(&s) {
            return (StatusCode::NOT_FOUND, why).into_response();
        }
        svg_response(flame::diff_svg(
            &s.rest,
            &s.slow,
            &format!(
                "{}: requests above its 90th percentile against the rest, last {} min (red: larger share among slow requests)",
                s.route, q.minutes
            ),
        ))
    })
    .await
}

/// `GET route?route=`: the page (its script reads the query).
pub(super) async fn page() -> Html<&'static str> {
    Html(include_str!("../../assets/route.html"))
}

/// Runs `f` off the runtime, one of the viewer's concurrent renders.
async fn render(v: &Viewer, f: impl FnOnce(&Viewer) -> Response + Send + 'static) -> Response {
    let Ok(turn) = v.renders.clone().acquire_owned().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "the viewer is stopping").into_response();
    };
    let v = v.clone();
    off_runtime(move || {
        let _turn = turn;
        f(&v)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::is_runtime;

    #[test]
    fn the_ranking_leaves_out_the_runtime_and_keeps_the_services_code() {
        for f in [
            "tokio::loom::std::unsafe_cell::UnsafeCell<T>::with_mut",
            "<core::slice::iter::Iter<T> as core::iter::traits::iterator::Iterator>::find",
            "<F as core::future::future::Future>::poll",
            "axum::serve::handle_connection::{{closure}}",
            "<tracing::instrument::Instrumented<T> as core::future::future::Future>::poll",
        ] {
            assert!(is_runtime(f), "{f}");
        }
        for f in [
            "checkout::shop::CartSerializer::to_json",
            "<checkout::Cart as core::fmt::Display>::fmt",
            "regex_automata::nfa::thompson::compiler::Compiler::c",
            "latency::slow_path",
        ] {
            assert!(!is_runtime(f), "{f}");
        }
    }
}
