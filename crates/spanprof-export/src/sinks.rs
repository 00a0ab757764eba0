//! The interval thread each sink runs (take the interval's profile, encode it, hand
//! it to its delivery) and [`Sinks`], which shuts several down within one deadline.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use spanprof_core::Profile;

#[cfg(feature = "otlp")]
use crate::OtlpProfilesExporter;
#[cfg(feature = "pyroscope")]
use crate::PyroscopeExporter;
use crate::delivery::Stopped;
use crate::{Delivery, DeliveryStats, PprofFileExporter, ProfileSource};

/// The state of an interval thread.
#[derive(Default)]
struct IntervalState {
    /// Shutdown asked for the last interval.
    stop: bool,
    /// The thread has queued its last interval and ended.
    done: bool,
    /// Shutdown gave up waiting for the last interval: it must not be queued.
    abandoned: bool,
}

/// The interval loop shared by the network sinks: every interval, take a profile,
/// encode it and queue it for delivery (never blocking on the network).
pub(crate) struct Exporter {
    name: &'static str,
    state: Arc<(Mutex<IntervalState>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    delivery: Delivery,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("sink", &self.name)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Exporter {
    pub(crate) fn start(
        name: &'static str,
        interval: Duration,
        mut source: ProfileSource,
        delivery: Delivery,
        mut encode: impl FnMut(&Profile) -> Option<Vec<u8>> + Send + 'static,
    ) -> Exporter {
        let state: Arc<(Mutex<IntervalState>, Condvar)> = Arc::default();
        let thread = {
            let state = state.clone();
            let queue = delivery.shared();
            std::thread::Builder::new()
                .name(format!("spanprof-{name}-interval"))
                .spawn(move || {
                    let (lock, cv) = &*state;
                    loop {
                        let stopped = {
                            let g = lock.lock().unwrap_or_else(|e| e.into_inner());
                            let (g, _) = cv
                                .wait_timeout_while(g, interval, |s| !s.stop)
                                .unwrap_or_else(|e| e.into_inner());
                            g.stop
                        };
                        // The last interval is taken at shutdown too. A panic in the
                        // source or the encoder costs this interval, not the sink.
                        let payload =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                encode(&source.next())
                            }));
                        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
                        match payload {
                            Ok(Some(p)) if !g.abandoned => {
                                queue.enqueue(p, 1);
                            }
                            Ok(_) => {}
                            Err(panic) => queue.lost_to_panic("taking a profile", &*panic, 1),
                        }
                        if stopped {
                            g.done = true;
                            cv.notify_all();
                            return;
                        }
                    }
                })
                .expect("spawn an exporter thread")
        };
        Exporter {
            name,
            state,
            thread: Some(thread),
            delivery,
        }
    }

    pub(crate) fn stats(&self) -> DeliveryStats {
        self.delivery.stats()
    }

    pub(crate) fn shutdown(self, deadline: Duration) -> DeliveryStats {
        Sinks(vec![Sink::Network(self)]).shutdown(deadline)[0].1
    }

    /// Asks the interval thread for its last interval.
    fn stop_interval(&self) {
        let (lock, cv) = &*self.state;
        lock.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        cv.notify_all();
    }

    /// Waits for the last interval until `end`; past it, that interval is dropped
    /// and counted (`dropped_shutdown`) and the thread is left to end by itself.
    fn wait_interval(&mut self, end: Instant) {
        let (lock, cv) = &*self.state;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        while !g.done {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                g.abandoned = true;
                self.delivery.shared().count_dropped_shutdown();
                self.thread = None;
                return;
            }
            g = cv
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if self.thread.is_some() {
            // Stop at once: what is queued is dropped and counted; the stop is
            // logged, saying that the handle was dropped.
            let end = Instant::now();
            self.stop_interval();
            self.wait_interval(end);
            self.delivery.begin_close(end);
            self.delivery.finish_close_as(Stopped::Dropped);
        }
    }
}

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
