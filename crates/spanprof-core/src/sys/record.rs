//! The label record: the identity of the work being polled, as the signal handler
//! reads it through the thread's label slot, and the pool its memory comes from. At
//! the floor of the crate (in `sys`): the slot, the handler and the ring read it, the
//! public label handles (`labels`) build it, and it knows nothing of theirs. What a
//! pop must trigger above (handing a sampled span over) is a callback set at start
//! ([`set_first_sample_callback`]).
//!
//! # The pool
//!
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
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Mutex, OnceLock};

/// Longest name (span name, route) kept; longer ones are cut at a character boundary.
pub const MAX_NAME_LEN: usize = 128;

/// A span name or route interned once, for labels built many times over: what
/// [`crate::SpanLabelsBuilder::span_name_id`] and
/// [`crate::SpanLabelsBuilder::route_id`] take, so a layer that names the same
/// routes on every request interns each name once (a lookup under the interner's
/// lock and a hash) instead of once per request.
///
/// Interning is bounded like [`crate::SpanLabelsBuilder::span_name`]: past
/// [`crate::intern_stats`]'s `max_names`, new names read [`crate::OVERFLOW_NAME`].
///
/// ```
/// use spanprof_core::{NameId, SpanLabels};
/// let name = NameId::intern("GET /cart/{id}");
/// let labels = SpanLabels::builder().span_id(1).span_name_id(name).build();
/// assert_eq!(&*labels.span_name(), "GET /cart/{id}");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NameId(pub(crate) u32);

impl NameId {
    pub(crate) const NONE: NameId = NameId(0);
    pub(crate) const OVERFLOW: NameId = NameId(1);
    pub(crate) const DETACHED: NameId = NameId(2);
}

/// [`Hotness::Slow`](crate::Hotness::Slow) as the record's state byte holds it: what
/// the signal handler promotes a record past its slow deadline to.
pub(crate) const HOT_SLOW: u8 = 2;

/// The identity a sample carries, as ids: written once into a [`LabelRecord`],
/// copied as one value into each sample by the signal handler, carried so through the
/// ring and the collector's queue, and resolved to strings ([`SampleLabels`]) once per
/// sample by the collector, whose result the store and the profile windows share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub(crate) struct LabelIds {
    pub(crate) trace_id: u128,
    pub(crate) span_id: u64,
    pub(crate) parent_span_id: u64,
    pub(crate) root_span_id: u64,
    pub(crate) span_name: NameId,
    pub(crate) route: NameId,
}

impl LabelIds {
    /// No trace, no span, no names.
    pub(crate) const NONE: LabelIds = LabelIds {
        trace_id: 0,
        span_id: 0,
        parent_span_id: 0,
        root_span_id: 0,
        span_name: NameId::NONE,
        route: NameId::NONE,
    };

    /// The ids of work still running after its span ended: no trace or span ids, the
    /// detached span name, the route kept.
    #[inline(always)]
    pub(crate) const fn detached(route: NameId) -> LabelIds {
        LabelIds {
            span_name: NameId::DETACHED,
            route,
            ..LabelIds::NONE
        }
    }

    /// Whether a span (or at least a trace) is named: what the store keeps per span.
    pub(crate) fn has_span(&self) -> bool {
        self.span_id != 0 || self.trace_id != 0
    }

    /// Whether anything is named at all, a route at least: what profile windows label.
    pub(crate) fn is_named(&self) -> bool {
        self.has_span() || self.route != NameId::NONE
    }
}

/// The record a label slot points at. Immutable but for the atomics, so a signal
/// handler that reads it through the slot's pointer never sees a torn value.
///
/// With the feature `otel-thread-ctx` it begins with its OpenTelemetry thread context
/// record (`#[repr(C)]`, offset 0), so the slot's pointer to it is also a pointer to
/// that record, as `otel_thread_ctx_v1` must hold (`sys::thread_ctx`).
#[derive(Debug)]
#[cfg_attr(spanprof_otel_ctx, repr(C))]
pub(crate) struct LabelRecord {
    #[cfg(spanprof_otel_ctx)]
    pub(crate) otel: ThreadCtxRecord,
    pub(crate) ids: LabelIds,
    /// A [`crate::Hotness`] in the low bits, raised while the work runs (slow promotion),
    /// and [`ENDED`] once the span has ended. Read as an `i8`, the byte is positive
    /// exactly when the work is hot and its span still live ([`LabelRecord::is_hot`]).
    pub(crate) state: AtomicU8,
    /// Live [`crate::SpanLabels`] handles. The span ends when the last one drops (or at
    /// [`crate::SpanLabels::end`]); references that only carry the labels into other work
    /// (inherited by spawned tasks, `spawn_blocking`, `spawn_local`) do not count.
    pub(crate) owners: AtomicUsize,
    /// Samples taken while this record was in a slot (updated by the signal handler).
    pub(crate) cpu_samples: AtomicU64,
    /// The weighted CPU estimate of those samples, in nanoseconds.
    pub(crate) cpu_ns: AtomicU64,
    /// The local root's record when this is an inner span: the handler adds this
    /// span's samples to the root's counters too, so a root's figures cover its tree.
    pub(crate) root: Option<RecordRef>,
    /// CLOCK_MONOTONIC time after which the work is promoted to `Slow` (0: never).
    pub(crate) slow_deadline_ns: u64,
    /// When a local root's labels were built, in the poll clock's ticks (0 for an
    /// inner span): its latency is measured from here.
    pub(crate) started: u64,
    /// High sampling period for this work in ns (0: the profiler's).
    pub(crate) high_ns: u64,
    /// An integration's word kept with the labels (`spanprof-tower`: the span id
    /// whose OpenTelemetry context is attached while this span is entered).
    pub(crate) anchor: u64,
    /// Poll accounting published by whoever polls this work ([`crate::PollStats`]).
    pub(crate) busy_ns: AtomicU64,
    pub(crate) polls: AtomicU64,
    pub(crate) max_poll_ns: AtomicU64,
    /// CPU time inside the polls, from the polling thread's CPU clock, when every
    /// poll was measured ([`CPU_NOT_MEASURED`] otherwise).
    pub(crate) cpu_clock_ns: AtomicU64,
    /// Time the work was runnable (woken) before its next poll began.
    pub(crate) sched_delay_ns: AtomicU64,
    /// Time inside the polls the thread was runnable but not running (preempted).
    pub(crate) preempted_ns: AtomicU64,
    /// Polls longer than the poller's long-poll threshold.
    pub(crate) long_polls: AtomicU64,
    /// [`SAMPLED`] once the signal handler has counted a sample on this record (or, for
    /// a local root, on one of its tree); [`HANDLED`] once a pop has looked at that;
    /// [`REPORT`] if the span is to be handed to the first-sample hook then
    /// (`crate::registration`).
    pub(crate) flags: AtomicU8,
    /// References to this record ([`RecordRef`]'s count).
    pub(crate) refs: AtomicUsize,
    /// The W3C trace flags of the span (bit 0: sampled), inherited by its children.
    pub(crate) trace_flags: u8,
}

/// [`LabelRecord::cpu_clock_ns`] when not every poll read the thread's CPU clock.
pub(crate) const CPU_NOT_MEASURED: u64 = u64::MAX;

/// [`LabelRecord::flags`]: a sample was counted on the record.
pub(crate) const SAMPLED: u8 = 1;
/// [`LabelRecord::flags`]: a pop has seen [`SAMPLED`] (and handed the span over if
/// [`REPORT`]).
pub(crate) const HANDLED: u8 = 2;
/// [`LabelRecord::flags`]: hand the span to the first-sample hook.
pub(crate) const REPORT: u8 = 4;
/// [`LabelRecord::flags`]: the local root's latency has been recorded.
pub(crate) const LATENCY: u8 = 8;

/// The bit of [`LabelRecord::state`] set when the span has ended. From then on the
/// signal handler writes samples of work still running under these labels as
/// *detached* (no trace or span id, span name [`crate::DETACHED_SPAN_NAME`], the route
/// kept) at the baseline rate, and counts nothing on the span.
pub(crate) const ENDED: u8 = 0x80;
/// The bits of [`LabelRecord::state`] holding the [`crate::Hotness`].
pub(crate) const HOT_BITS: u8 = 0x7f;

impl LabelRecord {
    /// Whether the work is hot and its span has not ended: one load and one signed
    /// compare, on every labelled poll.
    #[inline(always)]
    pub(crate) fn is_hot(&self) -> bool {
        (self.state.load(Ordering::Relaxed) as i8) > 0
    }

    /// Raises the hotness to at least `why`; never lowers it, and does nothing once
    /// the span has ended (an ended record's byte has the top bit set, above every
    /// hotness). The one place work is promoted: by the poll path
    /// ([`crate::PollTimer`]), the signal handler (inside a long poll) and
    /// [`crate::SpanLabels::promote`]. Returns the new state byte.
    #[inline(always)]
    pub(crate) fn promote_to(&self, hot: u8) -> u8 {
        self.state.fetch_max(hot, Ordering::Relaxed).max(hot)
    }

    /// Adds one poll of `ns` nanoseconds to the figures (polls of one span may run
    /// on several threads at once: a span entered by tasks it was handed to).
    #[inline]
    pub(crate) fn account_poll(&self, ns: u64) {
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
        self.polls.fetch_add(1, Ordering::Relaxed);
        if ns > self.max_poll_ns.load(Ordering::Relaxed) {
            self.max_poll_ns.fetch_max(ns, Ordering::Relaxed);
        }
    }

    /// Marks the span ended (idempotent). Returns whether this call ended hot work
    /// (the caller then lets the thread drop its high rate, `threads::on_hot_end`).
    pub(crate) fn end(&self) -> bool {
        // An outside reader must not charge work that outlives the span to it (the
        // handler writes such samples as detached): from now on the record reads
        // as invalid, whichever thread's slot holds it.
        #[cfg(spanprof_otel_ctx)]
        self.otel.valid.store(0, Ordering::Relaxed);
        (self.state.fetch_or(ENDED, Ordering::Release) as i8) > 0
    }
}

/// OTEP 4947's thread context record, as outside readers read it: trace id and span
/// id (W3C byte order), `valid` (1) and the W3C trace flags, then `attrs_size` bytes
/// of attributes, each a key index into the process context's
/// `threadlocal.attribute_key_map` ([`crate::otel_ctx::ATTRIBUTE_KEYS`]), a length
/// and that many UTF-8 bytes. Packed as the OTEP lays it out (28 bytes before the
/// attributes, no padding: `#[repr(C)]` puts every field at its natural alignment).
///
/// Written once when the labels are built; only `valid` changes after, cleared when
/// the span ends.
#[cfg(spanprof_otel_ctx)]
#[repr(C)]
pub(crate) struct ThreadCtxRecord {
    pub(crate) trace_id: [u8; 16],
    pub(crate) span_id: [u8; 8],
    pub(crate) valid: AtomicU8,
    pub(crate) trace_flags: u8,
    pub(crate) attrs_size: u16,
    pub(crate) attrs: [u8; THREAD_CTX_ATTRS],
}

/// Room for the attributes: the route and the span name, each at most
/// [`MAX_NAME_LEN`] bytes after its key and length. The whole record (288
/// bytes) stays under the 640 the OTEP recommends.
#[cfg(spanprof_otel_ctx)]
pub(crate) const THREAD_CTX_ATTRS: usize = 2 * (2 + MAX_NAME_LEN);

#[cfg(spanprof_otel_ctx)]
const _: () = {
    assert!(std::mem::offset_of!(ThreadCtxRecord, valid) == 24);
    assert!(std::mem::offset_of!(ThreadCtxRecord, attrs_size) == 26);
    assert!(std::mem::offset_of!(ThreadCtxRecord, attrs) == 28);
    assert!(std::mem::offset_of!(LabelRecord, otel) == 0);
};

#[cfg(spanprof_otel_ctx)]
impl ThreadCtxRecord {
    /// The record of a span: its ids, flags and attributes (`(key index, value)`,
    /// empty values left out).
    pub(crate) fn new(
        trace_id: u128,
        span_id: u64,
        trace_flags: u8,
        attributes: [(u8, &str); 2],
    ) -> Self {
        let mut attrs = [0u8; THREAD_CTX_ATTRS];
        let mut at = 0;
        for (key, value) in attributes {
            let len = value.len().min(MAX_NAME_LEN);
            if len == 0 {
                continue;
            }
            attrs[at] = key;
            attrs[at + 1] = len as u8;
            attrs[at + 2..at + 2 + len].copy_from_slice(&value.as_bytes()[..len]);
            at += 2 + len;
        }
        // No trace (a request without a trace context gets a span id of spanprof's
        // own): the OTEP wants both ids set or neither, and no flags then.
        let (span_id, trace_flags) = if trace_id == 0 {
            (0, 0)
        } else {
            (span_id, trace_flags)
        };
        ThreadCtxRecord {
            trace_id: trace_id.to_be_bytes(),
            span_id: span_id.to_be_bytes(),
            valid: AtomicU8::new(1),
            trace_flags,
            attrs_size: at as u16,
            attrs,
        }
    }
}

#[cfg(spanprof_otel_ctx)]
impl std::fmt::Debug for ThreadCtxRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadCtxRecord")
            .field("valid", &self.valid)
            .field("trace_flags", &self.trace_flags)
            .field("attrs_size", &self.attrs_size)
            .finish_non_exhaustive()
    }
}

/// What a pop of a record the handler sampled calls, once per span: set at start by
/// the layer above (`crate::registration`), which builds the span's labels for its
/// hook. Unset, sampled records are only marked handled.
static FIRST_SAMPLE: OnceLock<fn(&LabelRecord)> = OnceLock::new();

/// Sets the callback [`after_pop`] calls for each record built to report its first
/// sample ([`REPORT`]). Set once per process; later calls are ignored.
pub(crate) fn set_first_sample_callback(f: fn(&LabelRecord)) {
    let _ = FIRST_SAMPLE.set(f);
}

impl LabelRecord {
    /// Whether a pop of this record has a span to hand over: a sample landed in it
    /// since.
    #[inline(always)]
    pub(crate) fn needs_hand_over(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & (SAMPLED | HANDLED) == SAMPLED
    }
}

/// After a pop of `rec`: hands its span over if a sample landed in it since. One load
/// when nothing did.
#[inline(always)]
pub(crate) fn after_pop(rec: &LabelRecord) {
    if rec.needs_hand_over() {
        hand_over(rec);
    }
}

/// Hands `rec`'s span to the callback now, as a first sample would, once: for work
/// worth its figures though no sample landed in it (a long poll off CPU).
#[cold]
pub(crate) fn report_now(rec: &LabelRecord) {
    rec.flags.fetch_or(SAMPLED, Ordering::Relaxed);
    after_pop(rec);
}

/// Hands `rec`'s span (and its local root's, sampled through it) to the callback,
/// once each.
#[cold]
#[inline(never)]
fn hand_over(rec: &LabelRecord) {
    for r in std::iter::once(rec).chain(rec.root.as_deref()) {
        if r.flags.load(Ordering::Relaxed) & (SAMPLED | HANDLED) != SAMPLED {
            continue;
        }
        let flags = r.flags.fetch_or(HANDLED, Ordering::AcqRel);
        if flags & HANDLED != 0 || flags & REPORT == 0 {
            continue;
        }
        if let Some(f) = FIRST_SAMPLE.get() {
            f(r);
        }
    }
}

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
