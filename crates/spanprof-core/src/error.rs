//! [`ProfilerError`]: why the profiler could not start (or its configuration is
//! wrong). Its own module: the builder, the store's configuration and the platform
//! code all return it.

use std::fmt;

/// Why the profiler could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum ProfilerError {
    /// A configuration value is out of range; names the field.
    InvalidConfig {
        /// The field, as named by its builder method.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A profiler is already running in this process.
    AlreadyRunning,
    /// Profiling is not available on this platform.
    Unsupported(&'static str),
    /// A system call failed.
    Io(std::io::Error),
}

impl fmt::Display for ProfilerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfilerError::InvalidConfig { field, reason } => {
                write!(f, "invalid profiler configuration: `{field}`: {reason}")
            }
            ProfilerError::AlreadyRunning => f.write_str("a spanprof profiler is already running"),
            ProfilerError::Unsupported(why) => write!(f, "profiling unavailable: {why}"),
            ProfilerError::Io(e) => write!(f, "profiler system call failed: {e}"),
        }
    }
}

impl std::error::Error for ProfilerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ProfilerError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for ProfilerError {
    fn from(e: std::io::Error) -> Self {
        ProfilerError::Io(e)
    }
}
