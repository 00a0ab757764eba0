//! The public face of the per-thread label slot.

use std::marker::PhantomData;

use crate::labels::{LabelRecord, SpanLabels};
use crate::sys;

/// Restores the previous labels of this thread's slot when dropped.
///
/// Returned by [`SpanLabels::enter`]. Not `Send`: it must drop on the thread that
/// pushed, and guards must drop in reverse order of creation (as scopes do).
#[must_use = "the labels are popped as soon as the guard drops"]
pub struct LabelGuard<'a> {
    prev: *const LabelRecord,
    _labels: PhantomData<&'a LabelRecord>,
}

impl std::fmt::Debug for LabelGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LabelGuard").finish_non_exhaustive()
    }
}

/// Pushes `rec` into this thread's slot until the guard drops. The hot path of every
/// labelled poll: one thread-local load and store, plus one byte read to see if the
/// work is hot (and its span still live).
#[inline]
pub(crate) fn push(rec: &LabelRecord) -> LabelGuard<'_> {
    let prev = sys::slot::replace(rec);
    if rec.is_hot() {
        crate::sampler::on_hot_push(rec.high_ns);
    }
    crate::sampler::ensure_thread_registered();
    LabelGuard {
        prev,
        _labels: PhantomData,
    }
}

impl Drop for LabelGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        sys::slot::restore(self.prev);
    }
}

/// The labels active on this thread right now, if any (a new handle to them).
///
/// This is how work handed to another thread keeps its labels: capture here,
/// [`SpanLabels::enter`] there ([`crate::spawn_blocking`] and [`crate::spawn_local`]
/// do exactly that). The handle carries the labels without keeping their span alive:
/// when the span ends, work still running under them is sampled as detached (see
/// [`SpanLabels`]).
pub fn current_labels() -> Option<SpanLabels> {
    sys::slot::current().map(SpanLabels::carrying)
}
