//! [`ExportError`]: what goes wrong configuring or starting a sink.

/// A sink could not be configured or started.
#[derive(Debug)]
#[non_exhaustive]
pub enum ExportError {
    /// A configuration value (or environment variable) is wrong; names it.
    Config {
        /// The field or variable.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// An I/O error (creating the pprof directory, for one).
    Io(std::io::Error),
}

impl ExportError {
    pub(crate) fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ExportError::Config {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportError::Config { field, reason } => {
                write!(
                    f,
                    "invalid spanprof export configuration: `{field}`: {reason}"
                )
            }
            ExportError::Io(e) => write!(f, "spanprof export: {e}"),
        }
    }
}

impl std::error::Error for ExportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExportError::Io(e) => Some(e),
            ExportError::Config { .. } => None,
        }
    }
}

impl From<std::io::Error> for ExportError {
    fn from(e: std::io::Error) -> Self {
        ExportError::Io(e)
    }
}
