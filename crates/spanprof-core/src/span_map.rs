//! The labels of an instrumentation's spans by span id: what `spanprof-tower`'s
//! `SpanProfileLayer` keeps for `tracing` spans with labels of their own (inner spans,
//! `profile_roots`). The layer marks such a span in its own extensions (a zero-sized
//! value: no allocation), so a span without labels, such as a request's own span
//! entered at every poll, never probes this map.
//!
//! A span is placed by its id without tracing-subscriber's slab generation (the top
//! 13 bits): the spans a thread opens get consecutive slots of its shard, and take
//! consecutive places, three to a line. One bucket
//! is one cache line: three span ids, read without a lock, and the labels under the
//! bucket's lock. A span whose bucket is full takes a place in its partner bucket
//! (the other line of the same 128 bytes); past that the caller keeps the labels
//! itself, counted in [`overflowed`]. Entering pushes a reference to the labels onto
//! the thread's own push stack; exiting pops it there, with no map access.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::labels::SpanLabels;
use crate::line::OwnLine;
use crate::sys::record::RecordRef;

/// Places per bucket.
const WAYS: usize = 3;
/// Buckets, a power of two (256 KiB in all, allocated at the first use).
const BUCKETS: usize = 1 << 12;
/// The span id bits that are tracing-subscriber's slab slot (sharded-slab's
/// default layout): its address in the shard, then the shard (13 bits), then the
/// slot's generation, left out of the placement.
const ADDR_BITS: u32 = 38;
const SLOT_BITS: u32 = 51;

const _: () = assert!(BUCKETS.is_power_of_two() && BUCKETS > 1);

/// One cache line: the ids of its places (0: empty), the labels held for them, and
/// how many spans placed here live in the partner bucket.
#[repr(align(64))]
struct Bucket {
    ids: [AtomicU64; WAYS],
    spilled: AtomicU8,
    held: Mutex<[Option<RecordRef>; WAYS]>,
}

const _: () = assert!(std::mem::size_of::<Bucket>() == 64);

struct Table {
    buckets: Box<[Bucket]>,
}

static TABLE: OwnLine<LazyLock<Table>> = OwnLine(LazyLock::new(|| Table {
    buckets: (0..BUCKETS)
        .map(|_| Bucket {
            ids: std::array::from_fn(|_| AtomicU64::new(0)),
            spilled: AtomicU8::new(0),
            held: Mutex::new([const { None }; WAYS]),
        })
        .collect(),
}));

/// Spans whose labels did not fit (both buckets full), on a line of its own.
static OVERFLOWED: OwnLine<AtomicU64> = OwnLine(AtomicU64::new(0));

/// Allocates the table now (on the thread that sets the service up, not in the
/// first request).
pub fn init() {
    LazyLock::force(&TABLE.0);
}

/// The home bucket of span `id`: consecutive slots of one shard go to consecutive
/// places (three to a bucket), so the spans a thread opens one after another share
/// lines, and the next line is the next in memory; shards start far apart.
#[inline(always)]
fn home(id: u64) -> usize {
    let slot = id.wrapping_sub(1);
    let addr = slot & ((1u64 << ADDR_BITS) - 1);
    let shard = (slot & ((1u64 << SLOT_BITS) - 1)) >> ADDR_BITS;
    ((addr / WAYS as u64).wrapping_add(shard.wrapping_mul(613)) as usize) & (BUCKETS - 1)
}

#[inline(always)]
fn bucket(i: usize) -> &'static Bucket {
    &TABLE.buckets[i]
}

#[inline]
fn lock(b: &Bucket) -> MutexGuard<'_, [Option<RecordRef>; WAYS]> {
    b.held.lock().unwrap_or_else(|e| e.into_inner())
}

/// The bucket and place holding `id`, read without a lock (it may be taken at once:
/// check again under the lock).
#[inline(always)]
fn place_of(id: u64) -> Option<(&'static Bucket, usize)> {
    let h = home(id);
    let b = bucket(h);
    if let Some(k) = b.ids.iter().position(|x| x.load(Ordering::Acquire) == id) {
        return Some((b, k));
    }
    if b.spilled.load(Ordering::Acquire) == 0 {
        return None;
    }
    let p = bucket(h ^ 1);
    p.ids
        .iter()
        .position(|x| x.load(Ordering::Acquire) == id)
        .map(|k| (p, k))
}

/// What [`insert`] did.
#[derive(Debug)]
pub enum Inserted {
    /// The labels are held for the span.
    Stored,
    /// The span had labels already (decided on another thread meanwhile): those stay,
    /// these are handed back.
    Exists(SpanLabels),
    /// No place was free: the labels are handed back (counted in [`overflowed`]).
    Full(SpanLabels),
}

/// Holds `labels` (an owning handle) for span `id` until [`remove`]: in a free place
/// of its bucket, else of the partner bucket.
#[inline]
pub fn insert(id: u64, labels: SpanLabels) -> Inserted {
    debug_assert_ne!(id, 0);
    let h = home(id);
    {
        // The common case: the home bucket, under its lock (inserts of one span are
        // serialised by it, so a span is placed once).
        let b = bucket(h);
        let mut held = lock(b);
        if b.ids.iter().any(|x| x.load(Ordering::Relaxed) == id) {
            return Inserted::Exists(labels);
        }
        if let Some(k) = b.ids.iter().position(|x| x.load(Ordering::Relaxed) == 0) {
            held[k] = Some(owned_record(labels));
            b.ids[k].store(id, Ordering::Release);
            return Inserted::Stored;
        }
    }
    insert_spilled(id, h, labels)
}

/// [`insert`] when the home bucket is full: both buckets of the pair, locked in index
/// order (so two inserts spilling from either side cannot wait on each other), looked
/// at again.
#[cold]
fn insert_spilled(id: u64, h: usize, labels: SpanLabels) -> Inserted {
    let (lo, hi) = (h.min(h ^ 1), h.max(h ^ 1));
    let mut lo_held = lock(bucket(lo));
    let mut hi_held = lock(bucket(hi));
    if [lo, hi].iter().any(|&i| {
        bucket(i)
            .ids
            .iter()
            .any(|x| x.load(Ordering::Relaxed) == id)
    }) {
        return Inserted::Exists(labels);
    }
    let (home_held, partner_held) = if h == lo {
        (&mut lo_held, &mut hi_held)
    } else {
        (&mut hi_held, &mut lo_held)
    };
    for (i, held) in [(h, home_held), (h ^ 1, partner_held)] {
        let b = bucket(i);
        if let Some(k) = b.ids.iter().position(|x| x.load(Ordering::Relaxed) == 0) {
            held[k] = Some(owned_record(labels));
            if i != h {
                bucket(h).spilled.fetch_add(1, Ordering::Release);
            }
            b.ids[k].store(id, Ordering::Release);
            return Inserted::Stored;
        }
    }
    drop((lo_held, hi_held));
    OVERFLOWED.fetch_add(1, Ordering::Relaxed);
    Inserted::Full(labels)
}

/// The record of an owning handle, its owner count kept (given back as an owning
/// handle by [`remove`]).
#[inline]
fn owned_record(labels: SpanLabels) -> RecordRef {
    let (record, owner) = labels.into_parts();
    if owner {
        record
    } else {
        // A carrying handle: held as an owner from now on.
        let (record, _) = SpanLabels::owning(record).into_parts();
        record
    }
}

/// Pushes span `id`'s labels on this thread, if it has any (until [`exit`] of the
/// same span on this thread; the outermost push of a span on a thread counts as one
/// of its polls). Returns whether it had labels.
#[inline]
pub fn enter(id: u64) -> bool {
    let Some((b, k)) = place_of(id) else {
        return false;
    };
    let record = {
        let held = lock(b);
        if b.ids[k].load(Ordering::Relaxed) != id {
            return false;
        }
        match &held[k] {
            Some(record) => record.clone(),
            None => return false,
        }
    };
    crate::poll::enter_span(record, id)
}

/// Pops the newest push of span `id` on this thread ([`enter`]); at the outermost,
/// adds the poll to its figures. Returns whether there was one. Touches no table.
#[inline]
pub fn exit(id: u64) -> bool {
    crate::poll::exit_span(id)
}

/// Takes span `id`'s labels (an owning handle) out of the map.
#[inline]
pub fn remove(id: u64) -> Option<SpanLabels> {
    let h = home(id);
    let (b, k) = place_of(id)?;
    let record = {
        let mut held = lock(b);
        if b.ids[k].load(Ordering::Relaxed) != id {
            return None;
        }
        b.ids[k].store(0, Ordering::Release);
        if !std::ptr::eq(b, bucket(h)) {
            bucket(h).spilled.fetch_sub(1, Ordering::Release);
        }
        held[k].take()
    };
    // Released after the lock (the span may end here).
    record.map(|r| SpanLabels::from_parts(r, true))
}

/// Spans whose labels found no free place (the caller kept them instead).
#[inline]
pub fn overflowed() -> u64 {
    OVERFLOWED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(span: u64) -> SpanLabels {
        SpanLabels::builder().span_id(span).build()
    }

    /// Ids of one home bucket (and so of its partner's pair).
    fn same_home(n: usize) -> Vec<u64> {
        (1u64..)
            .map(|i| (i << 40) | (7 << 20))
            .filter(|&id| home(id) == home((1 << 40) | (7 << 20)))
            .take(n)
            .collect()
    }

    #[test]
    fn a_span_is_entered_until_removed_and_a_full_pair_overflows() {
        init();
        let ids = same_home(2 * WAYS + 1);
        for &id in &ids[..2 * WAYS] {
            assert!(matches!(insert(id, labels(id)), Inserted::Stored));
        }
        assert!(matches!(insert(ids[0], labels(7)), Inserted::Exists(_)));
        let before = overflowed();
        assert!(matches!(
            insert(ids[2 * WAYS], labels(ids[2 * WAYS])),
            Inserted::Full(_)
        ));
        assert_eq!(overflowed(), before + 1);
        // One in the partner bucket is found too.
        let spilled = ids[2 * WAYS - 1];
        assert!(enter(spilled));
        assert_eq!(crate::current_labels().map(|l| l.span_id()), Some(spilled));
        assert!(exit(spilled));
        assert!(crate::current_labels().is_none());
        assert!(!exit(spilled), "nothing left to pop");
        let gone = remove(spilled).expect("held");
        assert_eq!(gone.span_id(), spilled);
        assert!(!enter(spilled));
        assert!(matches!(
            insert(ids[2 * WAYS], labels(ids[2 * WAYS])),
            Inserted::Stored
        ));
        for &id in &ids {
            remove(id);
        }
        assert!(ids.iter().all(|&id| !enter(id)));
    }

    #[test]
    fn the_outermost_enter_on_a_thread_counts_one_poll() {
        init();
        let id = 0x5eed_0000_0001;
        assert!(matches!(insert(id, labels(id)), Inserted::Stored));
        for _ in 0..3 {
            assert!(enter(id));
            assert!(enter(id), "re-entered while entered");
            assert!(exit(id));
            assert!(exit(id));
        }
        let labels = remove(id).expect("held");
        assert_eq!(labels.poll_stats().polls, 3);
        assert!(
            !labels.is_ended(),
            "the handle given back still owns the span"
        );
        drop(labels);
    }

    #[test]
    fn consecutive_spans_of_a_thread_share_lines_whatever_their_generation() {
        let slot = 0x0000_0123_0000_0042u64;
        let homes: Vec<usize> = (0..8u64).map(|g| home((g << SLOT_BITS) | slot)).collect();
        assert!(homes.iter().all(|&h| h == homes[0]), "{homes:?}");
        // Ids 1..=6 of one shard: two buckets, side by side.
        let homes: Vec<usize> = (1..=6u64).map(home).collect();
        assert_eq!(
            homes,
            [
                homes[0],
                homes[0],
                homes[0],
                homes[0] + 1,
                homes[0] + 1,
                homes[0] + 1
            ]
        );
    }
}
