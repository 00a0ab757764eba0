//! The viewer's routes under `/debug/spanprof/`: the page, its JSON API, the
//! flamegraphs, and the pprof downloads.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Json, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};
use spanprof_core::Profiler;

use crate::flame;
use crate::spans::RecentSpans;

/// Where the viewer is mounted.
pub const VIEWER_PATH: &str = "/debug/spanprof/";

/// The viewer: a profiler (its store answers the profiles) and recent spans.
#[derive(Clone, Debug)]
pub struct Viewer {
    profiler: Profiler,
    spans: RecentSpans,
}

impl Viewer {
    /// A viewer over `profiler`'s store and `spans`.
    pub fn new(profiler: Profiler, spans: RecentSpans) -> Self {
        Viewer { profiler, spans }
    }

    /// The router: mount it at the root of an axum app (its routes start with
    /// `/debug/spanprof/`), on a listener bound to loopback.
    ///
    /// | route | what |
    /// |---|---|
    /// | `GET /debug/spanprof/` | the page |
    /// | `GET /debug/spanprof/api/traces?route=&limit=` | recent traces, slowest first |
    /// | `GET /debug/spanprof/api/traces/{trace_id}` | a trace's spans |
    /// | `GET /debug/spanprof/api/spans/{span_id}/top?n=&by=self\|total` | top functions of a span and everything under it |
    /// | `GET /debug/spanprof/flamegraph/{span_id}` | its flamegraph (SVG) |
    /// | `GET /debug/spanprof/diff/{span_id}?minutes=` | differential flamegraph against its route's recent profile |
    /// | `GET /debug/spanprof/profile?span_id=…` | pprof download (also `?trace_id=`, `?seconds=`) |
    pub fn router(self) -> Router {
        let api = Router::new()
            .route("/debug/spanprof/", get(index))
            .route("/debug/spanprof/api/traces", get(traces))
            .route("/debug/spanprof/api/traces/{trace_id}", get(trace))
            .route("/debug/spanprof/api/spans/{span_id}/top", get(top))
            .route("/debug/spanprof/flamegraph/{span_id}", get(flamegraph))
            .route("/debug/spanprof/diff/{span_id}", get(diff))
            .with_state(self.clone());
        api.merge(spanprof_export::debug_router(self.profiler))
    }
}

/// Serves the viewer on `addr` (use a loopback address: a non-loopback one is
/// refused unless `allow_remote`, since profiles show code and routes). Returns the
/// bound address; the server runs on the current tokio runtime.
pub async fn serve(
    viewer: Viewer,
    addr: SocketAddr,
    allow_remote: bool,
) -> std::io::Result<SocketAddr> {
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "the spanprof viewer binds to loopback only; {addr} is not (set allow_remote to override)"
            ),
        ));
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = viewer.router();
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "spanprof viewer stopped");
        }
    });
    Ok(bound)
}

async fn index() -> Html<&'static str> {
    Html(include_str!("../assets/index.html"))
}

#[derive(Deserialize)]
struct TracesQuery {
    route: Option<String>,
    limit: Option<usize>,
}

async fn traces(State(v): State<Viewer>, Query(q): Query<TracesQuery>) -> Response {
    let route = q.route.filter(|r| !r.is_empty());
    Json(
        v.spans
            .traces(route.as_deref(), q.limit.unwrap_or(100).min(1000)),
    )
    .into_response()
}

async fn trace(State(v): State<Viewer>, Path(trace_id): Path<String>) -> Response {
    match v.spans.trace(&trace_id) {
        Some(spans) => {
            Json(serde_json::json!({ "trace_id": trace_id, "spans": spans })).into_response()
        }
        None => (StatusCode::NOT_FOUND, format!("no trace {trace_id}")).into_response(),
    }
}

fn parse_span(span_id: &str) -> Result<u64, Box<Response>> {
    u64::from_str_radix(span_id.trim_end_matches(".svg"), 16).map_err(|_| {
        Box::new(
            (
                StatusCode::BAD_REQUEST,
                format!("`{span_id}` is not a 16-hex span id"),
            )
                .into_response(),
        )
    })
}

/// Parses a span id, flushes the profiler and returns the span's tree profile, or the
/// error response (400 for a bad id, 404 without samples).
async fn span_tree(
    v: &Viewer,
    span_id: &str,
) -> Result<(u64, spanprof_core::Profile), Box<Response>> {
    let id = parse_span(span_id)?;
    flush(v).await;
    match v.profiler.store().span_tree(id) {
        Some(p) => Ok((id, p)),
        None => Err(Box::new(
            (
                StatusCode::NOT_FOUND,
                format!("no samples of span {span_id}"),
            )
                .into_response(),
        )),
    }
}

async fn flush(v: &Viewer) {
    let p = v.profiler.clone();
    let _ = tokio::task::spawn_blocking(move || p.flush()).await;
}

#[derive(Deserialize)]
struct TopQuery {
    n: Option<usize>,
    /// `self` (default) or `total`: by total time without the runtime around the
    /// span's own code (`Profile::top_functions_by_total`).
    by: Option<String>,
}

#[derive(Serialize)]
struct TopRow {
    function: String,
    self_ns: u64,
    total_ns: u64,
    samples: u64,
    self_pct: f64,
}

async fn top(
    State(v): State<Viewer>,
    Path(span_id): Path<String>,
    Query(q): Query<TopQuery>,
) -> Response {
    let (_, p) = match span_tree(&v, &span_id).await {
        Ok(found) => found,
        Err(r) => return *r,
    };
    let total = p.cpu_ns().max(1);
    let n = q.n.unwrap_or(20).min(200);
    let functions = if q.by.as_deref() == Some("total") {
        p.top_functions_by_total(n)
    } else {
        p.top_functions(n)
    };
    let rows: Vec<TopRow> = functions
        .into_iter()
        .map(|f| TopRow {
            function: f.function.to_string(),
            self_ns: f.self_ns,
            total_ns: f.total_ns,
            samples: f.samples,
            self_pct: 100.0 * f.self_ns as f64 / total as f64,
        })
        .collect();
    Json(serde_json::json!({
        "span_id": span_id,
        "samples": p.sample_count(),
        "cpu_ns": p.cpu_ns(),
        "functions": rows,
    }))
    .into_response()
}

fn svg_response(r: Result<Vec<u8>, String>) -> Response {
    match r {
        Ok(svg) => ([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response(),
        Err(e) => (StatusCode::NOT_FOUND, e).into_response(),
    }
}

async fn flamegraph(State(v): State<Viewer>, Path(span_id): Path<String>) -> Response {
    let (id, p) = match span_tree(&v, &span_id).await {
        Ok(found) => found,
        Err(r) => return *r,
    };
    let name = v
        .spans
        .span(&format!("{id:016x}"))
        .map_or_else(|| format!("span {id:016x}"), |s| s.name);
    svg_response(flame::svg(
        &p,
        &format!("{name} ({:016x}) and everything under it", id),
    ))
}

#[derive(Deserialize)]
struct DiffQuery {
    minutes: Option<u64>,
}

async fn diff(
    State(v): State<Viewer>,
    Path(span_id): Path<String>,
    Query(q): Query<DiffQuery>,
) -> Response {
    let (id, p) = match span_tree(&v, &span_id).await {
        Ok(found) => found,
        Err(r) => return *r,
    };
    let store = v.profiler.store();
    let Some(route) = p
        .samples
        .iter()
        .find_map(|s| s.labels.as_ref().map(|l| l.route.clone()))
    else {
        return (StatusCode::NOT_FOUND, "the span has no route".to_owned()).into_response();
    };
    let minutes = q.minutes.unwrap_or(5).clamp(1, 60);
    let baseline = store.route(&route, Duration::from_secs(minutes * 60));
    svg_response(flame::diff_svg(
        &baseline,
        &p,
        &format!(
            "span {id:016x} against {route} over the last {minutes} min (red: more than usual)"
        ),
    ))
}
