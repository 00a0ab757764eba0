//! The state of the inner spans [`crate::SpanProfileLayer`] gives labels of their own,
//! by `tracing` span id, in a fixed table: found by reading one cache line of ids,
//! with no lock unless the span is in it, and no allocation (a span extension is a
//! boxed value: one `malloc` per span on the request path).
//!
//! Bounded: [`PLACES`] places; a span may take one of the eight of its bucket. When
//! all eight are held, the layer keeps that span's state in the span's extensions
//! instead (as every span's was before), counted in [`overflowed`].

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use spanprof_core::{PollTimer, SpanLabels};

/// An inner span's labels, its poll accounting, and the span id of the nearest span
/// (it or an ancestor) `tracing-opentelemetry` sees: the context it leaves attached
/// while this span is entered is that span's.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) labels: SpanLabels,
    pub(crate) timer: PollTimer,
    pub(crate) otel_anchor: u64,
}

/// Places in the table, a power of two: inner spans open at once (each closes with
/// its `tracing` span).
pub(crate) const PLACES: usize = 1 << 12;

/// The places a span may take: the eight of its bucket.
const WINDOW: usize = 8;

/// One bucket's span ids, 0 for an empty place: read without a lock to find a span.
#[repr(align(64))]
struct Ids([AtomicU64; WINDOW]);

struct Table {
    /// Places held per bucket: a span of an empty bucket (most, with few spans open)
    /// is not there, known from one byte.
    held: Box<[AtomicU8]>,
    ids: Box<[Ids]>,
    places: Box<[Mutex<Option<Entry>>]>,
    /// Serialises inserts into one bucket, so a span first entered on two threads at
    /// once gets one place.
    inserting: Box<[Mutex<()>]>,
}

static TABLE: LazyLock<Table> = LazyLock::new(|| Table {
    held: (0..PLACES / WINDOW).map(|_| AtomicU8::new(0)).collect(),
    ids: (0..PLACES / WINDOW)
        .map(|_| Ids(std::array::from_fn(|_| AtomicU64::new(0))))
        .collect(),
    places: (0..PLACES).map(|_| Mutex::new(None)).collect(),
    inserting: (0..PLACES / WINDOW).map(|_| Mutex::new(())).collect(),
});

static OVERFLOWED: AtomicU64 = AtomicU64::new(0);

/// Allocates the table (on the thread that builds the layer, not a request's).
pub(crate) fn init() {
    LazyLock::force(&TABLE);
}

/// The bucket of span `id`: the top bits of a multiplicative hash.
fn bucket(id: u64) -> usize {
    let buckets = PLACES / WINDOW;
    (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - buckets.trailing_zeros())) as usize
}

const _: () = assert!(PLACES.is_power_of_two() && PLACES / WINDOW > 1);

fn lock(place: usize) -> MutexGuard<'static, Option<Entry>> {
    TABLE.places[place]
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// The place holding span `id`, locked, if any.
#[inline]
fn find(id: u64) -> Option<MutexGuard<'static, Option<Entry>>> {
    let b = bucket(id);
    if TABLE.held[b].load(Ordering::Acquire) == 0 {
        return None;
    }
    let ids = &TABLE.ids[b].0;
    (0..WINDOW).find_map(|k| {
        if ids[k].load(Ordering::Acquire) != id {
            return None;
        }
        let held = lock(b * WINDOW + k);
        (ids[k].load(Ordering::Relaxed) == id && held.is_some()).then_some(held)
    })
}

/// Runs `f` on span `id`'s entry, if the table holds one.
#[inline]
pub(crate) fn with<R>(id: u64, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
    find(id).map(|mut held| f(held.as_mut().expect("found places hold an entry")))
}

/// Stores `entry` for span `id` and runs `f` on the entry the table then holds for
/// it: `entry`, or the one another thread stored first (a span first entered on two
/// threads at once is decided once). `Err(entry)` when every place of its bucket is
/// held (counted in [`overflowed`]).
pub(crate) fn insert<R>(
    id: u64,
    entry: Entry,
    f: impl FnOnce(&mut Entry) -> R,
) -> Result<R, Entry> {
    let b = bucket(id);
    let _inserting = TABLE.inserting[b].lock().unwrap_or_else(|e| e.into_inner());
    if let Some(mut held) = find(id) {
        return Ok(f(held.as_mut().expect("found places hold an entry")));
    }
    for (k, place_id) in TABLE.ids[b].0.iter().enumerate() {
        if place_id.load(Ordering::Relaxed) != 0 {
            continue;
        }
        let mut held = lock(b * WINDOW + k);
        if place_id.load(Ordering::Relaxed) != 0 {
            continue;
        }
        let e = held.insert(entry);
        let r = f(e);
        // Published once the entry is in place (and still under its lock), the
        // bucket's count first.
        TABLE.held[b].fetch_add(1, Ordering::Release);
        place_id.store(id, Ordering::Release);
        return Ok(r);
    }
    OVERFLOWED.fetch_add(1, Ordering::Relaxed);
    Err(entry)
}

/// Removes span `id`'s entry (its span closed); its labels are released after the
/// place's lock.
pub(crate) fn remove(id: u64) -> Option<Entry> {
    let b = bucket(id);
    if TABLE.held[b].load(Ordering::Acquire) == 0 {
        return None;
    }
    let ids = &TABLE.ids[b].0;
    let k = (0..WINDOW).find(|&k| ids[k].load(Ordering::Acquire) == id)?;
    let mut held = lock(b * WINDOW + k);
    if ids[k].load(Ordering::Relaxed) != id {
        return None;
    }
    ids[k].store(0, Ordering::Relaxed);
    TABLE.held[b].fetch_sub(1, Ordering::Release);
    held.take()
}

/// Inner spans whose state did not fit in the table (all eight places of their bucket
/// held) and went into their span's extensions instead: an allocation each.
pub(crate) fn overflowed() -> u64 {
    OVERFLOWED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(span: u64) -> Entry {
        Entry {
            labels: SpanLabels::builder().span_id(span).build(),
            timer: PollTimer::new(None),
            otel_anchor: span,
        }
    }

    #[test]
    fn a_span_is_found_until_removed_and_a_full_bucket_overflows() {
        init();
        // Ids of one bucket.
        let ids: Vec<u64> = (1u64..)
            .map(|i| i << 20)
            .filter(|&id| bucket(id) == bucket(1 << 20))
            .take(WINDOW + 1)
            .collect();
        for &id in &ids[..WINDOW] {
            assert_eq!(insert(id, entry(id), |e| e.labels.span_id()).ok(), Some(id));
        }
        // Stored twice: the first stands.
        assert_eq!(
            insert(ids[0], entry(7), |e| e.labels.span_id()).ok(),
            Some(ids[0])
        );
        let before = overflowed();
        assert!(insert(ids[WINDOW], entry(ids[WINDOW]), |_| ()).is_err());
        assert_eq!(overflowed(), before + 1);
        assert_eq!(with(ids[3], |e| e.otel_anchor), Some(ids[3]));
        let gone = remove(ids[3]).expect("held");
        assert_eq!(gone.labels.span_id(), ids[3]);
        assert!(with(ids[3], |_| ()).is_none());
        assert!(insert(ids[WINDOW], entry(ids[WINDOW]), |_| ()).is_ok());
        for &id in &ids {
            remove(id);
        }
    }
}
