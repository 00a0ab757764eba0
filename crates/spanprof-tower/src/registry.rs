//! Labels of live spans by span id, so the span processor can write each span's
//! figures onto it when it ends, or (a batching pipeline,
//! [`crate::SpanProfileProcessor::batch`]) keep the ended span's figures until the
//! exporting thread writes them. Bounded: the oldest entries go first, counted.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use spanprof_core::SpanLabels;

use crate::ProfileScope;

/// Most spans tracked at once.
pub const MAX_TRACKED_SPANS: usize = 65_536;

/// The table is split by span id, each part behind its own lock on its own cache
/// lines: a request is tracked and taken on the worker that serves it, and with one
/// lock every request moved that lock's cache line between the workers.
const SHARDS: usize = 16; // `shard` takes the top 4 bits of a hash

const MAX_PER_SHARD: usize = MAX_TRACKED_SPANS / SHARDS;

/// What the table holds for one span.
enum Entry {
    /// The span is live: its labels.
    Live(SpanLabels),
    /// The span has ended and its figures wait for the exporting thread, since the
    /// export numbered `epoch` (see [`take_many`]).
    Ended { figures: Figures, epoch: u32 },
}

/// An ended span's figures, read from its labels on the thread that ended it, so
/// the labels are released there and the request's thread allocates nothing for
/// the attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Figures {
    /// Whether the span carries its own profile id (`pyroscope.profile.id`).
    pub own_profile_id: bool,
    pub busy_ns: u64,
    pub polls: u64,
    pub max_poll_ns: u64,
    pub cpu_samples: u64,
    pub cpu_ns: u64,
    /// `sampled` or `slow` when profiled at the high rate.
    pub hot: Option<&'static str>,
}

impl Entry {
    /// The span's figures: read from its labels now if it is live.
    fn figures(&self) -> Figures {
        match self {
            Entry::Live(labels) => Figures::of(labels),
            Entry::Ended { figures, .. } => *figures,
        }
    }
}

impl Figures {
    fn of(labels: &SpanLabels) -> Figures {
        let stats = labels.poll_stats();
        Figures {
            own_profile_id: scope() == ProfileScope::AllSpans
                || labels.root_span_id() == labels.span_id(),
            busy_ns: stats.busy_ns,
            polls: stats.polls,
            max_poll_ns: stats.max_poll_ns,
            cpu_samples: labels.cpu_samples(),
            cpu_ns: labels.cpu_ns(),
            hot: labels.hotness().as_str(),
        }
    }
}

struct Tracked {
    /// foldhash rather than SipHash (with the route tables and the interner, 508
    /// fewer instructions per layered request, docs/benchmarks.md); the ids are the
    /// service's own, its seed random.
    by_id: HashMap<u64, Entry, foldhash::fast::RandomState>,
    /// Ids in the order they were tracked, taken ones included until the queue
    /// holds [`ORDER_CAPACITY`] ids and is compacted. Allocated in full when tracking
    /// is turned on, never grown: a queue grown one id per span put buffer after
    /// buffer into the malloc arena of the worker thread serving the request, and in
    /// about half of the server processes measured glibc then had the workers wait
    /// on their arenas' locks, 0.15-0.65 waits per request
    /// (docs/overhead-history.md, 9.).
    order: VecDeque<u64>,
}

/// Room in each shard's eviction order: the compaction in [`track`] runs when it
/// would hold more than `2 * MAX_PER_SHARD` ids, so it never needs more. 64 KiB per
/// shard, 1 MiB in all, its pages touched as ids are written.
const ORDER_CAPACITY: usize = 2 * MAX_PER_SHARD + 1;

/// Room each shard's table starts with: the spans of a request or two in flight per
/// shard, and, with [`crate::SpanProfileProcessor::batch`], the ended spans waiting for
/// the batch processor's thread (its default queue holds 2 048, a sixteenth of them
/// per shard, twice over). The table grows beyond it on the thread that tracks a
/// span; starting with the room, a steady service never grows it on a request.
const INITIAL_PER_SHARD: usize = 256;

/// One shard, alone on its cache lines.
#[repr(align(128))]
struct Shard(Mutex<Tracked>);

static TRACKED: LazyLock<[Shard; SHARDS]> = LazyLock::new(|| {
    std::array::from_fn(|_| {
        Shard(Mutex::new(Tracked {
            by_id: HashMap::with_capacity_and_hasher(INITIAL_PER_SHARD, Default::default()),
            order: VecDeque::with_capacity(ORDER_CAPACITY),
        }))
    })
});

/// The shard of `span_id`: the top bits of a multiplicative hash, so ids spread
/// over the shards even from an id generator whose low bits are regular
/// (OpenTelemetry's are random, a user's `IdGenerator` need not be).
fn shard_of(span_id: u64) -> usize {
    (span_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize
}

fn lock(shard: usize) -> std::sync::MutexGuard<'static, Tracked> {
    TRACKED[shard].0.lock().unwrap_or_else(|e| e.into_inner())
}

fn shard(span_id: u64) -> std::sync::MutexGuard<'static, Tracked> {
    lock(shard_of(span_id))
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static EVICTED: AtomicU64 = AtomicU64::new(0);
static SCOPE_ALL: AtomicBool = AtomicBool::new(false);

/// Turns tracking on (a [`crate::SpanProfileProcessor`] exists to consume it), and
/// allocates the tables here, on the thread that sets the service up, rather than
/// on the first request's worker.
pub(crate) fn enable() {
    LazyLock::force(&TRACKED);
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
    let mut t = shard(labels.span_id());
    if t.by_id
        .insert(labels.span_id(), Entry::Live(labels.clone()))
        .is_none()
    {
        t.order.push_back(labels.span_id());
    }
    while t.by_id.len() > MAX_PER_SHARD {
        let Some(old) = t.order.pop_front() else {
            break;
        };
        if t.by_id.remove(&old).is_some() {
            EVICTED.fetch_add(1, Ordering::Relaxed);
        }
    }
    // Keep the order queue from growing with ids already taken.
    if t.order.len() > 2 * MAX_PER_SHARD {
        let Tracked { by_id, order } = &mut *t;
        order.retain(|id| by_id.contains_key(id));
    }
}

/// Takes the figures of an ending span, releasing its labels.
pub(crate) fn take(span_id: u64) -> Option<Figures> {
    // The entry (a live span's labels) is released after the lock.
    let entry = shard(span_id).by_id.remove(&span_id)?;
    Some(entry.figures())
}

/// Exports so far (calls of [`take_many`]): an ended span's figures are stamped
/// with it.
static EXPORTS: AtomicU32 = AtomicU32::new(0);

/// Ended spans swept because no batch carried them.
static UNEXPORTED: AtomicU64 = AtomicU64::new(0);

/// Exports after which an ended span no batch carried is swept: the batch
/// processor dropped it (its queue was full) or will never export it. With the
/// default queue (2 048 spans, batches of 512) a span waits at most a few exports.
const STALE_AFTER_EXPORTS: u32 = 256;

/// How often, in exports, the sweep runs (it visits every entry).
const SWEEP_EVERY: u32 = 64;

/// Takes the figures of the spans `ids` (a batch being exported), in order, locking each shard of the table once rather than once a span: the
/// request threads take those locks too. Every [`SWEEP_EVERY`] exports, also
/// sweeps ended spans older than [`STALE_AFTER_EXPORTS`] exports.
pub(crate) fn take_many(ids: &[u64]) -> Vec<Option<Figures>> {
    let epoch = EXPORTS.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
    let mut out = vec![None; ids.len()];
    let mut order: Vec<(usize, usize)> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| (shard_of(id), i))
        .collect();
    order.sort_unstable();
    let mut released = Vec::new();
    for run in order.chunk_by(|a, b| a.0 == b.0) {
        let mut t = lock(run[0].0);
        for &(_, i) in run {
            out[i] = t.by_id.remove(&ids[i]).map(|entry| {
                let figures = entry.figures();
                released.push(entry); // released after the lock
                figures
            });
        }
    }
    drop(released);
    if epoch.is_multiple_of(SWEEP_EVERY) {
        sweep(epoch);
    }
    out
}

/// Removes ended spans stamped more than [`STALE_AFTER_EXPORTS`] exports before
/// `epoch`, counted in [`ended_unexported`].
fn sweep(epoch: u32) {
    for shard in 0..SHARDS {
        let mut t = lock(shard);
        let before = t.by_id.len();
        t.by_id.retain(|_, e| match e {
            Entry::Ended { epoch: at, .. } => epoch.wrapping_sub(*at) <= STALE_AFTER_EXPORTS,
            Entry::Live(_) => true,
        });
        let swept = before - t.by_id.len();
        UNEXPORTED.fetch_add(swept as u64, Ordering::Relaxed);
    }
}

/// Marks a span ended: keeps its figures for [`take`] on the exporting thread and
/// releases its labels here, on the thread that ended it.
pub(crate) fn end(span_id: u64) {
    let mut t = shard(span_id);
    let Some(entry) = t.by_id.get_mut(&span_id) else {
        return;
    };
    let Entry::Live(labels) = entry else { return };
    let figures = Figures::of(labels);
    let epoch = EXPORTS.load(Ordering::Relaxed);
    let old = std::mem::replace(entry, Entry::Ended { figures, epoch });
    drop(t);
    drop(old);
}

/// Spans [`crate::SpanProfileProcessor::batch`] saw end whose figures no batch of
/// its exporter carried within 256 exports: the batch processor dropped them (its
/// queue was full; it counts them too) or never exported them. Their attributes
/// were never written; the registry let go of their figures.
pub fn ended_unexported() -> u64 {
    UNEXPORTED.load(Ordering::Relaxed)
}

/// Spans dropped from tracking because too many were held: more than
/// [`MAX_TRACKED_SPANS`] in all, or more than a sixteenth of it among the spans
/// whose ids share a shard of the table (the oldest of those goes first). Held are
/// live spans, and with [`crate::SpanProfileProcessor::batch`] ended spans whose
/// figures wait for the batch processor's thread (those no batch carries are swept
/// before the bound is reached, and counted in [`ended_unexported`]).
pub fn tracking_evicted() -> u64 {
    EVICTED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests share the process-wide table: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    /// The eviction order of each shard, by capacity.
    fn order_capacities() -> Vec<usize> {
        TRACKED
            .iter()
            .map(|s| s.0.lock().unwrap().order.capacity())
            .collect()
    }

    #[test]
    fn tracking_never_grows_the_eviction_order_on_the_request_path() {
        // A queue grown one id per span put buffer after buffer into the malloc arena
        // of the worker serving the request; in about half of the server processes
        // measured glibc then made the workers wait on their arenas' locks
        // (docs/overhead-history.md, 9.). Its storage is allocated when tracking
        // is turned on.
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable();
        let at_enable = order_capacities();
        assert!(
            at_enable.iter().all(|&c| c > 2 * MAX_PER_SHARD),
            "capacities at enable: {at_enable:?}"
        );
        // Every span taken again, as the processor does when it ends: each shard's
        // order fills with taken ids and is compacted about once and a half.
        let base = 0xcafe_0000_0000_0000u64;
        for i in 0..3 * MAX_TRACKED_SPANS as u64 {
            track(&SpanLabels::builder().span_id(base + i).build());
            assert!(take(base + i).is_some());
        }
        assert_eq!(order_capacities(), at_enable);
    }

    #[test]
    fn ended_spans_keep_their_figures_for_the_batch_thread_once() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable();
        let base = 0xbeef_0000_0000_0000u64;
        let labels: Vec<SpanLabels> = (0..40)
            .map(|i| SpanLabels::builder().span_id(base + i).build())
            .collect();
        for l in &labels {
            track(l);
        }
        // The first half ends on the request's thread; the rest are still live.
        for l in &labels[..20] {
            end(l.span_id());
        }
        // Promoted after it ended, a span's figures do not change: they were read
        // as it ended. A live span's are read when taken.
        for l in &labels {
            l.promote(spanprof_core::Hotness::Slow);
        }
        let mut ids: Vec<u64> = labels.iter().map(|l| l.span_id()).rev().collect();
        ids.push(base + 1000); // never tracked
        let out = take_many(&ids);
        assert_eq!(out.len(), ids.len());
        for (id, figures) in ids.iter().zip(&out) {
            if *id == base + 1000 {
                assert_eq!(*figures, None);
            } else {
                let ended = *id < base + 20;
                let hot = figures.expect("tracked").hot;
                assert_eq!(hot, (!ended).then_some("slow"), "span {id:x}");
            }
        }
        // Taken once: a second batch with the same spans finds nothing.
        assert!(take_many(&ids).iter().all(Option::is_none));
        // The registry holds no reference to the labels any more.
        assert!(labels.iter().all(|l| take(l.span_id()).is_none()));
    }

    #[test]
    fn ended_spans_no_batch_carries_are_swept_and_counted() {
        // The batch processor drops spans when its queue is full, after `on_end`
        // kept their figures: no batch ever takes those, and without a sweep they
        // stayed until the table's bound, growing it on the request threads.
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable();
        let base = 0xdead_0000_0000_0000u64;
        let dropped = SpanLabels::builder().span_id(base).build();
        let exported = SpanLabels::builder().span_id(base + 1).build();
        track(&dropped);
        track(&exported);
        end(base);
        end(base + 1);
        let unexported = ended_unexported();
        // Batches that carry other spans, as many as a span may wait in a full
        // default queue: nothing is swept yet.
        for _ in 0..8 {
            take_many(&[base + 2]);
        }
        assert_eq!(ended_unexported(), unexported);
        assert!(
            take_many(&[base + 1])[0].is_some(),
            "a span exported late still has its figures"
        );
        for _ in 0..2 * STALE_AFTER_EXPORTS {
            take_many(&[base + 2]);
        }
        assert_eq!(ended_unexported() - unexported, 1);
        assert!(take(base).is_none(), "swept");
    }

    #[test]
    fn tracking_stays_bounded_and_counts_what_it_evicts() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable();
        let evicted = tracking_evicted();
        let n = 2 * MAX_TRACKED_SPANS as u64;
        // Ids of this test's own, all multiples of 16: with the shard picked by their
        // low bits they would all land in one shard, which keeps 4 096, not 65 536.
        let base = 0xfeed_0000_0000_0000u64;
        for i in 0..n {
            track(&SpanLabels::builder().span_id(base + 16 * i).build());
        }
        let held: usize = TRACKED
            .iter()
            .map(|s| s.0.lock().unwrap().by_id.len())
            .sum();
        // Twice the bound spread over the shards fills every one of them.
        assert_eq!(held, MAX_TRACKED_SPANS);
        assert_eq!(tracking_evicted() - evicted, n - MAX_TRACKED_SPANS as u64);
        // The newest is still there; the oldest went first.
        assert!(take(base + 16 * (n - 1)).is_some());
        assert!(take(base).is_none());
    }
}
