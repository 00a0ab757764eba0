//! The profiler: configuration, the registry of sampled threads, start and stop.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::cache::CacheStats;
use crate::collector::Collector;
use crate::intern::InternStats;
use crate::store::{SpanProfileStore, StoreConfig};
use crate::sys;

/// How a thread reaches its high sampling rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// A per-thread `perf_event_open` software `cpu-clock` event (rates well above
    /// the kernel tick).
    PerfEvent,
    /// The per-thread CPU timer re-armed at the high period (capped by the kernel tick).
    Timer,
    /// No profiling on this platform or configuration.
    Unavailable,
}

impl Mechanism {
    /// `"perf_event"`, `"timer"` or `"unavailable"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::PerfEvent => "perf_event",
            Mechanism::Timer => "timer",
            Mechanism::Unavailable => "unavailable",
        }
    }
}

/// Default baseline sampling rate, per thread, in samples per CPU-second.
pub const DEFAULT_BASELINE_HZ: u32 = 99;
/// Default high sampling rate for hot work.
pub const DEFAULT_HIGH_HZ: u32 = 1000;
/// Highest high rate accepted.
pub const MAX_HIGH_HZ: u32 = 10_000;
/// Default capacity of each thread's sample ring.
pub const DEFAULT_RING_CAPACITY: usize = 256;
/// Default bound on the collector's caches together (symbolized stacks, the
/// symbolizer's frames and names, window labels), beside the store's own bound.
pub const DEFAULT_CACHE_BYTES: usize = 32 << 20;
/// Default interval at which the collector drains the rings.
pub const DEFAULT_DRAIN_INTERVAL: Duration = Duration::from_millis(20);
/// Highest rate the per-thread CPU timer reaches here: it is driven by the
/// kernel tick (`CONFIG_HZ`, 250 on the machines this was measured on).
pub const TIMER_MAX_HZ: u32 = 250;

/// Why the profiler could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum ProfilerError {
    /// A configuration value is out of range; names the field.
    InvalidConfig {
        /// The field, as named by its builder method.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A profiler is already running in this process.
    AlreadyRunning,
    /// Profiling is not available on this platform.
    Unsupported(&'static str),
    /// A system call failed.
    Io(std::io::Error),
}

impl fmt::Display for ProfilerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfilerError::InvalidConfig { field, reason } => {
                write!(f, "invalid profiler configuration: `{field}`: {reason}")
            }
            ProfilerError::AlreadyRunning => f.write_str("a spanprof profiler is already running"),
            ProfilerError::Unsupported(why) => write!(f, "profiling unavailable: {why}"),
            ProfilerError::Io(e) => write!(f, "profiler system call failed: {e}"),
        }
    }
}

impl std::error::Error for ProfilerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ProfilerError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for ProfilerError {
    fn from(e: std::io::Error) -> Self {
        ProfilerError::Io(e)
    }
}

/// Configures and starts a [`Profiler`]. Every setter documents its default.
#[derive(Debug, Clone)]
pub struct ProfilerBuilder {
    baseline_hz: u32,
    high_hz: u32,
    ring_capacity: usize,
    drain_interval: Duration,
    use_perf_events: bool,
    store: StoreConfig,
    cache_bytes: usize,
}

impl Default for ProfilerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ProfilerBuilder {
    /// A builder with the documented defaults.
    pub fn new() -> Self {
        ProfilerBuilder {
            baseline_hz: DEFAULT_BASELINE_HZ,
            high_hz: DEFAULT_HIGH_HZ,
            ring_capacity: DEFAULT_RING_CAPACITY,
            drain_interval: DEFAULT_DRAIN_INTERVAL,
            use_perf_events: true,
            store: StoreConfig::default(),
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }

    /// Samples per CPU-second of every registered thread. Defaults to
    /// [`DEFAULT_BASELINE_HZ`] (99). Must be in 1..=1000.
    pub fn baseline_hz(mut self, hz: u32) -> Self {
        self.baseline_hz = hz;
        self
    }

    /// Samples per CPU-second while hot work runs on a thread. Defaults to
    /// [`DEFAULT_HIGH_HZ`] (1000). Must be at least the baseline and at most
    /// [`MAX_HIGH_HZ`]. Without perf events the timer caps it near the kernel tick.
    pub fn high_hz(mut self, hz: u32) -> Self {
        self.high_hz = hz;
        self
    }

    /// Samples each thread's ring holds between collector drains; when full, samples
    /// are dropped and counted. Defaults to [`DEFAULT_RING_CAPACITY`] (256). At least 8.
    pub fn ring_capacity(mut self, n: usize) -> Self {
        self.ring_capacity = n;
        self
    }

    /// How often the collector drains the rings. Defaults to
    /// [`DEFAULT_DRAIN_INTERVAL`] (20 ms). Between 1 ms and 10 s.
    pub fn drain_interval(mut self, d: Duration) -> Self {
        self.drain_interval = d;
        self
    }

    /// Whether to use per-thread perf events for the high rate. Defaults to `true`;
    /// when the kernel refuses them the profiler falls back to the timer anyway.
    pub fn use_perf_events(mut self, yes: bool) -> Self {
        self.use_perf_events = yes;
        self
    }

    /// Estimated bytes the collector's caches may hold together, beside the store:
    /// symbolized stacks by raw addresses (half), the symbolizer's frames and names
    /// (three eighths), labels of samples for open windows (an eighth). Past it the
    /// least recently used entries go, counted ([`Profiler::memory_stats`]); a
    /// smaller bound costs symbolization time, not data. Defaults to
    /// [`DEFAULT_CACHE_BYTES`] (32 MiB). At least 1 MiB.
    pub fn cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// Takes the rates from the environment where set: `SPANPROF_BASELINE_HZ` and
    /// `SPANPROF_HIGH_HZ` (whole numbers of Hz, the same bounds as
    /// [`ProfilerBuilder::baseline_hz`] and [`ProfilerBuilder::high_hz`]); settings
    /// made after this call win. A value that is not a number is an error naming the
    /// variable; [`Profiler::current_or_start`] (what the layers use when no profiler
    /// runs) reads them.
    ///
    /// ```
    /// # fn main() -> Result<(), spanprof_core::ProfilerError> {
    /// let builder = spanprof_core::Profiler::builder().with_env()?;
    /// # drop(builder);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_env(self) -> Result<Self, ProfilerError> {
        self.with_vars(|k| std::env::var(k).ok())
    }

    pub(crate) fn with_vars(
        mut self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ProfilerError> {
        let hz = |name: &'static str| -> Result<Option<u32>, ProfilerError> {
            let Some(v) = var(name) else { return Ok(None) };
            v.trim()
                .parse::<u32>()
                .map(Some)
                .map_err(|_| ProfilerError::InvalidConfig {
                    field: name,
                    reason: format!("`{v}` is not a whole number of Hz"),
                })
        };
        if let Some(b) = hz("SPANPROF_BASELINE_HZ")? {
            self.baseline_hz = b;
        }
        if let Some(h) = hz("SPANPROF_HIGH_HZ")? {
            self.high_hz = h;
        }
        Ok(self)
    }

    /// Bounds of the span profile store. Defaults to [`StoreConfig::default`].
    pub fn store(mut self, store: StoreConfig) -> Self {
        self.store = store;
        self
    }

    fn validate(&self) -> Result<(), ProfilerError> {
        let bad = |field, reason: String| Err(ProfilerError::InvalidConfig { field, reason });
        if !(1..=1000).contains(&self.baseline_hz) {
            return bad(
                "baseline_hz",
                format!("{} is not in 1..=1000", self.baseline_hz),
            );
        }
        if self.high_hz < self.baseline_hz {
            return bad(
                "high_hz",
                format!("{} is below baseline_hz {}", self.high_hz, self.baseline_hz),
            );
        }
        if self.high_hz > MAX_HIGH_HZ {
            return bad(
                "high_hz",
                format!("{} is above {MAX_HIGH_HZ}", self.high_hz),
            );
        }
        if self.ring_capacity < 8 {
            return bad(
                "ring_capacity",
                format!("{} is below 8", self.ring_capacity),
            );
        }
        if self.drain_interval < Duration::from_millis(1)
            || self.drain_interval > Duration::from_secs(10)
        {
            return bad(
                "drain_interval",
                format!("{:?} is not between 1ms and 10s", self.drain_interval),
            );
        }
        if self.cache_bytes < 1 << 20 {
            return bad(
                "cache_bytes",
                format!("{} is below 1 MiB", self.cache_bytes),
            );
        }
        self.store.validate()
    }

    /// Starts the profiler: installs the signal handler, arms every registered
    /// thread and starts the collector thread.
    pub fn start(self) -> Result<Profiler, ProfilerError> {
        self.validate()?;
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if running.is_some() {
            return Err(ProfilerError::AlreadyRunning);
        }
        let inner = start_platform(self)?;
        *running = Some(inner.clone());
        Ok(Profiler { inner })
    }
}

#[cfg(spanprof_sampler)]
fn start_platform(cfg: ProfilerBuilder) -> Result<Arc<ProfilerInner>, ProfilerError> {
    // Perf events only pay off well above the baseline; below twice the baseline the
    // timer re-armed at the high period does the job (and lost-signal detection,
    // which expects several perf samples per baseline tick, stays exact).
    let perf_ok = if cfg.use_perf_events && cfg.high_hz >= 2 * cfg.baseline_hz {
        match sys::probe_perf_events() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "spanprof: perf events refused; the high rate falls back to the CPU timer (at most about {TIMER_MAX_HZ} Hz)"
                );
                false
            }
        }
    } else {
        false
    };
    let mechanism = if perf_ok {
        Mechanism::PerfEvent
    } else {
        Mechanism::Timer
    };
    let max_high_hz = if perf_ok { MAX_HIGH_HZ } else { TIMER_MAX_HZ };
    let effective_high_hz = cfg.high_hz.min(max_high_hz);
    tracing::info!(
        baseline_hz = cfg.baseline_hz,
        high_hz = cfg.high_hz,
        effective_high_hz,
        mechanism = mechanism.as_str(),
        "spanprof: profiler started"
    );
    let store = SpanProfileStore::new(
        cfg.store.clone(),
        1_000_000_000 / u64::from(cfg.baseline_hz),
    );
    let caps = Capabilities {
        mechanism,
        baseline_hz: cfg.baseline_hz,
        high_hz: cfg.high_hz,
        effective_high_hz,
        max_high_hz,
    };
    crate::setup::check_build(sys::frame_pointers_present());
    if let Some((lo, hi)) = crate::symbolize::executable_text() {
        sys::set_frame_pointer_text(lo as usize, hi as usize);
    }
    sys::install_handler()?;
    RING_CAPACITY.store(cfg.ring_capacity, Ordering::Relaxed);
    let run = RunConfig {
        baseline_ns: 1_000_000_000 / u64::from(cfg.baseline_hz),
        high_ns: 1_000_000_000 / u64::from(cfg.high_hz),
        use_perf: perf_ok,
    };
    {
        let mut reg = registry();
        reg.run = Some(run);
        for t in reg
            .threads
            .iter()
            .filter(|t| !t.retired.load(Ordering::Relaxed))
        {
            if let Err(e) = t.arm(run.baseline_ns, run.high_ns, run.use_perf) {
                tracing::warn!(tid = t.tid, error = %e, "spanprof: could not arm a thread");
            }
        }
    }
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

#[cfg(not(spanprof_sampler))]
fn start_platform(_cfg: ProfilerBuilder) -> Result<Arc<ProfilerInner>, ProfilerError> {
    tracing::warn!("spanprof: CPU profiling is only available on Linux; labels still work");
    Err(ProfilerError::Unsupported(
        "CPU profiling is only implemented on Linux",
    ))
}

/// What the running profiler can do here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// How the high rate is reached.
    pub mechanism: Mechanism,
    /// Configured baseline rate.
    pub baseline_hz: u32,
    /// Configured high rate.
    pub high_hz: u32,
    /// The high rate actually achievable (`high_hz` capped by the mechanism).
    pub effective_high_hz: u32,
    /// The most the mechanism can deliver per thread.
    pub max_high_hz: u32,
}

/// Counters of the sampler, summed over threads (including threads that ended).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SamplerStats {
    /// Threads registered now.
    pub threads: usize,
    /// Samples written by the signal handler.
    pub samples: u64,
    /// Samples dropped because a thread's ring was full.
    pub dropped_ring_full: u64,
    /// Samples dropped because the collector's symbolization backlog was full.
    pub dropped_backlog: u64,
    /// Baseline ticks skipped because the high-rate event covered that time (the
    /// tick landed in hot work).
    pub superseded: u64,
    /// High-rate samples skipped because they landed outside hot work (cold work is
    /// the baseline timer's); the high-rate event then waits for the next hot poll.
    pub high_rate_in_cold: u64,
    /// Samples whose stack was cut at the frame limit.
    pub truncated: u64,
    /// Samples of work that outlived its span, written as detached (no trace or span
    /// id, span name [`crate::DETACHED_SPAN_NAME`], the route kept).
    pub detached: u64,
    /// Failed perf event re-arms.
    pub rearm_failed: u64,
}

/// Estimated memory of the profiler, part by part, with the bounds: what
/// [`Profiler::memory_stats`] returns. Estimates count the data and their maps'
/// slots, not the allocator's overhead; a stack or labels shared by the store and
/// a cache count in both. Not counted: the symbolizer's parsed debug information
/// (blazesym's; it grows with the code that was sampled, up to the size of the
/// binaries' debug information) and each thread's sample ring (fixed at start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// The store's estimate ([`crate::StoreStats::bytes`]).
    pub store_bytes: usize,
    /// Its bound ([`StoreConfig::max_bytes`]).
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
    caps: Capabilities,
    store_max_bytes: usize,
    store: SpanProfileStore,
    collector: Mutex<Option<Collector>>,
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
    inner: Arc<ProfilerInner>,
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
        stop_platform();
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
fn stop_platform() {
    PROFILING.store(false, Ordering::Release);
    sys::set_enabled(false);
    let mut reg = registry();
    reg.run = None;
    for t in &reg.threads {
        t.disarm();
    }
    drop(reg);
    sys::uninstall_handler();
}

#[cfg(not(spanprof_sampler))]
fn stop_platform() {}

// ---- thread registry -------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct RunConfig {
    baseline_ns: u64,
    high_ns: u64,
    use_perf: bool,
}

#[derive(Default)]
pub(crate) struct Registry {
    run: Option<RunConfig>,
    pub(crate) threads: Vec<Arc<sys::ThreadSampler>>,
    /// Counters of threads already removed.
    pub(crate) retired_stats: SamplerStats,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    run: None,
    threads: Vec::new(),
    retired_stats: SamplerStats {
        threads: 0,
        samples: 0,
        dropped_ring_full: 0,
        dropped_backlog: 0,
        superseded: 0,
        high_rate_in_cold: 0,
        truncated: 0,
        detached: 0,
        rearm_failed: 0,
    },
});
static RUNNING: Mutex<Option<Arc<ProfilerInner>>> = Mutex::new(None);
/// Fast check for the poll path: is a profiler running?
static PROFILING: AtomicBool = AtomicBool::new(false);

pub(crate) fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

fn sampler_stats() -> SamplerStats {
    let reg = registry();
    let mut s = reg.retired_stats;
    s.threads = 0;
    for t in &reg.threads {
        if !t.retired.load(Ordering::Relaxed) {
            s.threads += 1;
        }
        add_thread_stats(&mut s, t);
    }
    s
}

pub(crate) fn add_thread_stats(s: &mut SamplerStats, t: &sys::ThreadSampler) {
    s.samples += t.samples.load(Ordering::Relaxed);
    s.dropped_ring_full += t.ring.dropped_full();
    s.superseded += t.superseded.load(Ordering::Relaxed);
    s.high_rate_in_cold += t.perf_cold.load(Ordering::Relaxed);
    s.truncated += t.truncated.load(Ordering::Relaxed);
    s.detached += t.detached.load(Ordering::Relaxed);
    s.rearm_failed += t.rearm_failed.load(Ordering::Relaxed);
}

/// Removes drained retired threads (called by the collector after draining).
pub(crate) fn prune_retired(reg: &mut Registry) {
    let mut i = 0;
    while i < reg.threads.len() {
        if reg.threads[i].retired.load(Ordering::Relaxed) {
            let t = reg.threads.swap_remove(i);
            let mut s = reg.retired_stats;
            add_thread_stats(&mut s, &t);
            reg.retired_stats = s;
        } else {
            i += 1;
        }
    }
}

// Registration state of this thread: 0 unknown, 1 registered, 2 opted out.
thread_local! {
    static REG_STATE: Cell<u8> = const { Cell::new(0) };
    static REG_GUARD: std::cell::RefCell<Option<ThreadRegistration>> = const { std::cell::RefCell::new(None) };
}

/// Keeps the calling thread registered for sampling; deregisters on drop.
///
/// Made by [`register_current_thread`]. The registration also ends, at the latest,
/// when the thread exits.
#[derive(Debug)]
pub struct ThreadRegistration {
    #[cfg(spanprof_sampler)]
    sampler: Arc<sys::ThreadSampler>,
}

/// Registers the calling thread for CPU sampling (idempotent) until it exits or
/// [`deregister_current_thread`] is called. Threads registered before the profiler
/// starts are armed when it starts. Returns whether this call registered it.
///
/// tokio runtimes built with [`crate::install_runtime_hooks`] call this on every
/// worker and blocking thread; a thread that polls labelled work while a profiler is
/// running registers itself on its first labelled poll.
pub fn register_current_thread() -> bool {
    #[cfg(spanprof_sampler)]
    {
        if REG_STATE.with(|s| s.get()) == 1 {
            return false;
        }
        let sampler = sys::ThreadSampler::for_current_thread(ring_capacity_hint());
        sampler.attach_current();
        {
            let mut reg = registry();
            if let Some(run) = reg.run
                && let Err(e) = sampler.arm(run.baseline_ns, run.high_ns, run.use_perf)
            {
                tracing::warn!(tid = sampler.tid, error = %e, "spanprof: could not arm thread");
            }
            reg.threads.push(sampler.clone());
        }
        REG_STATE.with(|s| s.set(1));
        let _ = REG_GUARD.try_with(|g| *g.borrow_mut() = Some(ThreadRegistration { sampler }));
        true
    }
    #[cfg(not(spanprof_sampler))]
    {
        false
    }
}

#[cold]
#[inline(never)]
fn register_lazily() {
    if register_current_thread() {
        crate::setup::thread_registered_lazily();
    }
}

/// Stops sampling the calling thread and releases its timer and perf event. Its
/// last samples are still collected.
pub fn deregister_current_thread() {
    let _ = REG_GUARD.try_with(|g| g.borrow_mut().take());
    let _ = REG_STATE.try_with(|s| s.set(2));
}

impl Drop for ThreadRegistration {
    fn drop(&mut self) {
        #[cfg(spanprof_sampler)]
        {
            sys::ThreadSampler::detach_current();
            let mut reg = registry();
            self.sampler.disarm();
            self.sampler.retired.store(true, Ordering::Relaxed);
            if reg.run.is_none() {
                prune_retired(&mut reg);
            }
        }
    }
}

static RING_CAPACITY: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(DEFAULT_RING_CAPACITY);

fn ring_capacity_hint() -> usize {
    RING_CAPACITY.load(Ordering::Relaxed)
}

/// On the poll path: registers a thread that polls labelled work while a profiler
/// runs. One thread-local read when already decided.
#[inline(always)]
pub(crate) fn ensure_thread_registered() {
    if REG_STATE.with(|s| s.get()) == 0 && PROFILING.load(Ordering::Relaxed) {
        register_lazily();
    }
}

#[inline]
pub(crate) fn on_hot_push(label_high_ns: u64) {
    #[cfg(spanprof_sampler)]
    sys::on_hot_push(label_high_ns);
    #[cfg(not(spanprof_sampler))]
    let _ = label_high_ns;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_the_environment_and_bad_values_name_the_variable() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let b = ProfilerBuilder::new()
            .with_vars(vars(&[
                ("SPANPROF_BASELINE_HZ", "49"),
                ("SPANPROF_HIGH_HZ", " 2000 "),
            ]))
            .unwrap();
        assert_eq!((b.baseline_hz, b.high_hz), (49, 2000));
        let b = ProfilerBuilder::new().with_vars(vars(&[])).unwrap();
        assert_eq!(
            (b.baseline_hz, b.high_hz),
            (DEFAULT_BASELINE_HZ, DEFAULT_HIGH_HZ)
        );
        let e = ProfilerBuilder::new()
            .with_vars(vars(&[("SPANPROF_HIGH_HZ", "1kHz")]))
            .unwrap_err();
        assert!(e.to_string().contains("SPANPROF_HIGH_HZ"), "{e}");
    }
}
