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
