#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub use spanprof_core::*;

/// The Tower middleware, the tracing layer and the OpenTelemetry span processor.
#[cfg(feature = "tower")]
pub mod tower {
    pub use spanprof_tower::*;
}

#[cfg(feature = "tower")]
pub use spanprof_tower::{
    ProfileCorrelationLayer, ProfileScope, RoutePolicy, SpanProfileLayer, SpanProfileProcessor,
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
