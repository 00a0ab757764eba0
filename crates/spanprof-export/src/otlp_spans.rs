//! [`OtlpSpanExporter`]: spans over OTLP (gRPC `TraceService/Export`, or HTTP `POST
//! /v1/traces`) through the same delivery as the profile sinks, so a span survives a
//! collector outage as a profile does.
//!
//! The SDK's `BatchSpanProcessor` hands a batch to its exporter and forgets it, and
//! `opentelemetry-otlp`'s retries stop after seconds: a collector down for 30 s lost
//! a third of the spans of that time while their profiles, queued by spanprof's
//! delivery, arrived. Here each batch is encoded once, as the OTLP exporter would, and
//! queued as bytes: sent in order by a thread of its own, retried with backoff and
//! jitter on what the OTLP specification calls retryable (connection errors,
//! timeouts, gRPC `UNAVAILABLE` and the like, HTTP 429, 502, 503, 504), dropped only
//! past the queue's bound in bytes (the oldest first, counted and logged) or at the
//! shutdown deadline. While the collector answers, `export` waits for its batch's
//! send as any exporter does (so the provider's `force_flush` means sent); once a
//! send has failed, it returns as soon as the batch is queued: a collector that is
//! down or hangs holds the batch processor (whose own queue would then fill and
//! drop) for one request's timeout at most.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use prost::Message;

use crate::delivery::{Delivery, DeliveryConfig, DeliveryStats};
use crate::otlp::{OtlpProtocol, OtlpTarget, Signal, start_delivery};
use crate::{DEFAULT_SHUTDOWN_DEADLINE, ExportError};

/// The HTTP path of the traces signal.
pub(crate) const TRACES_HTTP_PATH: &str = "/v1/traces";
/// The gRPC method spans are exported with.
const TRACES_GRPC_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// Default bound of the spans queued, in bytes of their encoded batches: 64 MiB,
/// about ten minutes of a service ending 200 spans a second (a span of a dozen
/// attributes encodes to about 500 bytes).
pub const DEFAULT_SPAN_QUEUE_BYTES: usize = 64 << 20;
/// Default number of batches queued (the SDK sends up to 512 spans a batch).
pub const DEFAULT_SPAN_QUEUE_BATCHES: usize = 4096;

/// Configuration of [`OtlpSpanExporter`]. `Debug` never shows secrets (the
/// endpoint's credentials and query, header values, the CA bytes).
#[derive(Clone)]
#[non_exhaustive]
pub struct OtlpSpansConfig {
    /// For HTTP, the full URL spans are posted to; for gRPC, the server address.
    pub endpoint: String,
    /// Transport.
    pub protocol: OtlpProtocol,
    /// Headers (gRPC: metadata) sent with every export.
    pub headers: Vec<(String, String)>,
    /// Delivery: the queue's bounds (by default [`DEFAULT_SPAN_QUEUE_BYTES`] and
    /// [`DEFAULT_SPAN_QUEUE_BATCHES`]), backoff, request timeout.
    pub delivery: DeliveryConfig,
    /// PEM certificates trusted for `https://` endpoints besides the public roots.
    pub ca_certificates_pem: Option<Vec<u8>>,
    /// How long the exporter's shutdown may flush what is queued when the batch
    /// processor stops it without a deadline of its own (the SDK's does). Defaults
    /// to [`DEFAULT_SHUTDOWN_DEADLINE`]; [`SpanDeliveryHandle::shutdown_by`] moves it.
    pub shutdown_deadline: Duration,
}

impl std::fmt::Debug for OtlpSpansConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<String> = self
            .headers
            .iter()
            .map(|(k, _)| format!("{k}: ***"))
            .collect();
        f.debug_struct("OtlpSpansConfig")
            .field("endpoint", &crate::redact_url(&self.endpoint))
            .field("protocol", &self.protocol)
            .field("headers", &headers)
            .field("delivery", &self.delivery)
            .field("shutdown_deadline", &self.shutdown_deadline)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Display for OtlpSpansConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "OTLP spans ({}) to {}",
            self.protocol,
            crate::redact_url(&self.endpoint)
        )
    }
}

impl OtlpSpansConfig {
    /// Spans to `endpoint` over `protocol`, with the defaults.
    pub fn new(endpoint: impl Into<String>, protocol: OtlpProtocol) -> Self {
        OtlpSpansConfig {
            endpoint: endpoint.into(),
            protocol,
            headers: Vec::new(),
            delivery: DeliveryConfig {
                queue_capacity: DEFAULT_SPAN_QUEUE_BATCHES,
                max_queue_bytes: DEFAULT_SPAN_QUEUE_BYTES,
                ..DeliveryConfig::default()
            },
            ca_certificates_pem: None,
            shutdown_deadline: DEFAULT_SHUTDOWN_DEADLINE,
        }
    }

    /// From the OpenTelemetry exporter variables, each `OTEL_EXPORTER_OTLP_TRACES_*`
    /// taking precedence over its `OTEL_EXPORTER_OTLP_*` counterpart: `…_ENDPOINT`
    /// (the general one is a base to which HTTP appends `/v1/traces`; `Ok(None)`
    /// when neither is set), `…_PROTOCOL` (`http/protobuf`, the default, or
    /// `grpc`), `…_HEADERS`, `…_TIMEOUT` (milliseconds per export) and
    /// `…_CERTIFICATE`. Errors name the variable.
    pub fn from_env() -> Result<Option<Self>, ExportError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`OtlpSpansConfig::from_env`], reading variables through `var`.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, ExportError> {
        let Some(target) = OtlpTarget::from_lookup(&var, Signal::Traces, TRACES_HTTP_PATH)? else {
            return Ok(None);
        };
        let mut cfg = OtlpSpansConfig::new(target.endpoint, target.protocol);
        cfg.headers = target.headers;
        if let Some(t) = target.request_timeout {
            cfg.delivery.request_timeout = t;
        }
        cfg.ca_certificates_pem = target.ca_certificates_pem;
        Ok(Some(cfg))
    }

    /// Sets the queue's bound in bytes of encoded spans. Defaults to
    /// [`DEFAULT_SPAN_QUEUE_BYTES`].
    pub fn max_queue_bytes(mut self, bytes: usize) -> Self {
        self.delivery.max_queue_bytes = bytes;
        self
    }

    /// Sets how long shutdown may flush the queue when the batch processor gives no
    /// deadline. Defaults to [`DEFAULT_SHUTDOWN_DEADLINE`].
    pub fn shutdown_deadline(mut self, deadline: Duration) -> Self {
        self.shutdown_deadline = deadline;
        self
    }

    fn validate(&self) -> Result<(), ExportError> {
        crate::http::validate_url("endpoint", &self.endpoint)?;
        for (k, v) in &self.headers {
            crate::otlp::check_header("headers", k, v)?;
        }
        self.delivery.validate()
    }
}

/// What an [`OtlpSpanExporter`] shares with the service that made it, after the
/// batch processor owns the exporter: its counters (in spans), and the deadline of
/// its flush at shutdown.
#[derive(Clone, Debug)]
pub struct SpanDeliveryHandle(Arc<HandleState>);

struct HandleState {
    delivery: Mutex<Option<Delivery>>,
    /// The delivery's counters, readable while it stops and after.
    counters: Arc<crate::delivery::Shared>,
    /// The flush's deadline set by [`SpanDeliveryHandle::shutdown_by`], if any.
    deadline: Mutex<Option<Instant>>,
    shutdown_deadline: Duration,
}

impl std::fmt::Debug for HandleState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanDelivery")
            .field("stats", &self.counters.stats())
            .finish_non_exhaustive()
    }
}

impl SpanDeliveryHandle {
    /// The counters, in spans: queued, sent, retried, dropped (by reason), pending.
    pub fn stats(&self) -> DeliveryStats {
        self.0.counters.stats()
    }

    /// Sets the deadline of the flush at the exporter's shutdown (what is queued is
    /// sent until then, the rest dropped and counted): the service's one shutdown
    /// deadline, shared with the profile sinks and the request drain.
    pub fn shutdown_by(&self, deadline: Instant) {
        *lock(&self.0.deadline) = Some(deadline);
    }

    /// Stops the delivery: flushes until the deadline, returns the counters.
    fn stop(&self, timeout: Option<Duration>) -> DeliveryStats {
        let Some(delivery) = lock(&self.0.delivery).take() else {
            return self.stats();
        };
        let now = Instant::now();
        let end = lock(&self.0.deadline)
            .unwrap_or(now + self.0.shutdown_deadline)
            .min(now + timeout.unwrap_or(Duration::MAX / 4));
        delivery.shutdown(end.saturating_duration_since(now))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A `SpanExporter` for OTLP whose spans ride out a collector outage: each batch is
/// encoded and queued, sent by a thread of its own with retries (see the module's
/// doc), and `export` never waits for the network. Put it behind the SDK's batch
/// processor (or spanprof's `SpanProfileProcessor::batch`), and stop it through the
/// tracer provider's shutdown.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use spanprof_export::{OtlpSpanExporter, OtlpSpansConfig};
/// if let Some(cfg) = OtlpSpansConfig::from_env()? { // OTEL_EXPORTER_OTLP_ENDPOINT
///     let exporter = OtlpSpanExporter::start(cfg)?;
///     let spans = exporter.handle(); // counters, and the shutdown deadline
///     let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
///         .with_batch_exporter(exporter)
///         .build();
///     // … serve …
///     spans.shutdown_by(std::time::Instant::now() + std::time::Duration::from_secs(5));
///     provider.shutdown()?;
///     println!("{} spans sent, {} dropped", spans.stats().sent, spans.stats().dropped());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct OtlpSpanExporter {
    handle: SpanDeliveryHandle,
    resource: ResourceAttributesWithSchema,
    /// How long `export` waits for a healthy send: one request's timeout, and a
    /// little more.
    wait_for_send: Duration,
}

impl OtlpSpanExporter {
    /// Starts the exporter's delivery (a thread); errors name the configuration's
    /// field.
    pub fn start(cfg: OtlpSpansConfig) -> Result<Self, ExportError> {
        cfg.validate()?;
        let delivery = start_delivery(
            ("otlp-spans", "spans"),
            &cfg.endpoint,
            cfg.protocol,
            &cfg.headers,
            &cfg.delivery,
            cfg.ca_certificates_pem.as_deref(),
            TRACES_GRPC_PATH,
        )?;
        tracing::info!(
            "spanprof: sending spans: {cfg}, queued up to {} MiB while the collector is away",
            cfg.delivery.max_queue_bytes >> 20
        );
        Ok(OtlpSpanExporter {
            handle: SpanDeliveryHandle(Arc::new(HandleState {
                counters: delivery.shared(),
                delivery: Mutex::new(Some(delivery)),
                deadline: Mutex::new(None),
                shutdown_deadline: cfg.shutdown_deadline,
            })),
            resource: ResourceAttributesWithSchema::from(&Resource::builder_empty().build()),
            wait_for_send: cfg.delivery.request_timeout + Duration::from_secs(1),
        })
    }

    /// The handle on its counters and shutdown deadline, which stays with the
    /// service when the batch processor takes the exporter.
    pub fn handle(&self) -> SpanDeliveryHandle {
        self.handle.clone()
    }
}

/// The encoded export request of `batch`: what `opentelemetry-otlp` sends.
fn encode(batch: Vec<SpanData>, resource: &ResourceAttributesWithSchema) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: group_spans_by_resource_and_scope(batch, resource),
    }
    .encode_to_vec()
}

impl SpanExporter for OtlpSpanExporter {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let spans = batch.len() as u64;
        let result = if spans == 0 {
            Ok(())
        } else {
            let payload = encode(batch, &self.resource);
            let delivery = &self.handle.0.counters;
            // Queued (or, past the bound, the oldest dropped and counted): the
            // delivery answers for it from here. While the collector answers, the
            // batch processor waits for the send, as with any exporter (so its
            // `force_flush` means sent); while it does not, it goes on at once.
            match delivery.enqueue_seq(payload, spans) {
                Some(seq) => {
                    if !delivery.failing() {
                        delivery.wait_first_try(seq, self.wait_for_send);
                    }
                    Ok(())
                }
                None => Err(OTelSdkError::AlreadyShutdown),
            }
        };
        std::future::ready(result)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let stats = self.handle.stop(Some(timeout));
        if stats.dropped_shutdown > 0 {
            return Err(OTelSdkError::Timeout(timeout));
        }
        Ok(())
    }

    fn shutdown(&self) -> OTelSdkResult {
        let stats = self.handle.stop(None);
        if stats.dropped_shutdown > 0 {
            return Err(OTelSdkError::InternalFailure(format!(
                "{} spans still queued at the shutdown deadline were dropped",
                stats.dropped_shutdown
            )));
        }
        Ok(())
    }

    fn force_flush(&self) -> OTelSdkResult {
        // Waits (at most the shutdown deadline) for what is queued to be sent.
        let end = Instant::now() + self.handle.0.shutdown_deadline;
        while self.handle.stats().pending > 0 {
            if Instant::now() >= end {
                return Err(OTelSdkError::Timeout(self.handle.0.shutdown_deadline));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = ResourceAttributesWithSchema::from(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_variables_come_first_and_http_appends_the_path() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let cfg = OtlpSpansConfig::from_lookup(vars(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://collector:4318",
        )]))
        .unwrap()
        .unwrap();
        assert_eq!(cfg.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(cfg.protocol, OtlpProtocol::HttpProtobuf);
        let cfg = OtlpSpansConfig::from_lookup(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(cfg.endpoint, "http://traces:4317");
        assert_eq!(cfg.protocol, OtlpProtocol::Grpc);
        assert_eq!(cfg.delivery.request_timeout, Duration::from_millis(2500));
        assert_eq!(cfg.delivery.max_queue_bytes, DEFAULT_SPAN_QUEUE_BYTES);
        let err = OtlpSpansConfig::from_lookup(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift"),
        ]))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
            "{err}"
        );
        assert!(OtlpSpansConfig::from_lookup(vars(&[])).unwrap().is_none());
    }
}
