//! Label records from a pool: [`RecordRef`], a reference-counted pointer to a
//! [`LabelRecord`] (the `Arc` of this crate), whose memory goes back to a free list
//! when the last reference drops instead of to the allocator.
//!
//! Why: every request makes one record (and one per inner span). A `malloc` for it on
//! the worker that starts the request, and its `free` on whichever worker finishes it,
//! pushed the service's own allocations of the same size classes into the allocator's
//! slow paths. From the pool a record is a pop from the thread's free list.
//!
//! - Each thread keeps a free list of up to [`LOCAL_MAX`] records. A release past it
//!   moves [`BATCH`] of them to a shared list; a take from an empty list moves up to
//!   [`BATCH`] back (one lock per batch). Records released on one worker and taken on
//!   another so circulate without the allocator.
//! - The shared list holds at most [`SHARED_MAX`] records; past that, memory goes back
//!   to the allocator. So the pool never holds more than the peak of live records
//!   plus those bounds.
//! - The signal handler never takes or releases a reference: it reads the record a
//!   pusher keeps alive (`slot.rs`).

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering, fence};

use crate::record::LabelRecord;

/// Most free records a thread keeps.
pub(crate) const LOCAL_MAX: usize = 128;
/// Records moved between a thread's list and the shared one at a time.
pub(crate) const BATCH: usize = 64;
/// Most free records the shared list keeps.
pub(crate) const SHARED_MAX: usize = 8192;

/// A free record's memory.
type Slot = NonNull<MaybeUninit<LabelRecord>>;

/// What a free record's memory holds while on a thread's free list: the next free
/// record. The list runs through the records themselves, so taking one reads the line
/// about to be written anyway, and a separate array of free pointers (one more cache
/// line per record, a miss on these machines) is not touched.
#[repr(C)]
struct FreeSlot {
    next: *mut FreeSlot,
}

const _: () = assert!(
    std::mem::size_of::<LabelRecord>() >= std::mem::size_of::<FreeSlot>()
        && std::mem::align_of::<LabelRecord>() >= std::mem::align_of::<FreeSlot>()
);

/// A thread's free records, linked through their memory (returned to the shared list
/// when the thread exits).
struct Local {
    head: Cell<*mut FreeSlot>,
    len: Cell<usize>,
}

impl Local {
    /// Takes up to `n` records off the list.
    fn take_batch(&self, n: usize) -> Vec<Slot> {
        let mut out = Vec::with_capacity(n.min(self.len.get()));
        while out.len() < n {
            let head = self.head.get();
            let Some(slot) = NonNull::new(head) else {
                break;
            };
            // SAFETY: every node on the list is a free record's memory holding a
            // `FreeSlot` written by `give_slot` or `refill`.
            self.head.set(unsafe { (*head).next });
            self.len.set(self.len.get() - 1);
            out.push(slot.cast());
        }
        out
    }

    /// Puts a free record's memory on the list.
    #[inline]
    fn push(&self, slot: Slot) {
        let node = slot.as_ptr().cast::<FreeSlot>();
        // SAFETY: `slot` is free memory for a `LabelRecord` (large and aligned enough
        // for a `FreeSlot`, checked above), owned by this list from now on.
        unsafe {
            node.write(FreeSlot {
                next: self.head.get(),
            })
        };
        self.head.set(node);
        self.len.set(self.len.get() + 1);
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let all = self.take_batch(usize::MAX);
        give_shared(all);
    }
}

thread_local! {
    static LOCAL: Local = const {
        Local {
            head: Cell::new(std::ptr::null_mut()),
            len: Cell::new(0),
        }
    };
}

/// Free records of exited threads and the surplus of busy ones.
struct Shared(Vec<Slot>);

// SAFETY: the slots are owned memory of no thread in particular (free records).
unsafe impl Send for Shared {}

static SHARED: Mutex<Shared> = Mutex::new(Shared(Vec::new()));

/// Records allocated so far, and records whose memory went back to the allocator.
static ALLOCATED: AtomicU64 = AtomicU64::new(0);
static FREED: AtomicU64 = AtomicU64::new(0);

fn give_shared(mut slots: Vec<Slot>) {
    if slots.is_empty() {
        return;
    }
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let room = SHARED_MAX.saturating_sub(shared.0.len());
    let keep = slots.len().min(room);
    shared.0.extend(slots.drain(..keep));
    drop(shared);
    for slot in slots {
        dealloc(slot);
    }
}

fn dealloc(slot: Slot) {
    FREED.fetch_add(1, Ordering::Relaxed);
    // SAFETY: every slot was made by `Box::into_raw` in `take_slot` and is free (its
    // record dropped in place), so it is reclaimed once, here.
    drop(unsafe { Box::from_raw(slot.as_ptr()) });
}

/// Moves a batch of the shared list onto this thread's empty list.
#[cold]
fn refill(local: &Local) {
    let batch: Vec<Slot> = {
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        let n = shared.0.len().min(BATCH);
        let at = shared.0.len() - n;
        shared.0.drain(at..).collect()
    };
    for slot in batch {
        local.push(slot);
    }
}

#[cold]
fn allocate() -> Slot {
    ALLOCATED.fetch_add(1, Ordering::Relaxed);
    NonNull::from(Box::leak(Box::new(MaybeUninit::<LabelRecord>::uninit())))
}

/// A free record's memory: from this thread's list, else a batch of the shared list,
/// else the allocator.
#[inline]
fn take_slot() -> Slot {
    let local = LOCAL.try_with(|l| {
        if l.head.get().is_null() {
            refill(l);
        }
        let head = l.head.get();
        let slot = NonNull::new(head)?;
        // SAFETY: a node on the list holds the `FreeSlot` its push wrote.
        l.head.set(unsafe { (*head).next });
        l.len.set(l.len.get() - 1);
        Some(slot.cast())
    });
    local.ok().flatten().unwrap_or_else(allocate)
}

/// Gives a free record's memory back: to this thread's list, its surplus to the
/// shared list (or the allocator, past the bounds; and while the thread exits).
#[inline]
fn give_slot(slot: Slot) {
    let spilled = LOCAL.try_with(|l| {
        l.push(slot);
        (l.len.get() > LOCAL_MAX).then(|| l.take_batch(BATCH))
    });
    match spilled {
        Ok(Some(batch)) => give_shared(batch),
        Ok(None) => {}
        Err(_) => dealloc(slot),
    }
}

/// A counted reference to a pooled [`LabelRecord`]: `Arc`'s contract (clone adds a
/// reference, drop removes one, the record lives while one remains), with the memory
/// going back to the pool.
pub(crate) struct RecordRef(NonNull<LabelRecord>);

// SAFETY: a `LabelRecord` is immutable but for atomics (and `Sync`); the count is
// atomic, so references may be sent and shared across threads as `Arc`'s.
unsafe impl Send for RecordRef {}
// SAFETY: as above.
unsafe impl Sync for RecordRef {}

impl RecordRef {
    /// A record holding `record`, from the pool, with one reference (this one).
    #[inline]
    pub(crate) fn new(record: LabelRecord) -> RecordRef {
        let slot = take_slot();
        record.refs.store(1, Ordering::Relaxed);
        // SAFETY: `slot` is free memory for one `LabelRecord`, owned by us until the
        // count we just set to 1 drops to 0 (`Drop`).
        unsafe { slot.as_ptr().write(MaybeUninit::new(record)) };
        RecordRef(slot.cast())
    }

    /// The record's address (what the slot and the task table hold).
    #[inline(always)]
    pub(crate) fn as_ptr(&self) -> *const LabelRecord {
        self.0.as_ptr()
    }

    /// Whether two references are to the same record.
    #[inline]
    pub(crate) fn ptr_eq(a: &RecordRef, b: &RecordRef) -> bool {
        a.0 == b.0
    }

    /// A new reference to the live record at `p`.
    ///
    /// # Safety
    /// `p` must come from [`RecordRef::as_ptr`] of a record with a reference that
    /// stays alive until this call returns.
    #[inline]
    pub(crate) unsafe fn from_live(p: *const LabelRecord) -> RecordRef {
        // SAFETY: the caller guarantees a live reference, so the record is not free.
        let r = unsafe { &*p };
        r.refs.fetch_add(1, Ordering::Relaxed);
        RecordRef(NonNull::from(r))
    }

    /// A new reference to `record`.
    #[inline]
    pub(crate) fn of(record: &LabelRecord) -> RecordRef {
        // SAFETY: every `LabelRecord` lives in the pool behind `RecordRef`s (only
        // `RecordRef::new` places one, and nothing moves one out), and a shared
        // reference to it is only reached through a live `RecordRef` (or a slot value
        // its pusher's reference keeps alive), so the record is live here.
        unsafe { RecordRef::from_live(record) }
    }

    /// Gives up this reference as a raw pointer, to be released once with
    /// [`RecordRef::release_raw`] (the task hooks keep a task's labels this way).
    #[cfg(tokio_unstable)]
    #[inline]
    pub(crate) fn into_raw(self) -> *const LabelRecord {
        let p = self.as_ptr();
        std::mem::forget(self);
        p
    }

    /// Releases a reference given up by [`RecordRef::into_raw`].
    ///
    /// # Safety
    /// `p` must come from [`RecordRef::into_raw`] and be released once.
    #[cfg(tokio_unstable)]
    #[inline]
    pub(crate) unsafe fn release_raw(p: *const LabelRecord) {
        // SAFETY: the caller passes the pointer of a reference it owns.
        drop(RecordRef(unsafe { NonNull::new_unchecked(p.cast_mut()) }));
    }
}

impl Clone for RecordRef {
    #[inline]
    fn clone(&self) -> Self {
        // Relaxed, as `Arc`: a new reference is made from one that exists.
        self.refs.fetch_add(1, Ordering::Relaxed);
        RecordRef(self.0)
    }
}

impl Drop for RecordRef {
    #[inline]
    fn drop(&mut self) {
        if self.refs.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        // The last reference: every other holder's writes happen before the reuse.
        fence(Ordering::Acquire);
        let p = self.0.as_ptr();
        // SAFETY: the count reached 0, so no other reference exists and none can be
        // made (references are only made from live ones); the record is dropped in
        // place once (its `root` reference released) and its memory goes back to the
        // pool, where only `RecordRef::new` writes it again.
        unsafe {
            std::ptr::drop_in_place(p);
            give_slot(self.0.cast());
        }
    }
}

impl Deref for RecordRef {
    type Target = LabelRecord;
    #[inline(always)]
    fn deref(&self) -> &LabelRecord {
        // SAFETY: this reference keeps the record alive and initialised.
        unsafe { self.0.as_ref() }
    }
}

impl std::fmt::Debug for RecordRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

/// What the pool has done so far: records allocated, and records whose memory went
/// back to the allocator (past the pool's bounds). Live and pooled records together
/// are the difference.
#[cfg(test)]
pub(crate) fn pool_counts() -> (u64, u64) {
    (
        ALLOCATED.load(Ordering::Relaxed),
        FREED.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::SpanLabels;

    /// The tests read process-wide counts: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn records_are_reused_from_the_pool_not_allocated_per_request() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        // Warm the pool, then make and drop many records on one thread: none is new.
        let warm: Vec<SpanLabels> = (0..4).map(|_| SpanLabels::builder().build()).collect();
        drop(warm);
        let (allocated, _) = pool_counts();
        for i in 0..10_000u64 {
            let labels = SpanLabels::builder()
                .span_id(i + 1)
                .span_name("GET /")
                .build();
            let child = labels.child(i + 2, "inner");
            drop(child);
            drop(labels);
        }
        assert_eq!(
            pool_counts().0,
            allocated,
            "records allocated in steady state"
        );
    }

    #[test]
    fn records_released_on_other_threads_come_back_through_the_shared_list() {
        // Made on this thread, released on another (a request started on one worker
        // and finished on the other), many times: they circulate through the shared
        // list, so only the first round allocates.
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let before = pool_counts();
        for _ in 0..50 {
            let batch: Vec<SpanLabels> = (0..200u64)
                .map(|i| SpanLabels::builder().span_id(i + 1).build())
                .collect();
            std::thread::spawn(move || drop(batch)).join().unwrap();
        }
        let (allocated, freed) = pool_counts();
        let live_peak = 200;
        assert!(
            allocated - before.0 <= 2 * live_peak,
            "allocated {} records for a peak of {live_peak} live",
            allocated - before.0
        );
        assert_eq!(freed, before.1, "nothing past the bounds");
    }
}
