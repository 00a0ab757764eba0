//! [`ExportError`]: what goes wrong configuring or starting a sink.

use spanprof_core::ConfigError;

/// A sink could not be configured or started.
#[derive(Debug)]
#[non_exhaustive]
pub enum ExportError {
    /// A configuration value (or environment variable) is wrong; names it. The same
    /// error type as the profiler's and the layer's.
    Config(ConfigError),
    /// An I/O error (creating the pprof directory, for one).
    Io(std::io::Error),
}

impl ExportError {
    pub(crate) fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ExportError::Config(ConfigError::new(field, reason))
    }
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportError::Config(e) => e.fmt(f),
            ExportError::Io(e) => write!(f, "spanprof export: {e}"),
        }
    }
}

/// The message already says the wrapped error's, so the chain goes on from that
/// error's own cause: a report (anyhow's, eyre's) says each cause once.
impl std::error::Error for ExportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExportError::Io(e) => e.source(),
            ExportError::Config(e) => e.source(),
        }
    }
}

impl From<ConfigError> for ExportError {
    fn from(e: ConfigError) -> Self {
        ExportError::Config(e)
    }
}

impl From<std::io::Error> for ExportError {
    fn from(e: std::io::Error) -> Self {
        ExportError::Io(e)
    }
}
