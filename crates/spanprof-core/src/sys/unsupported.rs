//! Stand-ins on platforms without a sampler: labels work, profiling does not. The
//! registry and collector compile against these; no thread is ever armed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use super::ring::SampleRing;

#[cfg(feature = "testing")]
pub(crate) fn in_signal_handler() -> bool {
    false
}

/// A registered thread that is never sampled.
pub(crate) struct ThreadSampler {
    pub(crate) tid: i32,
    pub(crate) ring: SampleRing,
    pub(crate) samples: AtomicU64,
    pub(crate) superseded: AtomicU64,
    pub(crate) truncated: AtomicU64,
    pub(crate) unrooted: AtomicU64,
    pub(crate) unwind_lookups: AtomicU64,
    pub(crate) unwind_misses: AtomicU64,
    pub(crate) detached: AtomicU64,
    pub(crate) perf_cold: AtomicU64,
    pub(crate) rearm_failed: AtomicU64,
    pub(crate) retired: AtomicBool,
}

impl ThreadSampler {
    pub(crate) fn for_current_thread(_ring_capacity: usize) -> Arc<Self> {
        Arc::new(ThreadSampler {
            tid: 0,
            ring: SampleRing::new(2),
            samples: AtomicU64::new(0),
            superseded: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            unrooted: AtomicU64::new(0),
            unwind_lookups: AtomicU64::new(0),
            unwind_misses: AtomicU64::new(0),
            detached: AtomicU64::new(0),
            perf_cold: AtomicU64::new(0),
            rearm_failed: AtomicU64::new(0),
            retired: AtomicBool::new(false),
        })
    }

    pub(crate) fn detach_current() {}
}

/// Drain requests so far (the stand-in: only stopping the collector requests one).
static DRAIN_REQUESTS: std::sync::Mutex<u32> = std::sync::Mutex::new(0);
static DRAIN_REQUESTED: std::sync::Condvar = std::sync::Condvar::new();

pub(crate) fn drain_requests() -> u32 {
    *DRAIN_REQUESTS.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn request_drain() {
    *DRAIN_REQUESTS.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    DRAIN_REQUESTED.notify_all();
}

pub(crate) fn refresh_unwind_modules(_only_if_asked: bool) {}

pub(crate) fn wait_for_drain_request(seen: u32, timeout: std::time::Duration) {
    let guard = DRAIN_REQUESTS.lock().unwrap_or_else(|e| e.into_inner());
    let _ = DRAIN_REQUESTED.wait_timeout_while(guard, timeout, |n| *n == seen);
}

pub(crate) fn set_wall_period(_ns: u64) {}

pub(crate) fn wall_begin() -> bool {
    false
}

pub(crate) fn wall_end() {}

pub(crate) fn wall_period() -> u64 {
    0
}
