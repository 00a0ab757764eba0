#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod flame;
mod router;
mod spans;

pub use router::{MAX_CONCURRENT_RENDERS, VIEWER_PATH, Viewer, ViewerThread, serve};
pub use spans::{DEFAULT_MAX_TRACES, RecentSpans, SpanRecord, SpanRecorder, TraceSummary};
