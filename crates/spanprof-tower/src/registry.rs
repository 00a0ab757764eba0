//! Labels of live spans by span id, so the span processor can write each span's
//! figures onto it when it ends. Bounded: the oldest entries go first, counted.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use spanprof_core::SpanLabels;

use crate::ProfileScope;

/// Most spans tracked at once.
pub const MAX_TRACKED_SPANS: usize = 65_536;

struct Tracked {
    /// foldhash rather than SipHash (with the route tables and the interner, 508
    /// fewer instructions per layered request, docs/benchmarks.md); the ids are the
    /// service's own, its seed random.
    by_id: HashMap<u64, SpanLabels, foldhash::fast::RandomState>,
    order: VecDeque<u64>,
}

static TRACKED: LazyLock<Mutex<Tracked>> = LazyLock::new(|| {
    Mutex::new(Tracked {
        by_id: HashMap::default(),
        order: VecDeque::new(),
    })
});
static ENABLED: AtomicBool = AtomicBool::new(false);
static EVICTED: AtomicU64 = AtomicU64::new(0);
static SCOPE_ALL: AtomicBool = AtomicBool::new(false);

/// Turns tracking on (a [`crate::SpanProfileProcessor`] exists to consume it).
pub(crate) fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Sets which spans carry their own profile id (process-wide; the layer's builder sets it).
pub(crate) fn set_scope(scope: ProfileScope) {
    SCOPE_ALL.store(scope == ProfileScope::AllSpans, Ordering::Relaxed);
}

/// The scope in force.
pub fn scope() -> ProfileScope {
    if SCOPE_ALL.load(Ordering::Relaxed) {
        ProfileScope::AllSpans
    } else {
        ProfileScope::LocalRoot
    }
}

/// Remembers `labels` under its span id until the span ends.
pub(crate) fn track(labels: &SpanLabels) {
    if !enabled() {
        return;
    }
    let mut t = TRACKED.lock().unwrap_or_else(|e| e.into_inner());
    if t.by_id.insert(labels.span_id(), labels.clone()).is_none() {
        t.order.push_back(labels.span_id());
    }
    while t.by_id.len() > MAX_TRACKED_SPANS {
        let Some(old) = t.order.pop_front() else {
            break;
        };
        if t.by_id.remove(&old).is_some() {
            EVICTED.fetch_add(1, Ordering::Relaxed);
        }
    }
    // Keep the order queue from growing with ids already taken.
    if t.order.len() > 2 * MAX_TRACKED_SPANS {
        let Tracked { by_id, order } = &mut *t;
        order.retain(|id| by_id.contains_key(id));
    }
}

/// Takes the labels of an ending span.
pub(crate) fn take(span_id: u64) -> Option<SpanLabels> {
    TRACKED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .by_id
        .remove(&span_id)
}

/// Spans dropped from tracking because more than [`MAX_TRACKED_SPANS`] were live.
pub fn tracking_evicted() -> u64 {
    EVICTED.load(Ordering::Relaxed)
}
