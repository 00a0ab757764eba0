//! `/debug/spanprof/profile`, the way Go's `/debug/pprof/profile` works:
//! `?seconds=N` returns a labelled CPU profile of the next N seconds, so
//! `go tool pprof http://127.0.0.1:PORT/debug/spanprof/profile?seconds=5` just works;
//! `?span_id=<16 hex>` and `?trace_id=<32 hex>` return a span's (with everything
//! under it) or a trace's profile from the store. `?type=cpu` may be added: CPU
//! profiles are the only type served. Any other parameter, or a value it cannot
//! read, is answered 400 before a capture starts.
//!
//! A `?seconds=` capture open when the viewer stops ([`crate::Viewer::close`],
//! [`crate::ViewerThread::stop`]) ends early and answers what it collected, so a
//! service's shutdown never waits for a `go tool pprof` capture (30 s by default).
//!
//! The work (reading the store, encoding the pprof) runs on tokio's blocking pool,
//! not on the runtime's workers that serve requests. Each `?seconds=` window holds
//! up to [`spanprof_core::DEFAULT_WINDOW_ENTRIES`] aggregated samples while it is
//! open, so at most [`MAX_CONCURRENT_WINDOWS`] are open at once in the process;
//! further ones are answered `429 Too Many Requests` with a message and a
//! `Retry-After`, logged and counted ([`debug_endpoint_stats`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use spanprof_core::{Profile, Profiler};

use crate::guard::{AllowedHosts, Mount, refuse_foreign};
use crate::query::{FromQuery, Params, QueryError, Strict};

/// The path of the profile endpoint.
pub const DEBUG_PROFILE_PATH: &str = "/debug/spanprof/profile";
/// Longest `seconds` accepted.
pub const MAX_SECONDS: u64 = 300;
/// `?seconds=` windows open at once in the process; more are refused with 429.
pub const MAX_CONCURRENT_WINDOWS: usize = 2;

static WINDOWS_OPEN: AtomicUsize = AtomicUsize::new(0);
static WINDOWS_REFUSED: AtomicU64 = AtomicU64::new(0);

/// Counters of the profile endpoint (process-wide).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DebugEndpointStats {
    /// `?seconds=` windows open now.
    pub windows_open: usize,
    /// `?seconds=` requests refused because [`MAX_CONCURRENT_WINDOWS`] were open.
    pub windows_refused: u64,
}

/// The profile endpoint's counters.
pub fn debug_endpoint_stats() -> DebugEndpointStats {
    DebugEndpointStats {
        windows_open: WINDOWS_OPEN.load(Ordering::Relaxed),
        windows_refused: WINDOWS_REFUSED.load(Ordering::Relaxed),
    }
}

/// One open `?seconds=` window's place; released on drop (also when the client
/// goes away and the handler is dropped).
struct WindowSlot;

impl WindowSlot {
    fn take() -> Option<WindowSlot> {
        WINDOWS_OPEN
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_CONCURRENT_WINDOWS).then_some(n + 1)
            })
            .ok()
            .map(|_| WindowSlot)
    }
}

impl Drop for WindowSlot {
    fn drop(&mut self) {
        WINDOWS_OPEN.fetch_sub(1, Ordering::AcqRel);
    }
}

fn refuse_window(seconds: u64) -> Response {
    let refused = WINDOWS_REFUSED.fetch_add(1, Ordering::Relaxed) + 1;
    // The first refusal and then one in a hundred: a client retrying in a loop does
    // not flood the log; the counter has them all.
    if refused == 1 || refused.is_multiple_of(100) {
        tracing::warn!(
            refused,
            max = MAX_CONCURRENT_WINDOWS,
            "{DEBUG_PROFILE_PATH}?seconds= refused: {MAX_CONCURRENT_WINDOWS} profile windows are already open"
        );
    }
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, seconds.to_string())],
        format!(
            "{MAX_CONCURRENT_WINDOWS} profile windows are already open (each holds up to {} samples); \
             retry when one has finished\n",
            spanprof_core::DEFAULT_WINDOW_ENTRIES
        ),
    )
        .into_response()
}

/// The profile type the endpoint serves (`?type=`).
const PROFILE_TYPE: &str = "cpu";

/// What `/debug/spanprof/profile` was asked for.
#[derive(Debug)]
enum ProfileQuery {
    /// A span and everything under it, from the store.
    Span { id: u64, hex: String },
    /// A trace, from the store.
    Trace { id: u128, hex: String },
    /// The next `seconds`.
    Window { seconds: u64 },
}

impl FromQuery for ProfileQuery {
    const KNOWN: &'static [&'static str] = &["seconds", "span_id", "trace_id", "type"];

    fn from_query(p: &Params) -> Result<Self, QueryError> {
        if let Some(kind) = p.text("type").filter(|k| *k != PROFILE_TYPE) {
            return Err(QueryError::Invalid {
                name: "type",
                value: kind.to_owned(),
                expected: format!("{PROFILE_TYPE}, the only profile type served"),
            });
        }
        let given: Vec<&str> = ["span_id", "trace_id", "seconds"]
            .into_iter()
            .filter(|n| p.text(n).is_some())
            .collect();
        if given.len() > 1 {
            return Err(QueryError::Conflict(format!(
                "query parameters {} cannot go together: give one of span_id, trace_id or seconds",
                given.join(" and ")
            )));
        }
        let invalid = |name, value: &str, expected: &str| QueryError::Invalid {
            name,
            value: value.to_owned(),
            expected: expected.to_owned(),
        };
        if let Some(span) = p.text("span_id") {
            let id = u64::from_str_radix(span, 16)
                .map_err(|_| invalid("span_id", span, "16 hex digits"))?;
            Ok(ProfileQuery::Span {
                id,
                hex: span.to_owned(),
            })
        } else if let Some(trace) = p.text("trace_id") {
            let id = u128::from_str_radix(trace, 16)
                .map_err(|_| invalid("trace_id", trace, "32 hex digits"))?;
            Ok(ProfileQuery::Trace {
                id,
                hex: trace.to_owned(),
            })
        } else {
            let seconds = match p.text("seconds") {
                None => 30,
                Some(v) => v
                    .parse::<u64>()
                    .ok()
                    .filter(|s| (1..=MAX_SECONDS).contains(s))
                    .ok_or_else(|| {
                        let expected = format!("a whole number from 1 to {MAX_SECONDS}");
                        invalid("seconds", v, &expected)
                    })?,
            };
            Ok(ProfileQuery::Window { seconds })
        }
    }
}

/// Builds the router serving [`DEBUG_PROFILE_PATH`]. Mount it in an axum app, or
/// serve it from plain hyper through `hyper_util::service::TowerToHyperService` (it
/// is a `tower::Service`). Bind it to loopback: profiles show function names. It
/// answers requests addressed to a loopback name ([`crate::DEFAULT_ALLOWED_HOSTS`],
/// any port) and refuses the others with 403; [`debug_router_with_hosts`] allows
/// more names. Its `?seconds=` captures run their full length;
/// [`crate::Viewer::router`] serves the same endpoint with captures that
/// [`crate::Viewer::close`] ends early.
pub fn debug_router(profiler: Profiler) -> Router {
    debug_router_with_hosts(profiler, std::iter::empty::<&str>())
}

/// Builds [`debug_router`] answering requests addressed to each of `hosts` as
/// well: host names or IP addresses as clients write them in the URL (ports are
/// ignored), e.g. `["profiler.internal"]` behind a proxy. Requests with another
/// `Host`, or an `Origin` other than `http://` and an allowed name, get 403.
pub fn debug_router_with_hosts<I>(profiler: Profiler, hosts: I) -> Router
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    let mut allowed = AllowedHosts::default();
    for host in hosts {
        allowed.allow(host.as_ref());
    }
    let check = allowed.check(Mount::ProfileEndpoint, None);
    router(profiler, Closing::never())
        .route_layer(axum::middleware::from_fn_with_state(check, refuse_foreign))
}

/// The endpoint, its captures ended early by `closing`; it checks no hosts (the
/// caller does).
pub(crate) fn router(profiler: Profiler, closing: Closing) -> Router {
    Router::new()
        .route(DEBUG_PROFILE_PATH, get(profile))
        .with_state(Endpoint { profiler, closing })
}

#[derive(Clone)]
struct Endpoint {
    profiler: Profiler,
    closing: Closing,
}

/// Set when the viewer stops: open captures end and answer what they collected.
#[derive(Clone, Debug)]
pub(crate) struct Closing(tokio::sync::watch::Receiver<bool>);

impl Closing {
    /// A signal and its sender.
    pub(crate) fn new() -> (tokio::sync::watch::Sender<bool>, Closing) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (tx, Closing(rx))
    }

    /// A signal that never comes.
    fn never() -> Closing {
        let (tx, rx) = tokio::sync::watch::channel(false);
        // Kept for the life of the process: the receiver then waits forever.
        std::mem::forget(tx);
        Closing(rx)
    }

    /// Completes once the viewer is stopping.
    async fn closed(mut self) {
        if self.0.wait_for(|closing| *closing).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Runs `f` on the blocking pool: flushing, reading the store and encoding cost CPU
/// that belongs off the runtime's workers.
async fn off_runtime(f: impl FnOnce() -> Response + Send + 'static) -> Response {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("profile failed: {e}"),
        )
            .into_response()
    })
}

fn pprof(profile: &Profile) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"profile.pb.gz\"",
            ),
        ],
        spanprof_core::pprof::encode_gzip(profile),
    )
        .into_response()
}

/// A profile from the store (flushed first), or 404 naming `what`.
async fn from_store(
    profiler: Profiler,
    what: String,
    query: impl FnOnce(&spanprof_core::SpanProfileStore) -> Option<Profile> + Send + 'static,
) -> Response {
    off_runtime(move || {
        profiler.flush();
        match query(profiler.store()) {
            Some(p) => pprof(&p),
            None => (StatusCode::NOT_FOUND, format!("no samples of {what}")).into_response(),
        }
    })
    .await
}

async fn profile(
    State(endpoint): State<Endpoint>,
    Strict(query): Strict<ProfileQuery>,
) -> Response {
    let Endpoint { profiler, closing } = endpoint;
    match query {
        ProfileQuery::Span { id, hex } => {
            from_store(profiler, format!("span {hex}"), move |s| s.span_tree(id)).await
        }
        ProfileQuery::Trace { id, hex } => {
            from_store(profiler, format!("trace {hex}"), move |s| s.trace(id)).await
        }
        ProfileQuery::Window { seconds } => window(profiler, closing, seconds).await,
    }
}

/// A profile of the next `seconds` (or until `closing`), if a window is free.
async fn window(profiler: Profiler, closing: Closing, seconds: u64) -> Response {
    let Some(slot) = WindowSlot::take() else {
        return refuse_window(seconds);
    };
    let window = profiler.window(spanprof_core::DEFAULT_WINDOW_ENTRIES);
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(seconds)) => {}
        // Stopping: what was collected so far, now.
        () = closing.closed() => {}
    }
    off_runtime(move || {
        let _slot = slot;
        profiler.flush();
        pprof(&window.take_all())
    })
    .await
}
