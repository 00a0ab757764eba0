//! The thread registry: which threads are sampled, their registration, and the
//! poll path's two entry points (register on first labelled poll, hot push).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::sys;

/// Default capacity of each thread's sample ring.
pub const DEFAULT_RING_CAPACITY: usize = 256;

/// How the running profiler samples each thread.
#[derive(Debug)]
pub(crate) struct RunConfig {
    pub(crate) baseline_ns: u64,
    pub(crate) high_ns: u64,
    /// With perf events for the high rate: one held, never enabled, from start to
    /// stop, so the kernel's perf scheduling hooks stay on
    /// ([`sys::probe_perf_events`]).
    pub(crate) perf_keeper: Option<std::os::fd::OwnedFd>,
}

impl RunConfig {
    /// Whether threads sample at the high rate with perf events.
    pub(crate) fn use_perf(&self) -> bool {
        self.perf_keeper.is_some()
    }
}

#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) run: Option<RunConfig>,
    pub(crate) threads: Vec<Arc<sys::ThreadSampler>>,
    /// Counters of threads already removed.
    pub(crate) retired_stats: SamplerStats,
}

pub(crate) static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
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
        unrooted: 0,
        unwind_frames: 0,
        unwind_cache_misses: 0,
        detached: 0,
        rearm_failed: 0,
    },
});
/// Fast check for the poll path: is a profiler running?
pub(crate) static PROFILING: AtomicBool = AtomicBool::new(false);

pub(crate) fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn sampler_stats() -> SamplerStats {
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
    s.unrooted += t.unrooted.load(Ordering::Relaxed);
    s.unwind_frames += t.unwind_lookups.load(Ordering::Relaxed);
    s.unwind_cache_misses += t.unwind_misses.load(Ordering::Relaxed);
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
        crate::offcpu::prepare_thread();
        let sampler = sys::ThreadSampler::for_current_thread(ring_capacity_hint());
        sampler.attach_current();
        {
            let mut reg = registry();
            if let Some(run) = &reg.run
                && let Err(e) = sampler.arm(run.baseline_ns, run.high_ns, run.use_perf())
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
pub(crate) fn register_lazily() {
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

pub(crate) static RING_CAPACITY: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(DEFAULT_RING_CAPACITY);

pub(crate) fn ring_capacity_hint() -> usize {
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

#[inline]
pub(crate) fn on_hot_end() {
    #[cfg(spanprof_sampler)]
    sys::on_hot_end();
}

/// Counters of the sampler, summed over threads (including threads that ended).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
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
    /// Samples whose stack the DWARF unwinder could not follow to the thread's first
    /// frame (code without call-frame information, a corrupt stack, a stack pointer
    /// outside the thread's stack). Not counted where stacks are walked by frame
    /// pointers only (not x86_64).
    pub unrooted: u64,
    /// Frames the DWARF unwinder has unwound (one rule lookup each).
    pub unwind_frames: u64,
    /// Of those, frames whose rule was not in the thread's cache (its call-frame
    /// program was found and run: about 0.4 µs instead of 16 ns).
    pub unwind_cache_misses: u64,
    /// Samples of work that outlived its span, written as detached (no trace or span
    /// id, span name [`crate::DETACHED_SPAN_NAME`], the route kept).
    pub detached: u64,
    /// Failed perf event re-arms.
    pub rearm_failed: u64,
}
