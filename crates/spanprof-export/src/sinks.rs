//! [`Sinks`]: the sinks of a service, shut down together within one deadline.

use std::time::{Duration, Instant};

#[cfg(feature = "otlp")]
use crate::OtlpProfilesExporter;
#[cfg(feature = "pyroscope")]
use crate::PyroscopeExporter;
use crate::interval::Exporter;
use crate::{DeliveryStats, PprofFileExporter};

/// The sinks of a service, stopped together: [`Sinks::shutdown`] stops them all at
/// once, sharing one deadline, so that two sinks whose servers hang take the
/// deadline, not twice it.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use spanprof_export::{OtlpProfilesConfig, OtlpProfilesExporter, ProfileSource};
/// use spanprof_export::{PprofFileConfig, PprofFileExporter};
/// use spanprof_export::{PyroscopeConfig, PyroscopeExporter, Sinks};
/// let profiler = spanprof_core::Profiler::builder().start()?;
/// let mut sinks = Sinks::new();
/// sinks.push(PprofFileExporter::start(
///     PprofFileConfig::new("/var/tmp/profiles"),
///     ProfileSource::profiler(&profiler),
/// )?);
/// if let Some(cfg) = PyroscopeConfig::from_env()? {
///     sinks.push(PyroscopeExporter::start(cfg, ProfileSource::profiler(&profiler))?);
/// }
/// if let Some(cfg) = OtlpProfilesConfig::from_env()? {
///     sinks.push(OtlpProfilesExporter::start(cfg, ProfileSource::profiler(&profiler))?);
/// }
/// // … serve …
/// for (sink, stats) in sinks.shutdown(spanprof_export::DEFAULT_SHUTDOWN_DEADLINE) {
///     println!("{sink}: {stats:?}");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
#[must_use = "sinks stop when dropped: keep them alive as long as the service runs"]
pub struct Sinks(Vec<Sink>);

/// One sink of [`Sinks`].
#[derive(Debug)]
enum Sink {
    /// A network sink: an interval thread and a delivery.
    Network(Exporter),
    /// Periodic pprof files.
    Files(PprofFileExporter),
}

impl Sink {
    fn name(&self) -> &'static str {
        match self {
            Sink::Network(e) => e.name,
            Sink::Files(_) => "pprof-files",
        }
    }

    fn stats(&self) -> DeliveryStats {
        match self {
            Sink::Network(e) => e.stats(),
            Sink::Files(f) => f.stats(),
        }
    }
}

impl Sinks {
    /// No sinks.
    pub fn new() -> Self {
        Sinks(Vec::new())
    }

    /// Adds a sink (a [`PyroscopeExporter`], an [`OtlpProfilesExporter`], a
    /// [`PprofFileExporter`], or other `Sinks`).
    pub fn push(&mut self, sink: impl Into<Sinks>) -> &mut Self {
        self.0.extend(sink.into().0);
        self
    }

    /// How many sinks.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each sink's name (`pyroscope`, `otlp-profiles`, `pprof-files`) and counters.
    pub fn stats(&self) -> Vec<(&'static str, DeliveryStats)> {
        self.0.iter().map(|e| (e.name(), e.stats())).collect()
    }

    /// Stops every sink at once: each takes its last interval and flushes its queue
    /// until it is empty or `deadline` has passed; a send still under way then is
    /// cut, and what is left is dropped and counted (`dropped_shutdown`). Returns
    /// within `deadline` (plus the time to stop the threads), whatever the servers
    /// do, with each sink's name and counters (also logged).
    pub fn shutdown(mut self, deadline: Duration) -> Vec<(&'static str, DeliveryStats)> {
        let end = Instant::now() + deadline;
        for s in &self.0 {
            match s {
                Sink::Network(e) => e.stop_interval(),
                Sink::Files(f) => f.stop_interval(),
            }
        }
        let mut files = Vec::new();
        for (i, s) in self.0.iter_mut().enumerate() {
            match s {
                Sink::Network(e) => e.wait_interval(end),
                Sink::Files(f) => files.push((i, f.wait_interval(end))),
            }
        }
        // Every sender flushes on its own thread: all at once, one deadline.
        for s in &self.0 {
            if let Sink::Network(e) = s {
                e.delivery.begin_close(end);
            }
        }
        self.0
            .into_iter()
            .enumerate()
            .map(|(i, s)| match s {
                Sink::Network(mut e) => (e.name, e.delivery.finish_close()),
                Sink::Files(f) => {
                    let stats = files
                        .iter()
                        .find(|(at, _)| *at == i)
                        .map_or_else(|| f.stats(), |(_, stats)| *stats);
                    // Stopped (its thread joined or left): dropping it logs nothing.
                    f.log_stop(&stats, false);
                    ("pprof-files", stats)
                }
            })
            .collect()
    }
}

impl From<PprofFileExporter> for Sinks {
    fn from(f: PprofFileExporter) -> Self {
        Sinks(vec![Sink::Files(f)])
    }
}

#[cfg(feature = "pyroscope")]
impl From<PyroscopeExporter> for Sinks {
    fn from(e: PyroscopeExporter) -> Self {
        Sinks(vec![Sink::Network(e.into_exporter())])
    }
}

#[cfg(feature = "otlp")]
impl From<OtlpProfilesExporter> for Sinks {
    fn from(e: OtlpProfilesExporter) -> Self {
        Sinks(vec![Sink::Network(e.into_exporter())])
    }
}
