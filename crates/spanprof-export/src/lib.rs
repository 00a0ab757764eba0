#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
// The interval thread that feeds a delivery (`interval::Exporter`) only has users in the
// HTTP sinks; without them it is compiled, unused, so `Sinks` keeps one shape.
#![cfg_attr(not(any(feature = "pyroscope", feature = "otlp")), allow(dead_code))]

pub mod delivery;
mod error;
mod files;
mod http;
mod interval;
#[cfg(feature = "otlp")]
pub mod otlp;
#[cfg(feature = "otlp")]
mod otlp_spans;
#[cfg(feature = "pyroscope")]
pub mod pyroscope;
mod retry;
mod sinks;
mod source;

pub use delivery::{
    DEFAULT_SHUTDOWN_DEADLINE, Delivery, DeliveryConfig, DeliveryStats, RejectStatus, SendError,
    Transport,
};
pub use files::{DEFAULT_FILE_INTERVAL, DEFAULT_MAX_FILES, PprofFileConfig, PprofFileExporter};
#[cfg(feature = "otlp")]
pub use otlp::{OtlpProfilesConfig, OtlpProfilesExporter, OtlpProtocol};
#[cfg(feature = "otlp")]
pub use otlp_spans::{
    DEFAULT_SPAN_QUEUE_BATCHES, DEFAULT_SPAN_QUEUE_BYTES, OtlpSpanExporter, OtlpSpansConfig,
    SpanDeliveryHandle,
};
#[cfg(feature = "pyroscope")]
pub use pyroscope::{PyroscopeAuth, PyroscopeConfig, PyroscopeExporter};

pub use error::ExportError;
#[cfg(any(feature = "pyroscope", feature = "otlp"))]
pub use http::read_ca_certificates;
pub use http::redact_url;
#[cfg(any(feature = "pyroscope", feature = "otlp"))]
pub(crate) use interval::Exporter;
pub use sinks::Sinks;
pub use source::ProfileSource;

/// The service name a sink's configuration starts with: the tracer provider's
/// `Resource`'s `service.name` (recorded by `SpanProfileProcessor`), else the
/// environment's (`OTEL_SERVICE_NAME`, else `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES`, read through `var`), else the executable's file name.
#[cfg(any(feature = "pyroscope", feature = "otlp"))]
pub(crate) fn default_service_name(var: impl Fn(&str) -> Option<String>) -> String {
    if let Some(name) = spanprof_core::resource_service_name() {
        return name.to_string();
    }
    spanprof_core::env_service_name(var)
        .or_else(|| {
            std::env::current_exe()
                .ok()?
                .file_name()?
                .to_str()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown_service".to_owned())
}

/// The service name a sink files each interval's profile under: its configured
/// one; when that is the default and no tracer provider had been built yet at the
/// sink's start, the provider's `Resource`'s once there is one (sinks are often
/// started before tracing). A configured name other than the `Resource`'s is
/// reported once: Grafana's traces-to-profiles would find nothing.
#[cfg(any(feature = "pyroscope", feature = "otlp"))]
pub(crate) struct SinkServiceName {
    configured: String,
    follow_resource: bool,
}

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
impl SinkServiceName {
    pub(crate) fn new(sink: &str, field: &str, configured: &str) -> Self {
        let follow_resource = match spanprof_core::resource_service_name() {
            Some(resource) => {
                if *resource != *configured {
                    tracing::warn!(
                        "spanprof: the {sink} sink files profiles as {field}={configured} but the traces carry \
                         service.name={resource} (the tracer provider's Resource), so Grafana's traces-to-profiles \
                         finds none of them: leave the sink's service_name at its default (the Resource's) or make \
                         the two the same"
                    );
                }
                false
            }
            None => configured == default_service_name(|k| std::env::var(k).ok()),
        };
        SinkServiceName {
            configured: configured.to_owned(),
            follow_resource,
        }
    }

    pub(crate) fn current(&self) -> std::borrow::Cow<'_, str> {
        match spanprof_core::resource_service_name().filter(|_| self.follow_resource) {
            Some(name) => std::borrow::Cow::Owned(name.to_string()),
            None => std::borrow::Cow::Borrowed(&self.configured),
        }
    }
}
