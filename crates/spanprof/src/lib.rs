#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub use spanprof_core::*;

/// Runs an `async fn main` on a tokio runtime built with [`install_runtime_hooks`],
/// as `#[tokio::main]` would without them: every runtime thread, and the one running
/// `main`'s future, registered for sampling and, with `--cfg tokio_unstable`, tasks a
/// request spawns labelled as it is. Takes `#[tokio::main]`'s `flavor = "multi_thread" | "current_thread"` and
/// `worker_threads = N` (and `crate = "path"` where `spanprof` is renamed); the
/// program must depend on `tokio` with the runtime flavour it asks for, as with
/// `#[tokio::main]`.
///
/// ```
/// #[spanprof::main(worker_threads = 2)]
/// async fn main() {
///     let answer = tokio::spawn(async { 6 * 7 }).await.unwrap();
///     assert_eq!(answer, 42);
/// }
/// ```
#[cfg(feature = "macros")]
pub use spanprof_macros::main;

/// The Tower middleware, the tracing layer and the OpenTelemetry span processor.
#[cfg(feature = "tower")]
pub mod tower {
    pub use spanprof_tower::*;
}

#[cfg(feature = "tower")]
pub use spanprof_tower::{
    ProfileCorrelationLayer, ProfileScope, RoutePolicy, SpanProfileLayer, SpanProfileProcessor,
    SpanSelector,
};

/// Sinks: periodic pprof files, `/debug/spanprof/profile`, Grafana Pyroscope push and
/// OTLP profiles, with delivery that survives outages.
#[cfg(feature = "export")]
pub mod export {
    pub use spanprof_export::*;
}

/// The embedded viewer: recent traces, a span's waterfall and its flamegraph at
/// `/debug/spanprof/`, served from a loopback port, thread and runtime of its own.
///
/// The one line (see the crate's front page for the span recorder it reads):
/// `ViewerThread::start(Viewer::new(profiler, spans), "127.0.0.1:6060".parse()?, false)?`.
#[cfg(feature = "viewer")]
pub mod viewer {
    pub use spanprof_viewer::*;
}
