//! OTLP profiles (`profiles/v1development`, **experimental**: the signal is alpha and
//! its schema still changes). Each sample's `link_index` points at a
//! `Link{trace_id, span_id}` of the span whose labels it carries, so a backend can go
//! from a sample to its trace. HTTP (`POST /v1development/profiles`,
//! `application/x-protobuf`) and gRPC (`ProfilesService/Export`), with
//! `opentelemetry-proto`'s generated types (`opentelemetry-otlp` has no profiles
//! exporter).

mod config;
mod encoding;
mod transport;

use std::time::Duration;

use prost::Message;

pub use config::{DEFAULT_INTERVAL, HTTP_PATH, OtlpProfilesConfig, OtlpProtocol};
pub(crate) use config::{OtlpTarget, Signal, check_header};
use encoding::export_request;
use transport::EXPORT_PATH;
pub(crate) use transport::start_delivery;

use crate::delivery::DeliveryStats;
use crate::{ExportError, Exporter, ProfileSource};

/// Exports a labelled CPU profile as OTLP profiles every interval. Experimental.
/// Dropping it stops it at once (logged); [`OtlpProfilesExporter::shutdown`] sends
/// the last interval first.
#[derive(Debug)]
#[must_use = "the exporter stops when dropped: keep it (or the Sinks holding it) alive as long as the service runs"]
pub struct OtlpProfilesExporter {
    exporter: Exporter,
}

impl OtlpProfilesExporter {
    /// Starts exporting the profiles of `source`.
    pub fn start(cfg: OtlpProfilesConfig, source: ProfileSource) -> Result<Self, ExportError> {
        cfg.validate()?;
        let delivery = start_delivery(
            ("otlp-profiles", "profiles"),
            &cfg.endpoint,
            cfg.protocol,
            &cfg.headers,
            &cfg.delivery,
            cfg.ca_certificates_pem.as_deref(),
            EXPORT_PATH,
        )?;
        tracing::info!(
            "spanprof: sending profiles: {cfg}, every {:?}",
            cfg.interval
        );
        let service =
            crate::SinkServiceName::new("otlp-profiles", "service.name", &cfg.service_name);
        let exporter = Exporter::start("otlp-profiles", cfg.interval, source, delivery, move |p| {
            (!p.samples.is_empty()).then(|| export_request(p, &service.current()).encode_to_vec())
        });
        Ok(OtlpProfilesExporter { exporter })
    }

    /// Delivery counters.
    pub fn stats(&self) -> DeliveryStats {
        self.exporter.stats()
    }

    /// Exports what was collected since the last export, then flushes the queue
    /// until it is empty or `deadline` has passed (an export still under way then is
    /// cut; what is left is counted in `dropped_shutdown`), and stops. Returns within
    /// `deadline`. To stop several sinks with one deadline, use [`crate::Sinks`].
    pub fn shutdown(self, deadline: Duration) -> DeliveryStats {
        self.exporter.shutdown(deadline)
    }

    pub(crate) fn into_exporter(self) -> Exporter {
        self.exporter
    }
}
