//! The per-thread label slot: one pointer to the [`LabelRecord`] of whatever is
//! being polled on this thread right now.
//!
//! Writers swap the pointer (one store) and restore the previous one when done, so
//! pushes nest. The signal handler loads the pointer once; the record it points at
//! is immutable but for atomics, so it can never observe a torn label.

#[cfg(tokio_unstable)]
use std::cell::Cell;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::labels::{LabelRecord, SpanLabels};

thread_local! {
    // `const` initialisation and no `Drop`: access is a plain TLS offset, with no lazy
    // initialisation and no destructor registration, so a signal handler may read it.
    static SLOT: AtomicPtr<LabelRecord> = const { AtomicPtr::new(ptr::null_mut()) };
}

#[cfg(tokio_unstable)]
thread_local! {
    // Saved slot values of the tokio poll hooks (before/after are separate callbacks).
    static HOOK_SAVED: Cell<[*const LabelRecord; HOOK_DEPTH]> = const { Cell::new([ptr::null(); HOOK_DEPTH]) };
    static HOOK_DEPTH_USED: Cell<usize> = const { Cell::new(0) };
}

#[cfg(tokio_unstable)]
const HOOK_DEPTH: usize = 8;

thread_local! {
    // Saved slot values of detached pushes (tracing's on_enter / on_exit).
    static DETACHED: std::cell::RefCell<Vec<(*const LabelRecord, *const LabelRecord)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most nested detached pushes per thread; deeper ones are not pushed.
const DETACHED_DEPTH: usize = 64;

/// Pushes `record` (kept alive by the caller until [`pop_detached`]) and remembers
/// the previous value. Returns whether `record` is hot.
pub(crate) fn push_detached(record: &LabelRecord) -> bool {
    let pushed = DETACHED.with(|d| {
        let mut d = d.borrow_mut();
        if d.len() >= DETACHED_DEPTH {
            return false;
        }
        let prev = replace(record);
        d.push((record as *const LabelRecord, prev));
        true
    });
    pushed && record.hot.load(std::sync::atomic::Ordering::Relaxed) != 0
}

/// Pops a [`push_detached`] of `record` if it is the newest one on this thread.
pub(crate) fn pop_detached(record: &LabelRecord) -> bool {
    DETACHED.with(|d| {
        let mut d = d.borrow_mut();
        match d.last() {
            Some(&(top, prev)) if ptr::eq(top, record) => {
                d.pop();
                restore(prev);
                true
            }
            _ => false,
        }
    })
}

/// Publishes `record` in this thread's slot and returns what was there.
#[inline(always)]
pub(crate) fn replace(record: *const LabelRecord) -> *const LabelRecord {
    SLOT.with(|s| {
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
    SLOT.with(|s| s.store(prev.cast_mut(), Ordering::Release));
}

/// The record in this thread's slot (null when none). Signal-safe.
#[inline(always)]
pub(crate) fn current_ptr() -> *const LabelRecord {
    SLOT.with(|s| s.load(Ordering::Acquire))
}

/// A new handle to the labels in this thread's slot, if any.
pub(crate) fn current() -> Option<SpanLabels> {
    let p = current_ptr();
    if p.is_null() {
        return None;
    }
    // SAFETY: 1. Every pointer stored in the slot comes from `Arc::as_ptr` of a
    // `SpanLabels` (see `crate::slot::push` and the hooks), and the pusher keeps that
    // `Arc` alive until it restores the previous value, which happens on this thread
    // after this call returns; so the strong count is at least 1 here.
    // 2. Incrementing it and then building an `Arc` from the same pointer gives us our
    // own reference, balanced when the returned `SpanLabels` drops.
    let record = unsafe {
        Arc::increment_strong_count(p);
        Arc::from_raw(p)
    };
    Some(SpanLabels { record })
}

#[cfg(tokio_unstable)]
/// Pushes for a tokio `on_before_task_poll` hook: remembers the previous value in a
/// small per-thread stack because the matching `on_after_task_poll` is a separate call.
/// Returns the record's own high period (0: the profiler's) when it is hot.
///
/// `record` must be null or a record kept alive (by a strong reference) until the
/// matching [`hook_pop`].
pub(crate) fn hook_push(record: *const LabelRecord) -> Option<u64> {
    let prev = replace(record);
    // SAFETY: the caller keeps a non-null `record` alive until `hook_pop` (the task
    // table holds a strong reference until the task terminates).
    let hot = unsafe { record.as_ref() }
        .filter(|r| r.hot.load(std::sync::atomic::Ordering::Relaxed) != 0)
        .map(|r| r.high_ns);
    let depth = HOOK_DEPTH_USED.get();
    if depth < HOOK_DEPTH {
        let mut saved = HOOK_SAVED.get();
        saved[depth] = prev;
        HOOK_SAVED.set(saved);
    }
    HOOK_DEPTH_USED.set(depth + 1);
    hot
}

#[cfg(tokio_unstable)]
/// The `on_after_task_poll` half of [`hook_push`].
pub(crate) fn hook_pop() {
    let depth = HOOK_DEPTH_USED.get();
    if depth == 0 {
        return;
    }
    let depth = depth - 1;
    HOOK_DEPTH_USED.set(depth);
    let prev = if depth < HOOK_DEPTH {
        HOOK_SAVED.get()[depth]
    } else {
        ptr::null()
    };
    restore(prev);
}

#[cfg(tokio_unstable)]
/// Takes a strong reference to the record in this thread's slot and returns it as
/// a raw pointer (null when the slot is empty). Balance with [`release_raw`].
pub(crate) fn retain_current_raw() -> *const LabelRecord {
    let p = current_ptr();
    if !p.is_null() {
        // SAFETY: see `current`: the slot's record is alive and came from an `Arc`.
        unsafe { Arc::increment_strong_count(p) };
    }
    p
}

#[cfg(tokio_unstable)]
/// Releases a reference taken by [`retain_current_raw`].
pub(crate) fn release_raw(p: *const LabelRecord) {
    if !p.is_null() {
        // SAFETY: `p` came from `retain_current_raw`, which took one strong reference
        // that has not been released yet (callers release each pointer once).
        unsafe { Arc::decrement_strong_count(p) };
    }
}
