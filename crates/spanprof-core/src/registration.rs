//! Handing a span to whoever writes its attributes, the first time a sample lands in
//! it: `spanprof-tower`'s span registry, for `SpanProfileProcessor`.
//!
//! The signal handler cannot take a lock or allocate, so it only counts the sample
//! on the record and sets its `SAMPLED` flag. Every pop of a record out of a thread's
//! slot (a `LabelGuard`, the tracing layer's exit, the tokio hooks' after-poll) then
//! loads the flags; the first to find `SAMPLED` set marks it `HANDLED` and, for labels
//! built with [`crate::SpanLabels::report_first_sample`], calls the hook. A
//! pop follows every poll a sample can land in, and a span ends after its polls, so
//! a sampled span is handed over before its end is seen. Spans no sample touches cost
//! one load per pop and nothing else.

use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use crate::labels::SpanLabels;
use crate::sys::record::{ENDED, LabelRecord, RecordRef};

/// The hook: called once per sampled span, on a thread that just popped its labels.
static HOOK: OnceLock<fn(&SpanLabels)> = OnceLock::new();

/// Sets the function called once for each span built with
/// [`crate::SpanLabels::report_first_sample`], the first time a sample lands in
/// it (or in its tree, for a local root), with its labels: how `spanprof-tower`'s span
/// registry learns which spans to write attributes for. Set once per process; later
/// calls are ignored (returns whether this one took effect).
pub fn on_first_sample(hook: fn(&SpanLabels)) -> bool {
    let set = HOOK.set(hook).is_ok();
    crate::sys::record::set_first_sample_callback(report);
    set
}

/// What a pop of a sampled record calls ([`crate::sys::record::after_pop`]), once
/// per span built with [`crate::SpanLabels::report_first_sample`]: the hook, with the
/// span's labels.
fn report(r: &LabelRecord) {
    if let Some(hook) = HOOK.get() {
        // An owning handle while the span is live, as the layer's own: whoever
        // keeps it keeps the span from ending (the registry, until the span
        // processor has the span).
        let record = RecordRef::of(r);
        let labels = if r.state.load(Ordering::Acquire) & ENDED == 0 {
            SpanLabels::owning(record)
        } else {
            SpanLabels::carrying(record)
        };
        hook(&labels);
    }
}
