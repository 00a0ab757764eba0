//! How one send can fail.

/// Why one send failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// Worth retrying: connection refused or reset, timeout, HTTP 5xx, 408, 429, and
    /// the gRPC codes `Unavailable`, `Cancelled`, `DeadlineExceeded`,
    /// `ResourceExhausted`, `Aborted`, `Internal` and `Unknown`.
    Retryable(String),
    /// The server refused the payload: retrying would not help.
    Rejected {
        /// What the server answered.
        status: RejectStatus,
        /// What the server said (truncated).
        message: String,
    },
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Retryable(why) => write!(f, "send failed, worth retrying: {why}"),
            SendError::Rejected { status, message } => {
                write!(f, "payload rejected with {status}: {message}")
            }
        }
    }
}

impl std::error::Error for SendError {}

/// The status a server refused a payload with: the transport's own kind, never
/// mixed up (an HTTP 404 and the gRPC code 5, `NotFound`, are different values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectStatus {
    /// An HTTP status, 4xx but 408 and 429 (Pyroscope, OTLP over HTTP).
    Http(u16),
    /// A gRPC status code (OTLP over gRPC), such as 3 (`InvalidArgument`) or 16
    /// (`Unauthenticated`).
    Grpc(i32),
}

impl std::fmt::Display for RejectStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RejectStatus::Http(status) => write!(f, "HTTP {status}"),
            RejectStatus::Grpc(code) => write!(f, "gRPC code {code}"),
        }
    }
}
