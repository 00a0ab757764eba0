//! Labels of live spans by span id, so the span processor can write each span's
//! figures onto it when it ends. Bounded: the oldest entries go first, counted.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use spanprof_core::SpanLabels;

use crate::ProfileScope;

/// Most spans tracked at once.
pub const MAX_TRACKED_SPANS: usize = 65_536;

/// Hashes a span id with one multiplication. The ids are the service's own
/// OpenTelemetry span ids (random, made by its SDK, never taken from a request), so
/// SipHash's protection against chosen keys buys nothing here, and it cost about 350
/// instructions per span (docs/benchmarks.md).
#[derive(Default)]
struct SpanIdHasher(u64);

impl Hasher for SpanIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        // Fibonacci hashing: spreads sequential ids (a custom id generator) over the
        // high bits that hashbrown's control bytes use, too.
        self.0 = (self.0 ^ id).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

struct Tracked {
    by_id: HashMap<u64, SpanLabels, BuildHasherDefault<SpanIdHasher>>,
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

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, BuildHasherDefault};

    use super::SpanIdHasher;

    #[test]
    fn sequential_span_ids_spread_over_buckets_and_control_bytes() {
        // A custom id generator may count up: the low bits pick hashbrown's bucket,
        // the top 7 its control byte; both must vary.
        let build = BuildHasherDefault::<SpanIdHasher>::default();
        let hashes: Vec<u64> = (1..=1024u64).map(|id| build.hash_one(id)).collect();
        let buckets: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 1023).collect();
        let tags: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert_eq!(buckets.len(), 1024, "low bits collide");
        assert!(
            tags.len() > 100,
            "only {} distinct control bytes",
            tags.len()
        );
    }
}
