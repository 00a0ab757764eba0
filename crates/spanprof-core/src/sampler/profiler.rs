//! The running [`Profiler`]: starting and stopping it, and what it reports.

use std::fmt;
#[cfg(spanprof_sampler)]
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::cache::CacheStats;
use crate::collector::Collector;
use crate::intern::InternStats;
use crate::store::SpanProfileStore;
#[cfg(spanprof_sampler)]
use crate::sys;

use super::*;

#[cfg(spanprof_sampler)]
pub(super) fn start_platform(cfg: ProfilerBuilder) -> Result<Arc<ProfilerInner>, ProfilerError> {
    // Perf events only pay off well above the baseline; below twice the baseline the
    // timer re-armed at the high period does the job (and lost-signal detection,
    // which expects several perf samples per baseline tick, stays exact).
    let perf_keeper = if cfg.use_perf_events && cfg.high_hz >= 2 * cfg.baseline_hz {
        match sys::probe_perf_events() {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "spanprof: perf events refused; the high rate falls back to the CPU timer (at most about {TIMER_MAX_HZ} Hz)"
                );
                None
            }
        }
    } else {
        None
    };
    let perf_ok = perf_keeper.is_some();
    let mechanism = if perf_ok {
        Mechanism::PerfEvent
    } else {
        Mechanism::Timer
    };
    let max_high_hz = if perf_ok { MAX_HIGH_HZ } else { TIMER_MAX_HZ };
    let effective_high_hz = cfg.high_hz.min(max_high_hz);

    let store = SpanProfileStore::new(
        cfg.store.clone(),
        1_000_000_000 / u64::from(cfg.baseline_hz),
    );
    let frame_pointers = sys::frame_pointers_present();
    sys::refresh_unwind_modules(false);
    let unwinding = sys::set_unwinding(cfg.unwinding);
    crate::setup::profiler_started(format!(
        "spanprof: profiler started: {} Hz baseline, {effective_high_hz} Hz for hot requests via {}{}, {}, stacks unwound by {}",
        cfg.baseline_hz,
        mechanism.as_str(),
        if effective_high_hz < cfg.high_hz {
            format!(" ({} Hz asked, at most {max_high_hz} with it)", cfg.high_hz)
        } else {
            String::new()
        },
        if cfg.wall_hz == 0 {
            "no wall-clock samples".to_owned()
        } else {
            format!("{} Hz wall-clock inside hot polls", cfg.wall_hz)
        },
        match unwinding {
            Unwinding::DwarfCfi => "DWARF call-frame information",
            Unwinding::FramePointers => "frame pointers",
        },
    ));
    crate::setup::check_build(frame_pointers, unwinding);
    let caps = Capabilities {
        sampling: Sampling::InProcess,
        mechanism,
        unwinding,
        frame_pointers,
        baseline_hz: cfg.baseline_hz,
        high_hz: cfg.high_hz,
        effective_high_hz,
        max_high_hz,
        wall_hz: cfg.wall_hz,
    };
    if let Some((lo, hi)) = crate::symbolize::executable_text() {
        sys::set_frame_pointer_text(lo as usize, hi as usize);
    }
    sys::install_handler()?;
    RING_CAPACITY.store(cfg.ring_capacity, Ordering::Relaxed);
    let run = RunConfig {
        baseline_ns: 1_000_000_000 / u64::from(cfg.baseline_hz),
        high_ns: 1_000_000_000 / u64::from(cfg.high_hz),
        perf_keeper,
    };
    {
        let mut reg = registry();
        for t in reg
            .threads
            .iter()
            .filter(|t| !t.retired.load(Ordering::Relaxed))
        {
            if let Err(e) = t.arm(run.baseline_ns, run.high_ns, run.use_perf()) {
                tracing::warn!(tid = t.tid, error = %e, "spanprof: could not arm a thread");
            }
        }
        reg.run = Some(run);
    }
    sys::set_wall_period(if cfg.wall_hz == 0 {
        0
    } else {
        1_000_000_000 / u64::from(cfg.wall_hz)
    });
    sys::set_enabled(true);
    PROFILING.store(true, Ordering::Release);
    let collector = Collector::start(store.clone(), cfg.drain_interval, cfg.cache_bytes);
    Ok(Arc::new(ProfilerInner {
        caps,
        store_max_bytes: cfg.store.max_bytes,
        store,
        collector: Mutex::new(Some(collector)),
    }))
}

/// [`Sampling::LabelsOnly`]: a profiler that samples nothing. No handler, timer or
/// collector; threads are not armed (none is registered lazily either).
pub(super) fn start_labels_only(cfg: ProfilerBuilder) -> Arc<ProfilerInner> {
    crate::setup::profiler_started(
        "spanprof: labels only: spans are labelled on every poll, nothing samples in this process"
            .to_owned(),
    );
    let store = SpanProfileStore::new(
        cfg.store.clone(),
        1_000_000_000 / u64::from(cfg.baseline_hz),
    );
    Arc::new(ProfilerInner {
        caps: Capabilities {
            sampling: Sampling::LabelsOnly,
            mechanism: Mechanism::Unavailable,
            unwinding: cfg.unwinding,
            frame_pointers: None,
            baseline_hz: cfg.baseline_hz,
            high_hz: cfg.high_hz,
            effective_high_hz: 0,
            max_high_hz: 0,
            wall_hz: 0,
        },
        store_max_bytes: cfg.store.max_bytes,
        store,
        collector: Mutex::new(None),
    })
}

#[cfg(not(spanprof_sampler))]
pub(super) fn start_platform(_cfg: ProfilerBuilder) -> Result<Arc<ProfilerInner>, ProfilerError> {
    tracing::warn!("spanprof: CPU profiling is only available on Linux; labels still work");
    Err(ProfilerError::Unsupported(
        "CPU profiling is only implemented on Linux",
    ))
}

/// What the running profiler can do here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Whether the process samples itself.
    pub sampling: Sampling,
    /// How the high rate is reached ([`Mechanism::Unavailable`] with
    /// [`Sampling::LabelsOnly`]).
    pub mechanism: Mechanism,
    /// How stacks are unwound.
    pub unwinding: Unwinding,
    /// Whether this build has frame pointers (probed in spanprof's own code, which
    /// the build's `RUSTFLAGS` reach like the service's); `None` where that cannot
    /// be told. With [`Unwinding::DwarfCfi`] stacks are whole either way.
    pub frame_pointers: Option<bool>,
    /// Configured baseline rate.
    pub baseline_hz: u32,
    /// Configured high rate.
    pub high_hz: u32,
    /// The high rate actually achievable (`high_hz` capped by the mechanism).
    pub effective_high_hz: u32,
    /// The most the mechanism can deliver per thread.
    pub max_high_hz: u32,
    /// Wall-clock samples per second inside hot polls (0: none).
    pub wall_hz: u32,
}

/// Estimated memory of the profiler, part by part, with the bounds: what
/// [`Profiler::memory_stats`] returns. Estimates count the data and their maps'
/// slots, not the allocator's overhead; a stack or labels shared by the store and
/// a cache count in both. Not counted: the symbolizer's parsed debug information
/// (blazesym's; it grows with the code that was sampled, up to the size of the
/// binaries' debug information), each thread's sample ring (fixed at start) and the
/// unwinder's pool of caches (about 144 KB per CPU, fixed at start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// The store's estimate ([`crate::StoreStats::bytes`]).
    pub store_bytes: usize,
    /// Its bound ([`crate::StoreConfig::max_bytes`]).
    pub store_max_bytes: usize,
    /// Symbolized stacks by raw addresses.
    pub stack_cache: CacheStats,
    /// The symbolizer's frames per instruction address, and function and file names.
    pub symbol_cache: CacheStats,
    /// Labels of samples fed to open windows.
    pub labels_cache: CacheStats,
    /// Windows open ([`Profiler::window`]).
    pub windows: usize,
    /// Distinct (labels, stack) entries of their current intervals (each window is
    /// bounded by its `max_entries`).
    pub window_entries: usize,
    /// Estimated bytes of those entries.
    pub window_bytes: usize,
    /// Estimated bytes of samples drained and waiting for symbolization now.
    pub backlog_bytes: usize,
    /// The span name and route interner (process-wide).
    pub names: InternStats,
}

impl MemoryStats {
    /// The sum of every estimate.
    pub fn total_bytes(&self) -> usize {
        self.store_bytes
            + self.stack_cache.bytes
            + self.symbol_cache.bytes
            + self.labels_cache.bytes
            + self.window_bytes
            + self.backlog_bytes
            + self.names.bytes
    }

    /// The sum of the configured bounds: the store's, the caches'
    /// ([`ProfilerBuilder::cache_bytes`]) and the interner's. Windows and the
    /// backlog have bounds of their own in entries and samples.
    pub fn bound_bytes(&self) -> usize {
        self.store_max_bytes
            + self.stack_cache.max_bytes
            + self.symbol_cache.max_bytes
            + self.labels_cache.max_bytes
            + self.names.max_bytes
    }
}

pub(crate) struct ProfilerInner {
    pub(super) caps: Capabilities,
    pub(super) store_max_bytes: usize,
    pub(super) store: SpanProfileStore,
    pub(super) collector: Mutex<Option<Collector>>,
}

impl ProfilerInner {
    /// Runs `f` on the collector while the profiler runs.
    fn with_collector<R>(&self, f: impl FnOnce(&Collector) -> R) -> Option<R> {
        self.collector
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(f)
    }
}

/// A running profiler. Cloning gives another handle to the same one; it runs until
/// [`Profiler::stop`].
#[derive(Clone)]
pub struct Profiler {
    pub(super) inner: Arc<ProfilerInner>,
}

impl fmt::Debug for Profiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Profiler")
            .field("caps", &self.inner.caps)
            .finish_non_exhaustive()
    }
}

impl Profiler {
    /// A builder with the default configuration.
    pub fn builder() -> ProfilerBuilder {
        ProfilerBuilder::new()
    }

    /// The running profiler, if any.
    pub fn current() -> Option<Profiler> {
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .map(|inner| Profiler { inner })
    }

    /// The running profiler, or a new one with the default configuration and the
    /// rates of the environment ([`ProfilerBuilder::with_env`]).
    pub fn current_or_start() -> Result<Profiler, ProfilerError> {
        if let Some(p) = Profiler::current() {
            return Ok(p);
        }
        match ProfilerBuilder::new().with_env()?.start() {
            Err(ProfilerError::AlreadyRunning) => {
                Profiler::current().ok_or(ProfilerError::AlreadyRunning)
            }
            other => other,
        }
    }

    /// What this profiler can do here (mechanism and effective high rate).
    pub fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    /// The store of aggregated, symbolized samples.
    pub fn store(&self) -> &SpanProfileStore {
        &self.inner.store
    }

    /// Drains every thread's ring into the store now and waits until done.
    pub fn flush(&self) {
        self.inner.with_collector(Collector::flush);
    }

    /// Opens a window on the samples taken from now on (see [`crate::ProfileWindow`]), with
    /// at most `max_entries` distinct (labels, stack) pairs per interval.
    pub fn window(&self, max_entries: usize) -> crate::ProfileWindow {
        let period = self.inner.store.period_ns();
        let (window, weak) = crate::ProfileWindow::new(max_entries, period);
        self.inner.with_collector(|c| {
            c.windows
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(weak)
        });
        window
    }

    /// Sampler counters.
    pub fn sampler_stats(&self) -> SamplerStats {
        let mut s = sampler_stats();
        if let Some(dropped) = self.inner.with_collector(Collector::dropped_backlog) {
            s.dropped_backlog = dropped;
        }
        s
    }

    /// Estimated memory of the store, the collector's caches, open windows, the
    /// backlog and the interner, with their bounds. Cheap: figures the collector
    /// publishes after each batch, and the store's counters.
    ///
    /// ```no_run
    /// let profiler = spanprof_core::Profiler::builder().start()?;
    /// let m = profiler.memory_stats();
    /// println!("{} of {} bytes; stacks evicted: {}", m.total_bytes(), m.bound_bytes(), m.stack_cache.evicted);
    /// # Ok::<(), spanprof_core::ProfilerError>(())
    /// ```
    pub fn memory_stats(&self) -> MemoryStats {
        let (collector, backlog_bytes) = self
            .inner
            .with_collector(Collector::memory)
            .unwrap_or_default();
        MemoryStats {
            store_bytes: self.inner.store.stats().bytes,
            store_max_bytes: self.inner.store_max_bytes,
            stack_cache: collector.stacks,
            symbol_cache: collector.symbols,
            labels_cache: collector.labels,
            windows: collector.windows,
            window_entries: collector.window_entries,
            window_bytes: collector.window_bytes,
            backlog_bytes,
            names: crate::intern::intern_stats(),
        }
    }

    /// Stops sampling: disarms every thread, drains what is left into the store,
    /// stops the collector and restores the previous `SIGPROF` action. The store
    /// stays readable through this handle.
    pub fn stop(&self) {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        let is_current = running
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(r, &self.inner));
        if !is_current {
            return;
        }
        if self.inner.caps.sampling == Sampling::InProcess {
            stop_platform();
        }
        if let Some(c) = self
            .inner
            .collector
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            c.stop();
        }
        *running = None;
    }
}

#[cfg(spanprof_sampler)]
pub(super) fn stop_platform() {
    PROFILING.store(false, Ordering::Release);
    sys::set_enabled(false);
    sys::set_wall_period(0);
    let mut reg = registry();
    reg.run = None;
    for t in &reg.threads {
        t.disarm();
    }
    drop(reg);
    sys::uninstall_handler();
}

#[cfg(not(spanprof_sampler))]
pub(super) fn stop_platform() {}

/// The running profiler, if any.
pub(super) static RUNNING: Mutex<Option<Arc<ProfilerInner>>> = Mutex::new(None);
