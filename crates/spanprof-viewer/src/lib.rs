#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod flame;
mod router;
mod spans;

pub use router::{VIEWER_PATH, Viewer, serve};
pub use spans::{DEFAULT_MAX_TRACES, RecentSpans, SpanRecord, SpanRecorder, TraceSummary};
