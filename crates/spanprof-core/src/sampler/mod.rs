//! The profiler: configuration, the registry of sampled threads, start and stop.

mod config;
mod profiler;
mod registry;

pub use config::*;
pub use profiler::*;
pub use registry::*;
