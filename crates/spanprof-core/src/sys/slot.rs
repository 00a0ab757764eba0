//! The per-thread label slot: one pointer to the [`LabelRecord`] of whatever is
//! being polled on this thread right now.
//!
//! Writers swap the pointer (one store) and restore the previous one when done, so
//! pushes nest. The signal handler loads the pointer once; the record it points at
//! is immutable but for atomics, so it can never observe a torn label.

use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use super::record::LabelRecord;
use super::record::RecordRef;

#[cfg(not(spanprof_otel_ctx))]
thread_local! {
    // `const` initialisation and no `Drop`: access is a plain TLS offset, with no lazy
    // initialisation and no destructor registration, so a signal handler may read it.
    static SLOT: AtomicPtr<LabelRecord> = const { AtomicPtr::new(ptr::null_mut()) };
}

/// Runs `f` with this thread's slot: a Rust thread-local, or with the feature
/// `otel-thread-ctx` the exported TLS variable `otel_thread_ctx_v1`
/// (`super::thread_ctx`), which outside profilers read.
#[inline(always)]
fn with_slot<R>(f: impl FnOnce(&AtomicPtr<LabelRecord>) -> R) -> R {
    #[cfg(not(spanprof_otel_ctx))]
    return SLOT.with(f);
    #[cfg(spanprof_otel_ctx)]
    return super::thread_ctx::with_slot(f);
}

/// The tokio poll hooks' state on one thread, laid out so that a poll at depth one
/// (the usual case) touches its first cache line only: the depth, the task cache
/// (`crate::hooks`), the first saved value.
#[cfg(tokio_unstable)]
#[repr(C, align(64))]
struct HookState {
    depth: Cell<usize>,
    /// How many of `deferred` are in use.
    deferred_len: Cell<usize>,
    /// The labelled tasks this thread polled last, (task key, record), one place per
    /// key modulo their number (see `crate::hooks`).
    recent: [Cell<(u64, *const LabelRecord)>; HOOK_RECENT],
    /// Saved slot values of the poll hooks (before/after are separate callbacks), with
    /// the key of the task each level polls.
    saved: [Cell<(*const LabelRecord, u64)>; HOOK_DEPTH],
    /// Records whose task terminated inside its own poll: released by the after-poll
    /// hook once the slot no longer points at them.
    deferred: [Cell<*const LabelRecord>; HOOK_DEPTH],
}

#[cfg(tokio_unstable)]
thread_local! {
    // `const` and no `Drop`: a plain thread-local offset.
    static HOOKS: HookState = const {
        HookState {
            depth: Cell::new(0),
            deferred_len: Cell::new(0),
            recent: [const { Cell::new((0, ptr::null())) }; HOOK_RECENT],
            saved: [const { Cell::new((ptr::null(), 0)) }; HOOK_DEPTH],
            deferred: [const { Cell::new(ptr::null()) }; HOOK_DEPTH],
        }
    };
}

#[cfg(tokio_unstable)]
const HOOK_DEPTH: usize = 8;
/// Places of the task cache.
#[cfg(tokio_unstable)]
pub(crate) const HOOK_RECENT: usize = 2;

#[cfg(tokio_unstable)]
const _: () = assert!(std::mem::offset_of!(HookState, saved) + 16 <= 64);

/// The task cache's entry for task `key`: (key, record) as last set.
#[cfg(tokio_unstable)]
#[inline(always)]
pub(crate) fn recent_task(key: u64) -> (u64, *const LabelRecord) {
    HOOKS.with(|h| h.recent[key as usize % HOOK_RECENT].get())
}

/// Sets the task cache's entry for task `key`.
#[cfg(tokio_unstable)]
#[inline]
pub(crate) fn set_recent_task(key: u64, record: *const LabelRecord) {
    HOOKS.with(|h| h.recent[key as usize % HOOK_RECENT].set((key, record)));
}

/// Forgets task `key` in the task cache, if it is there.
#[cfg(tokio_unstable)]
#[inline]
pub(crate) fn forget_recent_task(key: u64) {
    HOOKS.with(|h| {
        let c = &h.recent[key as usize % HOOK_RECENT];
        if c.get().0 == key {
            c.set((0, ptr::null()));
        }
    });
}

/// The innermost `tracing` span entered on this thread outside labelled work that
/// nothing profiles: its metadata (`&'static tracing::Metadata`, as an address; 0 for
/// none). The signal handler copies it into each sample, so the collector can tell
/// CPU spent under such spans, per callsite. The enclosing ones are kept, with the
/// ids of the spans that pushed them, to restore on exit.
struct OuterSpans {
    current: AtomicUsize,
    depth: Cell<usize>,
    saved: [Cell<(u64, usize)>; OUTER_DEPTH],
}

thread_local! {
    // `const` and no `Drop`, as the slot: the handler reads `current`.
    static OUTER: OuterSpans = const {
        OuterSpans {
            current: AtomicUsize::new(0),
            depth: Cell::new(0),
            saved: [const { Cell::new((0, 0)) }; OUTER_DEPTH],
        }
    };
}

/// Nested unprofiled spans remembered per thread; deeper ones are not tracked.
const OUTER_DEPTH: usize = 16;

/// Marks span `id`, of callsite `meta`, entered on this thread outside labelled work
/// (see [`OuterSpans`]).
#[inline]
pub(crate) fn enter_outer_span(id: u64, meta: &'static tracing::Metadata<'static>) {
    OUTER.with(|o| {
        let depth = o.depth.get();
        if let Some(saved) = o.saved.get(depth) {
            saved.set((id, o.current.load(Ordering::Relaxed)));
            o.current
                .store(std::ptr::from_ref(meta) as usize, Ordering::Relaxed);
        }
        o.depth.set(depth + 1);
    });
}

/// Undoes [`enter_outer_span`] of span `id`, if it is the innermost. Returns whether
/// it was.
#[inline]
pub(crate) fn exit_outer_span(id: u64) -> bool {
    OUTER.with(|o| {
        let Some(depth) = o.depth.get().checked_sub(1) else {
            return false;
        };
        if let Some(saved) = o.saved.get(depth) {
            let (top, prev) = saved.get();
            if top != id {
                return false;
            }
            o.current.store(prev, Ordering::Relaxed);
        }
        o.depth.set(depth);
        true
    })
}

/// The innermost unprofiled span's callsite on this thread (0: none). Signal-safe.
#[inline(always)]
pub(crate) fn outer_span() -> usize {
    OUTER.with(|o| o.current.load(Ordering::Relaxed))
}

/// The callsite metadata behind an address [`outer_span`] returned.
pub(crate) fn outer_span_metadata(addr: usize) -> Option<&'static tracing::Metadata<'static>> {
    // SAFETY: every non-zero address in `OuterSpans::current` comes from a
    // `&'static tracing::Metadata<'static>` (`enter_outer_span`), which lives for the
    // rest of the program.
    (addr != 0).then(|| unsafe { &*(addr as *const tracing::Metadata<'static>) })
}

/// One detached push: the labels (a strong reference, so they outlive the push), the
/// slot value to restore, whether its exit came already (out of order), and for a
/// span's push (`push_span`) its span id and, if it is the outermost push of its
/// labels on this thread, when it began (0 otherwise).
struct DetachedPush {
    record: RecordRef,
    prev: *const LabelRecord,
    exited: bool,
    span: u64,
    entered_at: u64,
}

/// This thread's detached pushes (tracing's on_enter / on_exit), oldest first.
struct DetachedStack(Vec<DetachedPush>);

impl Drop for DetachedStack {
    fn drop(&mut self) {
        // The thread is exiting with pushes in: empty the slot before the records
        // they reference may be freed.
        if !self.0.is_empty() {
            restore(ptr::null());
        }
    }
}

thread_local! {
    static DETACHED: std::cell::RefCell<DetachedStack> = const { std::cell::RefCell::new(DetachedStack(Vec::new())) };
}

/// Most nested detached pushes per thread; deeper ones are not pushed.
const DETACHED_DEPTH: usize = 64;

/// Pushes `record` for the span with id `span` (0: none) and remembers the previous
/// value until [`pop_span`] (or [`pop_detached`]). If no push of the same record is
/// in force on this thread, this one is the outermost and `now()` stamps it;
/// `entered` runs once the slot holds it. Returns whether it was the outermost, or
/// `None` when not pushed (past [`DETACHED_DEPTH`]).
#[inline]
pub(crate) fn push_span(
    record: RecordRef,
    span: u64,
    now: impl FnOnce() -> u64,
    entered: impl FnOnce(&LabelRecord),
) -> Option<bool> {
    DETACHED.with(|d| {
        let d = &mut d.borrow_mut().0;
        if d.len() >= DETACHED_DEPTH {
            return None;
        }
        let outermost = !d
            .iter()
            .any(|p| !p.exited && RecordRef::ptr_eq(&p.record, &record));
        let entered_at = if outermost { now().max(1) } else { 0 };
        let prev = replace(record.as_ptr());
        entered(&record);
        d.push(DetachedPush {
            record,
            prev,
            exited: false,
            span,
            entered_at,
        });
        Some(outermost)
    })
}

/// Pops the newest [`push_detached`] of `record` on this thread. An exit out of
/// order (something pushed later is still in) is remembered and carried out once
/// everything pushed after it is gone, so a record stays referenced for as long as
/// the slot or a saved value may point at it. Returns whether there was such a push.
pub(crate) fn pop_detached(record: &LabelRecord) -> bool {
    pop_where(|p| ptr::eq(p.record.as_ptr(), record), |_, _| {})
}

/// Pops the newest push of span `span` on this thread (see [`pop_detached`] for
/// exits out of order), calling `outermost(record, entered_at)` first if it was the
/// outermost push of its labels. Returns whether there was such a push.
#[inline]
pub(crate) fn pop_span(span: u64, outermost: impl FnOnce(&LabelRecord, u64)) -> bool {
    pop_where(|p| p.span == span, outermost)
}

#[inline]
fn pop_where(
    which: impl Fn(&DetachedPush) -> bool,
    outermost: impl FnOnce(&LabelRecord, u64),
) -> bool {
    let popped = DETACHED.with(|d| {
        let d = &mut d.borrow_mut().0;
        let i = d.iter().rposition(|p| !p.exited && which(p))?;
        d[i].exited = true;
        if d[i].entered_at != 0 {
            outermost(&d[i].record, d[i].entered_at);
        }
        // A sampled span is handed over after this thread-local's borrow (the hook
        // is anyone's code): keep it alive until then.
        let hand_over = d[i].record.needs_hand_over().then(|| d[i].record.clone());
        // Unwind every exited push on top whose record is what the slot holds.
        while let Some(top) = d.last() {
            if !top.exited || current_ptr() != top.record.as_ptr() {
                break;
            }
            let top = d.pop().expect("non-empty");
            restore(top.prev);
            // Dropping the record here never re-enters this thread-local.
            drop(top);
        }
        Some(hand_over)
    });
    match popped {
        Some(hand_over) => {
            if let Some(record) = hand_over {
                super::record::after_pop(&record);
            }
            true
        }
        None => false,
    }
}

/// Publishes `record` in this thread's slot and returns what was there.
#[inline(always)]
pub(crate) fn replace(record: *const LabelRecord) -> *const LabelRecord {
    with_slot(|s| {
        let prev = s.load(Ordering::Relaxed);
        // Release: the handler that interrupts this thread after the store sees the
        // record's contents (a plain store on x86_64).
        s.store(record.cast_mut(), Ordering::Release);
        prev
    })
}

/// Restores a value returned by [`replace`].
#[inline(always)]
pub(crate) fn restore(prev: *const LabelRecord) {
    with_slot(|s| s.store(prev.cast_mut(), Ordering::Release));
}

/// The record in this thread's slot (null when none). Signal-safe.
#[inline(always)]
pub(crate) fn current_ptr() -> *const LabelRecord {
    with_slot(|s| s.load(Ordering::Acquire))
}

/// Runs `f` on the label record in this thread's slot, if any, without taking a
/// reference to it.
#[inline]
pub(crate) fn with_current<R>(f: impl FnOnce(&LabelRecord) -> R) -> Option<R> {
    let p = current_ptr();
    // SAFETY: a non-null slot value is a record its pusher keeps a strong reference
    // to until it restores the slot, which happens on this thread, after `f` returns
    // (see `current`).
    unsafe { p.as_ref() }.map(f)
}

/// A new reference to the label record in this thread's slot, if any.
#[inline]
pub(crate) fn current() -> Option<RecordRef> {
    let p = current_ptr();
    if p.is_null() {
        return None;
    }
    // SAFETY: every pointer stored in the slot comes from `RecordRef::as_ptr` of a
    // label record (see `crate::poll::push`, the detached pushes and the hooks), and
    // the pusher keeps a reference until it restores the previous value, which happens
    // on this thread after this call returns.
    Some(unsafe { RecordRef::from_live(p) })
}

#[cfg(tokio_unstable)]
/// Pushes for a tokio `on_before_task_poll` hook of the task with key `task`:
/// remembers the previous value in a small per-thread stack because the matching
/// `on_after_task_poll` is a separate call. Then hands a non-null record to
/// `entered` (what every push does next, `crate::poll::entered`).
///
/// `record` must be null or a record kept alive (by a strong reference) until the
/// matching [`hook_pop`] ([`hook_release`] defers a release that would come sooner).
#[inline]
pub(crate) fn hook_push(record: *const LabelRecord, task: u64, entered: fn(&LabelRecord)) {
    let prev = replace(record);
    HOOKS.with(|h| {
        let depth = h.depth.get();
        if let Some(saved) = h.saved.get(depth) {
            saved.set((prev, task));
        }
        h.depth.set(depth + 1);
    });
    // SAFETY: the caller keeps a non-null `record` alive until `hook_pop` (the task
    // table holds a strong reference until the task terminates, and a release at
    // terminate inside this poll is deferred to `hook_pop`).
    if let Some(r) = unsafe { record.as_ref() } {
        entered(r);
    }
}

#[cfg(tokio_unstable)]
/// The `on_after_task_poll` half of [`hook_push`]; releases the records whose tasks
/// terminated inside the poll once the outermost hooked poll is over.
#[inline]
pub(crate) fn hook_pop() {
    let Some((depth, prev)) = HOOKS.with(|h| {
        let depth = h.depth.get().checked_sub(1)?;
        h.depth.set(depth);
        Some((depth, h.saved.get(depth).map_or(ptr::null(), |s| s.get().0)))
    }) else {
        return;
    };
    let popped = current_ptr();
    restore(prev);
    // SAFETY: `popped` is what this hook pushed (or an unbalanced push inside the poll
    // restored by now): a record its task table entry keeps alive, since releases at
    // terminate are deferred to after this point.
    if let Some(r) = unsafe { popped.as_ref() } {
        super::record::after_pop(r);
    }
    if depth == 0 {
        let n = HOOKS.with(|h| h.deferred_len.replace(0));
        for i in 0..n {
            release_raw(HOOKS.with(|h| h.deferred[i].replace(ptr::null())));
        }
    }
}

#[cfg(tokio_unstable)]
/// Releases the table's reference to `record` for the terminating task `task`. tokio
/// runs the terminate hook inside the task's final poll, before the after-poll hook,
/// while this thread's slot (or a saved value) may still point at the record: then
/// the release waits for [`hook_pop`]. A task terminated outside its own poll
/// (aborted while idle, runtime shutdown) is in no slot, and is released now.
pub(crate) fn hook_release(record: *const LabelRecord, task: u64) {
    if record.is_null() {
        return;
    }
    let deferred = HOOKS.with(|h| {
        let depth = h.depth.get();
        let in_poll = depth > HOOK_DEPTH
            || h.saved[..depth.min(HOOK_DEPTH)]
                .iter()
                .any(|s| s.get().1 == task);
        if !in_poll {
            return None;
        }
        let n = h.deferred_len.get();
        if n < HOOK_DEPTH {
            h.deferred[n].set(record);
            h.deferred_len.set(n + 1);
            return Some(true);
        }
        Some(false)
    });
    if let Some(deferred) = deferred {
        if deferred {
            return;
        }
        // More terminations inside one poll than levels of nesting: only possible
        // beyond the saved depth. Keep the record (a bounded leak) rather than free
        // what a slot may still point at.
        LEAKED_AT_TERMINATE.fetch_add(1, Ordering::Relaxed);
        return;
    }
    release_raw(record);
}

#[cfg(tokio_unstable)]
/// Records kept alive for good because a termination could not be deferred.
pub(crate) static LEAKED_AT_TERMINATE: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

#[cfg(tokio_unstable)]
/// Takes a reference to the record in this thread's slot and returns it as a raw
/// pointer (null when the slot is empty). Balance with [`release_raw`].
pub(crate) fn retain_current_raw() -> *const LabelRecord {
    current().map_or(ptr::null(), RecordRef::into_raw)
}

#[cfg(tokio_unstable)]
/// Releases a reference taken by [`retain_current_raw`].
pub(crate) fn release_raw(p: *const LabelRecord) {
    if !p.is_null() {
        // SAFETY: `p` came from `retain_current_raw`, which took one reference that has
        // not been released yet (callers release each pointer once).
        unsafe { RecordRef::release_raw(p) };
    }
}
