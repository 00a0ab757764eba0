#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod debug;
mod flame;
mod guard;
mod query;
mod router;
mod spans;

pub use debug::{
    DEBUG_PROFILE_PATH, DebugEndpointStats, MAX_CONCURRENT_WINDOWS, debug_endpoint_stats,
    debug_router, debug_router_with_hosts,
};
pub use guard::DEFAULT_ALLOWED_HOSTS;
pub use router::{Exposure, MAX_CONCURRENT_RENDERS, VIEWER_PATH, Viewer, ViewerThread, serve};
pub use spans::{
    DEFAULT_MAX_RECENT_SPANS, DEFAULT_MAX_TRACES, MAX_SPANS_PER_TRACE, RecentSpans,
    RecentSpansStats, SpanRecord, SpanRecorder, TraceSummary,
};
