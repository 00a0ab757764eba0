//! [`ProfilerError`]: why the profiler could not start, and [`ConfigError`]: the one
//! configuration error of every spanprof crate (the profiler's builder, the layer's
//! policies, the sinks), naming the field or variable at fault. Its own module: the
//! builder, the store's configuration and the platform code all return these.

use std::fmt;

/// A configuration value (a builder field, a policy field, an environment variable)
/// is wrong. Every spanprof crate reports bad configuration with this type, so one
/// message shape names the fix: ``invalid spanprof configuration: `FIELD`: REASON``.
///
/// ```
/// let e = spanprof_core::ConfigError::new("baseline_hz", "0 is not in 1..=1000");
/// assert_eq!(
///     e.to_string(),
///     "invalid spanprof configuration: `baseline_hz`: 0 is not in 1..=1000"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The field, as its builder method, configuration path (for example
    /// `routes["/checkout"].sample_rate`) or environment variable names it.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigError {
    /// An error naming `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid spanprof configuration: `{}`: {}",
            self.field, self.reason
        )
    }
}

impl std::error::Error for ConfigError {}

/// Why the profiler could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum ProfilerError {
    /// A configuration value is out of range; names the field.
    InvalidConfig(ConfigError),
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
            ProfilerError::InvalidConfig(e) => e.fmt(f),
            ProfilerError::AlreadyRunning => f.write_str("a spanprof profiler is already running"),
            ProfilerError::Unsupported(why) => write!(f, "profiling unavailable: {why}"),
            ProfilerError::Io(e) => write!(f, "profiler system call failed: {e}"),
        }
    }
}

/// The message already says the wrapped error's, so the chain goes on from that
/// error's own cause: a report (anyhow's, eyre's) says each cause once.
impl std::error::Error for ProfilerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ProfilerError::InvalidConfig(e) => e.source(),
            ProfilerError::Io(e) => e.source(),
            _ => None,
        }
    }
}

impl From<ConfigError> for ProfilerError {
    fn from(e: ConfigError) -> Self {
        ProfilerError::InvalidConfig(e)
    }
}

impl From<std::io::Error> for ProfilerError {
    fn from(e: std::io::Error) -> Self {
        ProfilerError::Io(e)
    }
}
