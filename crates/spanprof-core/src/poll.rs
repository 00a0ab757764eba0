//! The per-poll path, in one place: what happens each time labelled work is polled,
//! whoever polls it.
//!
//! - [`push`] and [`LabelGuard`]: a scoped push, for `Labelled` futures and streams and
//!   [`SpanLabels::enter`];
//! - [`entered`]: what every push does once the slot holds the record (the scoped
//!   push, the tokio hooks' before-poll, [`SpanLabels::enter_detached`]): raise the
//!   thread to the high rate for hot work, register the thread on first use;
//! - [`PollTimer`]: a push with exact poll accounting and slow promotion, for the
//!   layer's response future and body and the tracing layer's spans.
//!
//! The signal handler reads what these write (`sys::handler`), and promotes work that
//! passes its slow deadline inside one long poll; both promote through
//! `LabelRecord::promote`.

use std::marker::PhantomData;
use std::sync::LazyLock;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::labels::SpanLabels;
use crate::line::OwnLine;
use crate::profile::Hotness;
use crate::sys;
use crate::sys::record::LabelRecord;
use crate::sys::record::RecordRef;

/// Exact poll accounting of one span: time inside polls, number of polls, longest
/// poll. Kept by the poller (no sampling involved) and published on the labels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PollStats {
    /// Wall time spent inside polls of the span's work, in nanoseconds.
    pub busy_ns: u64,
    /// Number of polls.
    pub polls: u64,
    /// Longest single poll, in nanoseconds.
    pub max_poll_ns: u64,
}

impl PollStats {
    /// Accounts one poll of `ns` nanoseconds.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.busy_ns += ns;
        self.polls += 1;
        self.max_poll_ns = self.max_poll_ns.max(ns);
    }
}

/// The per-poll half of [`SpanLabels`]: pushes and poll accounting. Here, not in
/// `labels.rs`, so the per-poll path is read in one file and depends on the labels,
/// not the other way round.
impl SpanLabels {
    /// Publishes the poll accounting of this span (replacing what was there).
    #[inline]
    pub fn publish_poll_stats(&self, stats: PollStats) {
        self.record.busy_ns.store(stats.busy_ns, Ordering::Relaxed);
        self.record.polls.store(stats.polls, Ordering::Relaxed);
        self.record
            .max_poll_ns
            .store(stats.max_poll_ns, Ordering::Relaxed);
    }

    /// The poll accounting last published.
    #[inline]
    pub fn poll_stats(&self) -> PollStats {
        PollStats {
            busy_ns: self.record.busy_ns.load(Ordering::Relaxed),
            polls: self.record.polls.load(Ordering::Relaxed),
            max_poll_ns: self.record.max_poll_ns.load(Ordering::Relaxed),
        }
    }

    /// Pushes these labels for callback-style instrumentation (an `on_enter` without
    /// a guard to hold): the previous value is kept on a small per-thread stack (with
    /// a reference to the labels, so they outlive the push) until the matching
    /// [`SpanLabels::exit_detached`] on the same thread.
    pub fn enter_detached(&self) {
        crate::sys::slot::push_span(self.record.clone(), 0, || 0, entered);
    }

    /// Pops labels pushed by [`SpanLabels::enter_detached`]. Returns false (and leaves
    /// the slot alone) if this thread has no such push, as when enter and exit ran on
    /// different threads. Exits out of order are taken apart in order: the labels stay
    /// in force until everything pushed after them has been popped.
    pub fn exit_detached(&self) -> bool {
        let popped = crate::sys::slot::pop_detached(&self.record);
        crate::sys::record::after_pop(&self.record);
        popped
    }

    /// Pushes these labels into the current thread's slot until the guard drops.
    ///
    /// The guard restores whatever was there before, so pushes nest. It must be dropped
    /// on the thread that made it (it is `!Send`).
    #[inline]
    pub fn enter(&self) -> crate::LabelGuard<'_> {
        push(&self.record)
    }
}

/// Restores the previous labels of this thread's slot when dropped.
///
/// Returned by [`SpanLabels::enter`]. Not `Send`: it must drop on the thread that
/// pushed, and guards must drop in reverse order of creation (as scopes do).
#[must_use = "the labels are popped as soon as the guard drops"]
pub struct LabelGuard<'a> {
    prev: *const LabelRecord,
    rec: &'a LabelRecord,
    /// Not `Send`: it restores this thread's slot.
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for LabelGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LabelGuard").finish_non_exhaustive()
    }
}

/// Pushes `rec` into this thread's slot until the guard drops. The hot path of every
/// labelled poll: one thread-local load and store, plus one byte read to see if the
/// work is hot (and its span still live).
#[inline(always)]
pub(crate) fn push(rec: &LabelRecord) -> LabelGuard<'_> {
    let prev = sys::slot::replace(rec);
    entered(rec);
    LabelGuard {
        prev,
        rec,
        _not_send: PhantomData,
    }
}

impl Drop for LabelGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        sys::slot::restore(self.prev);
        crate::sys::record::after_pop(self.rec);
    }
}

/// What follows every push of a record into the slot (the scoped push, the tokio
/// hooks', the detached one): hot work raises this thread to the record's high rate
/// (its own period, or the profiler's); the first labelled work on a thread registers
/// it for sampling.
#[inline(always)]
pub(crate) fn entered(rec: &LabelRecord) {
    if rec.is_hot() {
        crate::threads::on_hot_push(rec.high_ns);
    }
    crate::threads::ensure_thread_registered();
}

/// Pushes `record`, the labels of the span with id `span` (the span map's enter):
/// until [`exit_span`] of the same span on this thread, the outermost such push
/// timed as one poll of the span. Returns whether it was pushed.
#[inline]
pub(crate) fn enter_span(record: RecordRef, span: u64) -> bool {
    crate::sys::slot::push_span(record, span, || CLOCK.raw(), entered).is_some()
}

/// Pops the newest push of span `span` on this thread ([`enter_span`]); at the
/// outermost one, adds the poll to the span's figures. Returns whether there was such
/// a push.
#[inline]
pub(crate) fn exit_span(span: u64) -> bool {
    crate::sys::slot::pop_span(span, |record, entered_at| {
        record.account_poll(CLOCK.delta_as_nanos(entered_at, CLOCK.raw()));
    })
}

/// The clock of poll accounting: the TSC through quanta (a few ns a read, where
/// `Instant::now()` costs ~23 ns on these machines).
static CLOCK: OwnLine<LazyLock<quanta::Clock>> = OwnLine(LazyLock::new(quanta::Clock::new));

/// A span's poll accounting and slow promotion, kept by whoever polls its work: each
/// poll runs with the labels pushed and is timed into [`PollStats`]; work still cold
/// when it has run past its slow threshold is promoted to [`Hotness::Slow`] at the
/// start of its next poll (the signal handler promotes it inside a long poll).
///
/// Used by `spanprof-tower`'s response future and body ([`PollTimer::poll`]) and its
/// tracing layer ([`PollTimer::enter`] and [`PollTimer::exit`], for callback-style
/// instrumentation).
///
/// ```
/// use std::time::Duration;
/// use spanprof_core::{PollTimer, SpanLabels};
/// let labels = SpanLabels::builder().span_id(1).span_name("GET /").build();
/// let mut timer = PollTimer::new(Some(Duration::from_secs(1)));
/// let answer = timer.poll(&labels, || 6 * 7);
/// assert_eq!(answer, 42);
/// assert_eq!(timer.stats().polls, 1);
/// ```
#[derive(Debug, Clone)]
pub struct PollTimer {
    stats: PollStats,
    /// When the work started, in clock ticks.
    started: u64,
    /// Promote once this much time has passed since `started`; `None` once promoted
    /// (or never).
    slow_after_ns: Option<u64>,
    /// Nested [`PollTimer::enter`]s, and when the outermost began.
    depth: u32,
    entered_at: u64,
}

impl PollTimer {
    /// Starts the clock of a span's work: it is promoted to [`Hotness::Slow`] at its
    /// first poll after `slow_after` (never with `None`).
    #[inline]
    pub fn new(slow_after: Option<Duration>) -> Self {
        PollTimer {
            stats: PollStats::default(),
            started: CLOCK.raw(),
            slow_after_ns: slow_after.map(|d| d.as_nanos().min(u128::from(u64::MAX)) as u64),
            depth: 0,
            entered_at: 0,
        }
    }

    /// Calibrates the clock now (quanta spins for milliseconds on first use), so the
    /// first request does not pay for it. Layers call it when they are built.
    pub fn calibrate() {
        LazyLock::force(&CLOCK.0);
    }

    /// Runs one poll (`f`) with `labels` pushed, promoting them first if the work has
    /// run past its slow threshold, and accounts its time.
    #[inline]
    pub fn poll<T>(&mut self, labels: &SpanLabels, f: impl FnOnce() -> T) -> T {
        let t0 = CLOCK.raw();
        self.promote_if_slow(labels, t0);
        let out = {
            let _guard = labels.enter();
            f()
        };
        self.stats.record(CLOCK.delta_as_nanos(t0, CLOCK.raw()));
        out
    }

    /// The callback-style half of [`PollTimer::poll`] (a `tracing` span's enter):
    /// pushes `labels` until the matching [`PollTimer::exit`] on this thread. Enters
    /// nest; the outermost enter to its exit counts as one poll.
    pub fn enter(&mut self, labels: &SpanLabels) {
        self.depth += 1;
        if self.depth == 1 {
            self.entered_at = CLOCK.raw();
            self.promote_if_slow(labels, self.entered_at);
        }
        labels.enter_detached();
    }

    /// Pops what [`PollTimer::enter`] pushed; at the outermost exit, accounts the poll
    /// and publishes the figures on `labels`.
    pub fn exit(&mut self, labels: &SpanLabels) {
        labels.exit_detached();
        self.depth = self.depth.saturating_sub(1);
        if self.depth == 0 {
            self.stats
                .record(CLOCK.delta_as_nanos(self.entered_at, CLOCK.raw()));
            labels.publish_poll_stats(self.stats);
        }
    }

    /// The accounting so far.
    pub fn stats(&self) -> PollStats {
        self.stats
    }

    #[inline(always)]
    fn promote_if_slow(&mut self, labels: &SpanLabels, now: u64) {
        if let Some(after) = self.slow_after_ns
            && CLOCK.delta_as_nanos(self.started, now) >= after
        {
            labels.promote(Hotness::Slow);
            self.slow_after_ns = None;
        }
    }
}
