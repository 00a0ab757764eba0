//! The profiler: its configuration (`config.rs`) and the running handle, started
//! and stopped (`profiler.rs`). The sampled threads are `crate::threads`.

mod config;
mod profiler;

pub(crate) use crate::error::ProfilerError;
pub(crate) use crate::sys::{Mechanism, Unwinding};
pub(crate) use crate::threads::*;
pub use config::*;
pub use profiler::*;
