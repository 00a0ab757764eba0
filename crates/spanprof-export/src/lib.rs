#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
// The interval thread that feeds a delivery (`sinks::Exporter`) only has users in the
// HTTP sinks; without them it is compiled, unused, so `Sinks` keeps one shape.
#![cfg_attr(not(any(feature = "pyroscope", feature = "otlp")), allow(dead_code))]

pub mod delivery;
mod error;
mod files;
mod http;
#[cfg(feature = "otlp")]
pub mod otlp;
#[cfg(feature = "pyroscope")]
pub mod pyroscope;
mod retry;
mod sinks;
mod source;

pub use delivery::{
    DEFAULT_SHUTDOWN_DEADLINE, Delivery, DeliveryConfig, DeliveryStats, RejectStatus, SendError,
    Transport,
};
pub use files::{
    DEFAULT_FILE_INTERVAL, DEFAULT_MAX_FILES, PprofFileConfig, PprofFileExporter, write_one,
};
#[cfg(feature = "otlp")]
pub use otlp::{OtlpProfilesConfig, OtlpProfilesExporter, OtlpProtocol};
#[cfg(feature = "pyroscope")]
pub use pyroscope::{PyroscopeAuth, PyroscopeConfig, PyroscopeExporter};

pub use error::ExportError;
#[cfg(any(feature = "pyroscope", feature = "otlp"))]
pub use http::read_ca_certificates;
pub use http::{USER_AGENT, redact_url};
#[cfg(any(feature = "pyroscope", feature = "otlp"))]
pub(crate) use sinks::Exporter;
pub use sinks::Sinks;
pub use source::ProfileSource;

/// The service name: `OTEL_SERVICE_NAME`, else the executable's file name.
#[cfg(any(feature = "pyroscope", feature = "otlp"))]
pub(crate) fn default_service_name() -> String {
    std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::env::current_exe()
                .ok()?
                .file_name()?
                .to_str()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown_service".to_owned())
}
