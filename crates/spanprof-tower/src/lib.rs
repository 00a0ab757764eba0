#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod export_watch;
mod layer;
mod otel_context;
mod policy;
mod processor;
mod registry;
mod setup;
mod tracing_layer;

#[cfg(feature = "hyper")]
pub mod hyper_service;

pub use export_watch::{SpanExportStats, SpanExportWatch, WatchedBatch};
pub use layer::{
    DEFAULT_MAX_ROUTES, DefaultRoute, GrpcRoute, MAX_MAX_ROUTES, MakeRoute, ProfileCorrelation,
    ProfileCorrelationLayer, ProfileCorrelationLayerBuilder, ProfiledBody, ResponseFuture,
    UNKNOWN_ROUTE, UNMATCHED_ROUTE, extract_trace_context,
};
pub use policy::{
    ConfigError, DEFAULT_SAMPLE_RATE, DEFAULT_SLOW_AFTER, PolicyConfig, ProfileScope, RoutePolicy,
    RoutePolicyConfig, parse_duration, rate_picks,
};
pub use processor::{
    ATTR_BLOCKED_NS, ATTR_BUSY_NS, ATTR_CPU_NS, ATTR_CPU_SAMPLES, ATTR_CPU_SOURCE, ATTR_HOT,
    ATTR_IDLE_NS, ATTR_LONG_POLLS, ATTR_MAX_POLL_NS, ATTR_POLLS, ATTR_PROFILE_ID,
    ATTR_SCHED_DELAY_NS, ATTR_WAIT_NS, SpanProfileProcessor,
};
pub use registry::{MAX_TRACKED_SPANS, ended_unexported, tracking_evicted};
pub use tracing_layer::{SpanProfileLayer, SpanSelector};
