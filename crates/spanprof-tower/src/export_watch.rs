//! [`SpanExportWatch`]: what becomes of the spans sent to an exporter — how many
//! ended, were exported, failed — and an export outage logged once as it begins and
//! once as it ends, so that a collector that is down is seen, and a shutdown says
//! "flushed" only when every span was.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfig, BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor,
};

/// At most one outage is logged (as it begins and ends) in this time.
const OUTAGE_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Counts and logs what becomes of the spans a batch processor sends to an exporter:
/// the spans ended, exported and in failed exports (so, after the provider's
/// shutdown, how many never arrived: failed, dropped by the batch queue when full,
/// or left at the deadline), and an export outage at warn, once as it begins (with
/// the exporter's error) and once as it ends (how long, how many spans failed),
/// at most one outage a minute. The SDK's batch processor logs neither.
///
/// ```
/// use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
/// use spanprof_tower::{SpanExportWatch, SpanProfileProcessor};
///
/// let watch = SpanExportWatch::new();
/// let exporter = InMemorySpanExporter::default(); // your OTLP exporter
/// let provider = SdkTracerProvider::builder()
///     .with_span_processor(SpanProfileProcessor::new(watch.batch(exporter)))
///     .build();
/// // … serve …
/// let flushed = provider.shutdown().is_ok() && watch.stats().lost() == 0;
/// # assert!(flushed);
/// ```
#[derive(Clone, Debug, Default)]
pub struct SpanExportWatch(Arc<WatchState>);

#[derive(Debug, Default)]
struct WatchState {
    ended: AtomicU64,
    exported: AtomicU64,
    failed: AtomicU64,
    outage: Mutex<OutageLog>,
}

#[derive(Debug, Default)]
struct OutageLog {
    /// Since when exports fail, the spans failed before, and whether it was logged.
    current: Option<(Instant, u64, bool)>,
    last_logged: Option<Instant>,
}

/// What became of the spans a [`SpanExportWatch`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpanExportStats {
    /// Spans ended (handed to the batch processor).
    pub ended: u64,
    /// Spans in exports that succeeded.
    pub exported: u64,
    /// Spans in exports that failed.
    pub failed: u64,
}

impl SpanExportStats {
    /// Spans ended but not exported: failed, dropped by the batch queue, or not yet
    /// exported (after the provider's shutdown: never).
    pub fn lost(&self) -> u64 {
        self.ended.saturating_sub(self.exported)
    }
}

impl SpanExportWatch {
    /// A watch with nothing counted.
    pub fn new() -> Self {
        SpanExportWatch::default()
    }

    /// The SDK's [`BatchSpanProcessor`] (its default [`BatchConfig`], which reads the
    /// `OTEL_BSP_*` variables) in front of `exporter`, watched.
    pub fn batch<E: SpanExporter + 'static>(&self, exporter: E) -> WatchedBatch {
        self.batch_with_config(exporter, BatchConfig::default())
    }

    /// [`SpanExportWatch::batch`] with the batch processor's settings.
    pub fn batch_with_config<E: SpanExporter + 'static>(
        &self,
        exporter: E,
        config: BatchConfig,
    ) -> WatchedBatch {
        WatchedBatch {
            watch: self.clone(),
            next: BatchSpanProcessor::builder(WatchedExporter {
                watch: self.clone(),
                next: exporter,
            })
            .with_batch_config(config)
            .build(),
        }
    }

    /// The counts so far.
    pub fn stats(&self) -> SpanExportStats {
        SpanExportStats {
            ended: self.0.ended.load(Ordering::Relaxed),
            exported: self.0.exported.load(Ordering::Relaxed),
            failed: self.0.failed.load(Ordering::Relaxed),
        }
    }

    fn exported(&self, spans: u64, result: &OTelSdkResult) {
        let state = &*self.0;
        let mut log = state.outage.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match result {
            Ok(()) => {
                state.exported.fetch_add(spans, Ordering::Relaxed);
                if let Some((since, failed_before, logged)) = log.current.take() {
                    let failed = state.failed.load(Ordering::Relaxed) - failed_before;
                    let lasted = now.duration_since(since).as_secs_f64();
                    if logged {
                        tracing::warn!(
                            failed,
                            "spanprof: span export recovered after {lasted:.1} s; {failed} spans failed to export meanwhile"
                        );
                    } else {
                        tracing::debug!(
                            failed,
                            "spanprof: span export recovered after {lasted:.1} s"
                        );
                    }
                }
            }
            Err(e) => {
                let failed_before = state.failed.fetch_add(spans, Ordering::Relaxed);
                if log.current.is_none() {
                    let logged = log
                        .last_logged
                        .is_none_or(|t| now.duration_since(t) >= OUTAGE_LOG_INTERVAL);
                    if logged {
                        log.last_logged = Some(now);
                        tracing::warn!(
                            error = %e,
                            "spanprof: span export is failing ({e}): spans of failed exports are lost; logged again \
                             when it recovers"
                        );
                    } else {
                        tracing::debug!(error = %e, "spanprof: span export is failing again");
                    }
                    log.current = Some((now, failed_before, logged));
                }
            }
        }
    }
}

/// The SDK's batch processor in front of a watched exporter, counting the spans that
/// end. Made by [`SpanExportWatch::batch`].
#[derive(Debug)]
pub struct WatchedBatch {
    watch: SpanExportWatch,
    next: BatchSpanProcessor,
}

impl SpanProcessor for WatchedBatch {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.next.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        self.watch.0.ended.fetch_add(1, Ordering::Relaxed);
        self.next.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.next.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.next.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.next.set_resource(resource);
    }
}

/// An exporter whose results a [`SpanExportWatch`] counts.
#[derive(Debug)]
struct WatchedExporter<E> {
    watch: SpanExportWatch,
    next: E,
}

impl<E: SpanExporter> SpanExporter for WatchedExporter<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let spans = batch.len() as u64;
        let export = self.next.export(batch);
        let watch = self.watch.clone();
        async move {
            let result = export.await;
            watch.exported(spans, &result);
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.next.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> OTelSdkResult {
        self.next.shutdown()
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.next.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.next.set_resource(resource);
    }
}
