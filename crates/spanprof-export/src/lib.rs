#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod delivery;
mod error;
mod files;
mod http;
mod http_debug;
pub mod otlp;
pub mod pyroscope;
mod retry;
mod sinks;
mod source;

pub use delivery::{
    DEFAULT_SHUTDOWN_DEADLINE, Delivery, DeliveryConfig, DeliveryStats, SendError, Transport,
};
pub use files::{
    DEFAULT_FILE_INTERVAL, DEFAULT_MAX_FILES, PprofFileConfig, PprofFileExporter, write_one,
};
pub use http_debug::{
    DEBUG_PROFILE_PATH, DebugEndpointStats, MAX_CONCURRENT_WINDOWS, debug_endpoint_stats,
    debug_router,
};
pub use otlp::{OtlpProfilesConfig, OtlpProfilesExporter, OtlpProtocol};
pub use pyroscope::{PyroscopeAuth, PyroscopeConfig, PyroscopeExporter};

pub use error::ExportError;
pub use http::{USER_AGENT, read_ca_certificates, redact_url};
pub(crate) use http::{
    classify, http_client, join_path, parse_ca_certificates, pem_summary, validate_url,
};
pub(crate) use sinks::Exporter;
pub use sinks::Sinks;
pub use source::ProfileSource;

/// The service name: `OTEL_SERVICE_NAME`, else the executable's file name.
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
