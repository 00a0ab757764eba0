//! The viewer's routes under `/debug/spanprof/`: the page, its JSON API, the
//! flamegraphs, and the pprof downloads.
//!
//! Answers that cost CPU (a span's profile, its top functions, flamegraphs, diffs)
//! are computed on tokio's blocking pool, never on the runtime's workers that serve
//! the requests (a service that mounts the router in its own app keeps its workers
//! for its requests), and one at a time ([`MAX_CONCURRENT_RENDERS`]): more viewer
//! clients wait their turn instead of taking more of the service's cores.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Json, Response};
use axum::routing::get;
use serde::Serialize;
use spanprof_core::Profiler;
use tokio::sync::Semaphore;

use crate::flame;
use crate::guard::{AllowedHosts, Mount, refuse_foreign};
use crate::query::{FromQuery, NoQuery, Params, QueryError, Strict};
use crate::spans::RecentSpans;

mod latency;

/// Where the viewer is mounted.
pub const VIEWER_PATH: &str = "/debug/spanprof/";

/// Viewer answers computed at once (span profiles, top functions, flamegraphs,
/// diffs); further requests wait for their turn.
pub const MAX_CONCURRENT_RENDERS: usize = 1;

/// The viewer: a profiler (its store answers the profiles) and recent spans.
#[derive(Clone, Debug)]
pub struct Viewer {
    profiler: Profiler,
    spans: RecentSpans,
    renders: Arc<Semaphore>,
    close: Arc<tokio::sync::watch::Sender<bool>>,
    closing: crate::debug::Closing,
    hosts: AllowedHosts,
}

impl Viewer {
    /// A viewer over `profiler`'s store and `spans`.
    pub fn new(profiler: Profiler, spans: RecentSpans) -> Self {
        let (close, closing) = crate::debug::Closing::new();
        Viewer {
            profiler,
            spans,
            renders: Arc::new(Semaphore::new(MAX_CONCURRENT_RENDERS)),
            close: Arc::new(close),
            closing,
            hosts: AllowedHosts::default(),
        }
    }

    /// Answers requests addressed to `name` too: a host name or IP address as
    /// clients write it in the URL (a port is ignored), e.g. `profiler.internal`
    /// behind a proxy, or the machine's address when bound to `0.0.0.0`. Defaults
    /// to none: the viewer answers the loopback names ([`DEFAULT_ALLOWED_HOSTS`],
    /// any port) and the address [`serve`] or [`ViewerThread`] bound. Requests
    /// with another `Host`, or an `Origin` other than `http://` and one of these,
    /// get 403, so that a web page cannot point a name of its own at this machine
    /// and read the profiles.
    ///
    /// [`DEFAULT_ALLOWED_HOSTS`]: crate::DEFAULT_ALLOWED_HOSTS
    pub fn allow_host(mut self, name: impl AsRef<str>) -> Self {
        self.hosts.allow(name.as_ref());
        self
    }

    /// Ends the `/debug/spanprof/profile?seconds=` captures open on this viewer's
    /// router (and its clones'): each answers at once with what it has collected, so
    /// that a shutdown does not wait for them. [`ViewerThread::stop`] calls it; call
    /// it yourself when you serve [`Viewer::router`] in an app of your own.
    pub fn close(&self) {
        self.close.send_replace(true);
    }

    /// Builds the router: mount it at the root of an axum app (its routes start with
    /// `/debug/spanprof/`), on a listener bound to loopback — not on a service's
    /// public listener: profiles show code, routes and timings. [`serve`] and
    /// [`ViewerThread`] give it a loopback listener of its own.
    ///
    /// Its routes answer requests addressed to a loopback name, on any port, or to a
    /// name given to [`Viewer::allow_host`], and refuse the others with 403. A
    /// query parameter a route does not know, or cannot read, is answered 400
    /// naming it.
    ///
    /// | route | what |
    /// |---|---|
    /// | `GET /debug/spanprof/` | the page |
    /// | `GET /debug/spanprof/api/traces?route=&limit=` | recent traces, slowest first |
    /// | `GET /debug/spanprof/api/traces/{trace_id}` | a trace's spans |
    /// | `GET /debug/spanprof/api/spans?name=&trace_id=&limit=` | spans of a name, slowest first (in one trace, or all) |
    /// | `GET /debug/spanprof/api/memory` | the profiler's and the viewer's memory, with their bounds |
    /// | `GET /debug/spanprof/api/spans/{span_id}/top?n=&by=self\|total` | top functions of a span and everything under it, its wall-clock time and its long polls' stack |
    /// | `GET /debug/spanprof/flamegraph/{span_id}?value=` | its flamegraph (SVG): `cpu` (the default) or `wall` (hot polls' wall-clock time, on and off CPU) |
    /// | `GET /debug/spanprof/diff/{span_id}?minutes=` | differential flamegraph against its route's recent profile |
    /// | `GET /debug/spanprof/route?route=` | a route's latency page |
    /// | `GET /debug/spanprof/api/routes/latency?route=&minutes=` | its latency histogram, its requests by latency class, and the functions its slow requests spend more CPU in |
    /// | `GET /debug/spanprof/routes/flamegraph?route=&minutes=` | its slow requests' differential flamegraph against the rest |
    /// | `GET /debug/spanprof/profile?span_id=…` | pprof download (or `?trace_id=`, or `?seconds=`; `&type=cpu` allowed) |
    pub fn router(self) -> Router {
        self.router_at(None)
    }

    /// The router served on `bound` (`None`: mounted by the user, address unknown).
    fn router_at(self, bound: Option<SocketAddr>) -> Router {
        let hosts = self.hosts.check(Mount::Viewer, bound);
        let api = Router::new()
            .route("/debug/spanprof/", get(index))
            .route("/debug/spanprof/api/traces", get(traces))
            .route("/debug/spanprof/api/traces/{trace_id}", get(trace))
            .route("/debug/spanprof/api/spans", get(spans_named))
            .route("/debug/spanprof/api/memory", get(memory))
            .route("/debug/spanprof/api/spans/{span_id}/top", get(top))
            .route("/debug/spanprof/flamegraph/{span_id}", get(flamegraph))
            .route("/debug/spanprof/diff/{span_id}", get(diff))
            .route("/debug/spanprof/route", get(latency::page))
            .route("/debug/spanprof/api/routes/latency", get(latency::api))
            .route(
                "/debug/spanprof/routes/flamegraph",
                get(latency::flamegraph),
            )
            .with_state(self.clone());
        api.merge(crate::debug::router(self.profiler, self.closing))
            .route_layer(axum::middleware::from_fn_with_state(hosts, refuse_foreign))
    }
}

/// Which addresses the viewer may listen on. Profiles show code and routes, so the
/// viewer is for loopback (reached from elsewhere through `ssh -L`) unless told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Exposure {
    /// Loopback addresses only; a non-loopback address is refused.
    #[default]
    LoopbackOnly,
    /// Any address: whoever reaches it sees the profiles. Requests must still be
    /// addressed to an allowed name: bound to `0.0.0.0`, give the name or address
    /// clients use to [`Viewer::allow_host`].
    Remote,
}

fn check_loopback(addr: SocketAddr, exposure: Exposure) -> std::io::Result<()> {
    if !addr.ip().is_loopback() && exposure == Exposure::LoopbackOnly {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "the spanprof viewer binds to loopback only; {addr} is not (use Exposure::Remote to override)"
            ),
        ));
    }
    Ok(())
}

/// Serves the viewer on `addr` (use a loopback address: a non-loopback one is
/// refused unless [`Exposure::Remote`], since profiles show code and routes). Returns the
/// bound address; the server runs on the current tokio runtime (its CPU-heavy
/// answers on that runtime's blocking pool). [`ViewerThread`] runs it on a thread
/// and runtime of its own instead.
pub async fn serve(
    viewer: Viewer,
    addr: SocketAddr,
    exposure: Exposure,
) -> std::io::Result<SocketAddr> {
    check_loopback(addr, exposure)?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = viewer.router_at(Some(bound));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "spanprof viewer stopped");
        }
    });
    Ok(bound)
}

/// The viewer served from a thread of its own, with its own single-threaded tokio
/// runtime (and that runtime's blocking pool for the heavy answers): however busy
/// the service's runtime is, the viewer answers, and the viewer's work never runs on
/// the service's workers. Dropping it stops the server without waiting;
/// [`ViewerThread::stop`] ends open profile captures (they answer what they have)
/// and waits for requests in flight, [`ViewerThread::stop_within`] for at most a
/// deadline.
///
/// ```no_run
/// # fn run(profiler: spanprof_core::Profiler) -> std::io::Result<()> {
/// use spanprof_viewer::{Exposure, RecentSpans, Viewer, ViewerThread};
/// let spans = RecentSpans::new(spanprof_viewer::DEFAULT_MAX_TRACES);
/// let viewer = ViewerThread::start(Viewer::new(profiler, spans), "127.0.0.1:6060".parse().unwrap(), Exposure::LoopbackOnly)?;
/// println!("http://{}/debug/spanprof/", viewer.local_addr());
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "the viewer stops when dropped: keep it alive as long as it should serve"]
pub struct ViewerThread {
    addr: SocketAddr,
    viewer: Viewer,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ViewerThread {
    /// Binds `addr` (loopback only unless [`Exposure::Remote`], as [`serve`]) and
    /// starts serving on a new thread named `spanprof-viewer`. Needs no tokio runtime.
    pub fn start(viewer: Viewer, addr: SocketAddr, exposure: Exposure) -> std::io::Result<Self> {
        check_loopback(addr, exposure)?;
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("spanprof-viewer-blocking")
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = viewer.clone();
        let thread = std::thread::Builder::new()
            .name("spanprof-viewer".into())
            .spawn(move || {
                rt.block_on(async move {
                    let served = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => {
                            axum::serve(listener, viewer.router_at(Some(bound)))
                                .with_graceful_shutdown(async {
                                    let _ = stopped.await;
                                })
                                .await
                        }
                        Err(e) => Err(e),
                    };
                    if let Err(e) = served {
                        tracing::warn!(error = %e, "spanprof viewer stopped");
                    }
                });
            })?;
        Ok(ViewerThread {
            addr: bound,
            viewer: handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, ends open profile captures (each answers what it has
    /// collected), waits for the requests in flight, and joins the thread.
    pub fn stop(mut self) {
        self.begin_stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// [`ViewerThread::stop`], waiting at most `deadline` for the requests in flight
    /// (a flamegraph being drawn, say); past it the thread is left to end by itself.
    /// Returns whether it ended in time.
    pub fn stop_within(mut self, deadline: std::time::Duration) -> bool {
        self.begin_stop();
        let Some(t) = self.thread.take() else {
            return true;
        };
        let end = std::time::Instant::now() + deadline;
        while !t.is_finished() {
            if std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = t.join();
        true
    }

    fn begin_stop(&mut self) {
        self.viewer.close();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for ViewerThread {
    fn drop(&mut self) {
        self.begin_stop();
    }
}

async fn index() -> Html<&'static str> {
    Html(include_str!("../assets/index.html"))
}

struct TracesQuery {
    /// Only traces whose root span's name contains it.
    route: Option<String>,
    limit: usize,
}

impl FromQuery for TracesQuery {
    const KNOWN: &'static [&'static str] = &["route", "limit"];

    fn from_query(p: &Params) -> Result<Self, QueryError> {
        Ok(TracesQuery {
            route: p.text("route").filter(|r| !r.is_empty()).map(str::to_owned),
            limit: p
                .parsed::<usize>("limit", "a whole number")?
                .unwrap_or(100)
                .min(1000),
        })
    }
}

async fn traces(State(v): State<Viewer>, Strict(q): Strict<TracesQuery>) -> Response {
    let TracesQuery { route, limit } = q;
    let spans = v.spans.clone();
    off_runtime(move || Json(spans.traces(route.as_deref(), limit)).into_response()).await
}

async fn trace(
    State(v): State<Viewer>,
    Path(trace_id): Path<String>,
    _: Strict<NoQuery>,
) -> Response {
    let spans = v.spans.clone();
    off_runtime(move || match spans.trace(&trace_id) {
        Some(spans) => {
            Json(serde_json::json!({ "trace_id": trace_id, "spans": spans })).into_response()
        }
        None => (StatusCode::NOT_FOUND, format!("no trace {trace_id}")).into_response(),
    })
    .await
}

struct SpansQuery {
    name: String,
    trace_id: Option<String>,
    limit: usize,
}

impl FromQuery for SpansQuery {
    const KNOWN: &'static [&'static str] = &["name", "trace_id", "limit"];

    fn from_query(p: &Params) -> Result<Self, QueryError> {
        let name = p
            .text("name")
            .filter(|n| !n.is_empty())
            .ok_or(QueryError::Missing {
                name: "name",
                expected: "a span name, e.g. name=apply",
            })?;
        let trace_id = match p.text("trace_id") {
            None => None,
            Some(t) if t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Some(t.to_ascii_lowercase())
            }
            Some(t) => {
                return Err(QueryError::Invalid {
                    name: "trace_id",
                    value: t.to_owned(),
                    expected: "32 hex digits".to_owned(),
                });
            }
        };
        Ok(SpansQuery {
            name: name.to_owned(),
            trace_id,
            limit: p
                .parsed::<usize>("limit", "a whole number")?
                .unwrap_or(20)
                .min(1000),
        })
    }
}

async fn spans_named(State(v): State<Viewer>, Strict(q): Strict<SpansQuery>) -> Response {
    let spans = v.spans.clone();
    off_runtime(move || {
        Json(spans.spans_named(&q.name, q.trace_id.as_deref(), q.limit)).into_response()
    })
    .await
}

async fn memory(State(v): State<Viewer>, _: Strict<NoQuery>) -> Response {
    let m = v.profiler.memory_stats();
    let cache = |c: spanprof_core::CacheStats| {
        serde_json::json!({
            "entries": c.entries, "bytes": c.bytes, "max_bytes": c.max_bytes, "evicted": c.evicted,
        })
    };
    let store = v.profiler.store().stats();
    Json(serde_json::json!({
        "profiler": {
            "total_bytes": m.total_bytes(),
            "bound_bytes": m.bound_bytes(),
            "store": {
                "bytes": m.store_bytes, "max_bytes": m.store_max_bytes,
                "spans": store.spans, "stacks": store.stacks,
                "spans_evicted": store.spans_evicted, "buckets_evicted": store.buckets_evicted,
            },
            "stack_cache": cache(m.stack_cache),
            "symbol_cache": cache(m.symbol_cache),
            "labels_cache": cache(m.labels_cache),
            "windows": { "open": m.windows, "entries": m.window_entries, "bytes": m.window_bytes },
            "backlog_bytes": m.backlog_bytes,
            "names": {
                "names": m.names.names, "max_names": m.names.max_names,
                "bytes": m.names.bytes, "max_bytes": m.names.max_bytes,
                "overflowed": m.names.overflowed,
            },
        },
        "recent_spans": v.spans.stats(),
        "process": process_memory(),
    }))
    .into_response()
}

/// The process's resident memory from `/proc/self/status` (Linux), in bytes.
fn process_memory() -> serde_json::Value {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|k| k * 1024)
    };
    serde_json::json!({ "rss_bytes": kb("VmRSS:"), "rss_anon_bytes": kb("RssAnon:") })
}

/// Runs `f` on the blocking pool (not on the runtime's workers).
async fn off_runtime(f: impl FnOnce() -> Response + Send + 'static) -> Response {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the viewer failed: {e}"),
        )
            .into_response()
    })
}

/// Flushes the profiler, then runs `render` with the profile of `span_id` and
/// everything under it on the blocking pool, one render at a time. 400 for a bad
/// id, 404 without samples.
async fn render_span(
    v: &Viewer,
    span_id: &str,
    render: impl FnOnce(&Viewer, u64, spanprof_core::Profile) -> Response + Send + 'static,
) -> Response {
    let id = match parse_span(span_id) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let Ok(turn) = v.renders.clone().acquire_owned().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "the viewer is stopping").into_response();
    };
    let (v, span_id) = (v.clone(), span_id.to_owned());
    off_runtime(move || {
        // Held until the work ends, even if the client went away.
        let _turn = turn;
        v.profiler.flush();
        match v.profiler.store().span_tree(id) {
            Some(p) => render(&v, id, p),
            None => (
                StatusCode::NOT_FOUND,
                format!("no samples of span {span_id}"),
            )
                .into_response(),
        }
    })
    .await
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

struct TopQuery {
    n: usize,
    /// By total time without the runtime around the span's own code
    /// (`Profile::top_functions_by_total`) rather than by self time.
    by_total: bool,
}

impl FromQuery for TopQuery {
    const KNOWN: &'static [&'static str] = &["n", "by"];

    fn from_query(p: &Params) -> Result<Self, QueryError> {
        let by_total = match p.text("by") {
            None | Some("self") => false,
            Some("total") => true,
            Some(other) => {
                return Err(QueryError::Invalid {
                    name: "by",
                    value: other.to_owned(),
                    expected: "self or total".to_owned(),
                });
            }
        };
        Ok(TopQuery {
            n: p.parsed::<usize>("n", "a whole number")?
                .unwrap_or(20)
                .min(200),
            by_total,
        })
    }
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
    Strict(q): Strict<TopQuery>,
) -> Response {
    let span = span_id.clone();
    render_span(&v, &span_id, move |_, id, p| {
        let total = p.cpu_ns().max(1);
        let n = q.n;
        let functions = if q.by_total {
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
        let wall_ns: u64 = p.samples.iter().map(|s| s.wall_ns).sum();
        let long_poll_stack = spanprof_core::long_poll_stack(id);
        Json(serde_json::json!({
            "span_id": span,
            "samples": p.sample_count(),
            "cpu_ns": p.cpu_ns(),
            "wall_ns": wall_ns,
            "long_poll_stack": long_poll_stack.as_deref(),
            "functions": rows,
        }))
        .into_response()
    })
    .await
}

fn svg_response(r: Result<Vec<u8>, String>) -> Response {
    match r {
        Ok(svg) => ([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response(),
        Err(e) => (StatusCode::NOT_FOUND, e).into_response(),
    }
}

/// A flamegraph's query: `value=cpu` (the default) or `value=wall`.
struct FlameQuery {
    value: flame::Value,
}

impl FromQuery for FlameQuery {
    const KNOWN: &'static [&'static str] = &["value"];

    fn from_query(p: &Params) -> Result<Self, QueryError> {
        let value = match p.text("value") {
            None | Some("cpu") => flame::Value::Cpu,
            Some("wall") => flame::Value::Wall,
            Some(other) => {
                return Err(QueryError::Invalid {
                    name: "value",
                    value: other.to_owned(),
                    expected: "cpu or wall".to_owned(),
                });
            }
        };
        Ok(FlameQuery { value })
    }
}

async fn flamegraph(
    State(v): State<Viewer>,
    Path(span_id): Path<String>,
    Strict(q): Strict<FlameQuery>,
) -> Response {
    render_span(&v, &span_id, move |v, id, p| {
        let name = v
            .spans
            .span(&format!("{id:016x}"))
            .map_or_else(|| format!("span {id:016x}"), |s| s.name);
        let what = match q.value {
            flame::Value::Cpu => "CPU",
            flame::Value::Wall => "wall-clock time of its hot polls, on and off CPU",
        };
        svg_response(flame::svg(
            &p,
            &format!("{name} ({id:016x}) and everything under it: {what}"),
            q.value,
        ))
    })
    .await
}

struct DiffQuery {
    minutes: u64,
}

impl FromQuery for DiffQuery {
    const KNOWN: &'static [&'static str] = &["minutes"];

    fn from_query(p: &Params) -> Result<Self, QueryError> {
        Ok(DiffQuery {
            minutes: p
                .parsed::<u64>("minutes", "a whole number")?
                .unwrap_or(5)
                .clamp(1, 60),
        })
    }
}

async fn diff(
    State(v): State<Viewer>,
    Path(span_id): Path<String>,
    Strict(q): Strict<DiffQuery>,
) -> Response {
    render_span(&v, &span_id, move |v, id, p| {
        let Some(route) = p
            .samples
            .iter()
            .find_map(|s| s.labels.as_ref().map(|l| l.route.clone()))
        else {
            return (StatusCode::NOT_FOUND, "the span has no route".to_owned()).into_response();
        };
        let minutes = q.minutes;
        let baseline = v
            .profiler
            .store()
            .route(&route, Duration::from_secs(minutes * 60));
        svg_response(flame::diff_svg(
            &baseline,
            &p,
            &format!(
                "span {id:016x} against {route} over the last {minutes} min (red: more than usual)"
            ),
        ))
    })
    .await
}
