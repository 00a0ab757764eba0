//! The profiler's configuration: defaults, [`ProfilerBuilder`] and its errors.

use std::time::Duration;

use crate::error::ConfigError;
use crate::store::StoreConfig;

use super::*;

/// Default baseline sampling rate, per thread, in samples per CPU-second.
pub const DEFAULT_BASELINE_HZ: u32 = 99;
/// Default high sampling rate for hot work.
pub const DEFAULT_HIGH_HZ: u32 = 1000;
/// Highest high rate accepted.
pub const MAX_HIGH_HZ: u32 = 10_000;
/// Default rate of wall-clock samples of hot polls, per thread, in samples per
/// second of wall-clock time spent inside a hot poll.
pub const DEFAULT_WALL_HZ: u32 = 100;
/// Default bound on the collector's caches together (symbolized stacks, the
/// symbolizer's frames and names, window labels), beside the store's own bound.
pub const DEFAULT_CACHE_BYTES: usize = 32 << 20;
/// Default interval at which the collector drains the rings. A ring that reaches
/// half its capacity is drained at once, whatever the interval (its signal handler
/// wakes the drain thread), so this bounds only how stale the store can be between
/// flushes; every export and the viewer flush first.
pub const DEFAULT_DRAIN_INTERVAL: Duration = Duration::from_secs(1);
/// Highest rate the per-thread CPU timer reaches here: it is driven by the
/// kernel tick (`CONFIG_HZ`, 250 on the machines this was measured on).
pub const TIMER_MAX_HZ: u32 = 250;

/// Whether the process samples itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Sampling {
    /// spanprof's own sampler: per-thread timers and perf events, the signal
    /// handler, the collector and the store. The default.
    #[default]
    InProcess,
    /// Labels only, for a service profiled from outside (the OpenTelemetry eBPF
    /// profiler, with the feature `otel-thread-ctx`): spanprof's labels, runtime
    /// hooks and layers work as usual, but nothing samples in the process (no signal,
    /// no timer, no collector thread); the store stays empty.
    LabelsOnly,
}

/// Configures and starts a [`Profiler`]. Every setter documents its default.
#[derive(Debug, Clone)]
pub struct ProfilerBuilder {
    pub(super) sampling: Sampling,
    pub(super) baseline_hz: u32,
    pub(super) high_hz: u32,
    pub(super) wall_hz: u32,
    pub(super) ring_capacity: usize,
    pub(super) drain_interval: Duration,
    pub(super) use_perf_events: bool,
    pub(super) store: StoreConfig,
    pub(super) cache_bytes: usize,
    pub(super) unwinding: Unwinding,
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
            sampling: Sampling::InProcess,
            baseline_hz: DEFAULT_BASELINE_HZ,
            high_hz: DEFAULT_HIGH_HZ,
            wall_hz: DEFAULT_WALL_HZ,
            ring_capacity: DEFAULT_RING_CAPACITY,
            drain_interval: DEFAULT_DRAIN_INTERVAL,
            use_perf_events: true,
            store: StoreConfig::default(),
            cache_bytes: DEFAULT_CACHE_BYTES,
            unwinding: Unwinding::DwarfCfi,
        }
    }

    /// Whether the process samples itself. Defaults to [`Sampling::InProcess`];
    /// [`Sampling::LabelsOnly`] for a service profiled from outside.
    ///
    /// ```
    /// use spanprof_core::{Profiler, Sampling};
    /// let labels_only = Profiler::builder().sampling(Sampling::LabelsOnly).start()?;
    /// assert_eq!(labels_only.capabilities().sampling, Sampling::LabelsOnly);
    /// labels_only.stop();
    /// # Ok::<(), spanprof_core::ProfilerError>(())
    /// ```
    pub fn sampling(mut self, sampling: Sampling) -> Self {
        self.sampling = sampling;
        self
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

    /// Wall-clock samples per second while a thread polls hot work (sampled,
    /// promoted by a per-route rate or already slow): each one takes the stack where
    /// the thread is, on CPU or blocked in a system call, so a hot span's time off
    /// CPU inside its polls gets stacks (the `wall` profile). Defaults to
    /// [`DEFAULT_WALL_HZ`] (100); 0 turns them off. At most 1000. Each hot poll
    /// starts and stops a timer (two system calls).
    pub fn wall_hz(mut self, hz: u32) -> Self {
        self.wall_hz = hz;
        self
    }

    /// Samples each thread's ring holds between collector drains; when full, samples
    /// are dropped and counted. Defaults to [`DEFAULT_RING_CAPACITY`] (256). At least 8.
    pub fn ring_capacity(mut self, n: usize) -> Self {
        self.ring_capacity = n;
        self
    }

    /// How often the collector drains the rings when none fills: a ring that
    /// reaches half its capacity wakes the drain thread at once. Defaults to
    /// [`DEFAULT_DRAIN_INTERVAL`] (1 s: every wake-up of the drain and collector
    /// threads is a context switch each, a few µs on a VM). Between 1 ms and 10 s.
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

    /// How the signal handler unwinds stacks. Defaults to [`Unwinding::DwarfCfi`]:
    /// whole stacks whatever the code was built with. [`Unwinding::FramePointers`]
    /// costs less per frame (about 2 ns against DWARF's 16 ns) but needs a build with frame
    /// pointers and still loses the caller of every sample in code without them
    /// (glibc's allocator, C libraries). Where there is no DWARF unwinder (not
    /// x86_64) stacks are walked by frame pointers whatever is asked;
    /// [`Profiler::capabilities`] says which is in force.
    pub fn unwinding(mut self, unwinding: Unwinding) -> Self {
        self.unwinding = unwinding;
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

    /// Takes the rates from the environment where set: `SPANPROF_BASELINE_HZ`,
    /// `SPANPROF_HIGH_HZ` and `SPANPROF_WALL_HZ` (whole numbers of Hz, the same bounds
    /// as [`ProfilerBuilder::baseline_hz`], [`ProfilerBuilder::high_hz`] and
    /// [`ProfilerBuilder::wall_hz`]); settings
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
            v.trim().parse::<u32>().map(Some).map_err(|_| {
                ConfigError::new(name, format!("`{v}` is not a whole number of Hz")).into()
            })
        };
        if let Some(b) = hz("SPANPROF_BASELINE_HZ")? {
            self.baseline_hz = b;
        }
        if let Some(h) = hz("SPANPROF_HIGH_HZ")? {
            self.high_hz = h;
        }
        if let Some(w) = hz("SPANPROF_WALL_HZ")? {
            self.wall_hz = w;
        }
        Ok(self)
    }

    /// Bounds of the span profile store. Defaults to [`StoreConfig::default`].
    pub fn store(mut self, store: StoreConfig) -> Self {
        self.store = store;
        self
    }

    fn validate(&self) -> Result<(), ProfilerError> {
        let bad = |field, reason: String| Err(ConfigError::new(field, reason).into());
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
        if self.wall_hz > 1000 {
            return bad("wall_hz", format!("{} is above 1000", self.wall_hz));
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
    /// thread and starts the collector thread ([`Sampling::InProcess`]), or none of
    /// that ([`Sampling::LabelsOnly`]). With the feature `otel-thread-ctx`, publishes
    /// OpenTelemetry's process context.
    pub fn start(self) -> Result<Profiler, ProfilerError> {
        self.validate()?;
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if running.is_some() {
            return Err(ProfilerError::AlreadyRunning);
        }
        let inner = match self.sampling {
            Sampling::InProcess => start_platform(self)?,
            Sampling::LabelsOnly => start_labels_only(self),
        };
        #[cfg(feature = "otel-thread-ctx")]
        crate::otel_ctx::on_start();
        *running = Some(inner.clone());
        Ok(Profiler { inner })
    }
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
