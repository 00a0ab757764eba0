//! `/debug/spanprof/profile`, the way Go's `/debug/pprof/profile` works:
//! `?seconds=N` returns a labelled CPU profile of the next N seconds, so
//! `go tool pprof http://127.0.0.1:PORT/debug/spanprof/profile?seconds=5` just works;
//! `?span_id=<16 hex>` and `?trace_id=<32 hex>` return a span's (with everything
//! under it) or a trace's profile from the store.

use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use spanprof_core::{Profile, Profiler};

/// The path of the profile endpoint.
pub const DEBUG_PROFILE_PATH: &str = "/debug/spanprof/profile";
/// Longest `seconds` accepted.
pub const MAX_SECONDS: u64 = 300;

#[derive(Debug, Deserialize)]
struct Params {
    seconds: Option<String>,
    span_id: Option<String>,
    trace_id: Option<String>,
}

/// The router serving [`DEBUG_PROFILE_PATH`]. Mount it in an axum app, or serve it
/// from plain hyper through `hyper_util::service::TowerToHyperService` (it is a
/// `tower::Service`). Bind it to loopback: profiles show function names.
pub fn debug_router(profiler: Profiler) -> Router {
    Router::new()
        .route(DEBUG_PROFILE_PATH, get(profile))
        .with_state(profiler)
}

fn bad(msg: String) -> Response {
    (StatusCode::BAD_REQUEST, msg).into_response()
}

/// Drains the sample rings into the store without blocking the runtime.
async fn flush(profiler: &Profiler) {
    let p = profiler.clone();
    let _ = tokio::task::spawn_blocking(move || p.flush()).await;
}

async fn profile(State(profiler): State<Profiler>, Query(p): Query<Params>) -> Response {
    let profile: Profile = if let Some(span) = p.span_id {
        let Ok(id) = u64::from_str_radix(&span, 16) else {
            return bad(format!("span_id `{span}` is not 16 hex digits"));
        };
        flush(&profiler).await;
        match profiler.store().span_tree(id) {
            Some(p) => p,
            None => {
                return (StatusCode::NOT_FOUND, format!("no samples of span {span}"))
                    .into_response();
            }
        }
    } else if let Some(trace) = p.trace_id {
        let Ok(id) = u128::from_str_radix(&trace, 16) else {
            return bad(format!("trace_id `{trace}` is not 32 hex digits"));
        };
        flush(&profiler).await;
        match profiler.store().trace(id) {
            Some(p) => p,
            None => {
                return (
                    StatusCode::NOT_FOUND,
                    format!("no samples of trace {trace}"),
                )
                    .into_response();
            }
        }
    } else {
        let seconds = match p.seconds.as_deref().map(str::parse::<u64>) {
            None => 30,
            Some(Ok(s)) if (1..=MAX_SECONDS).contains(&s) => s,
            Some(_) => {
                return bad(format!(
                    "seconds must be a whole number from 1 to {MAX_SECONDS}"
                ));
            }
        };
        let window = profiler.window(spanprof_core::DEFAULT_WINDOW_ENTRIES);
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        flush(&profiler).await;
        window.take()
    };
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"profile.pb.gz\"",
            ),
        ],
        spanprof_core::pprof::encode_gzip(&profile),
    )
        .into_response()
}
