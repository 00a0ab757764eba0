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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Waker};
use std::time::Duration;

use crate::clock::CLOCK;
use crate::labels::SpanLabels;
use crate::offcpu::{ThreadTimes, WakeStamp};
use crate::profile::Hotness;
use crate::sys;
use crate::sys::record::LabelRecord;
use crate::sys::record::RecordRef;

/// Exact poll accounting of one span: time inside polls, number of polls, longest
/// poll, and, for work profiled at the high rate, where the time inside and between
/// polls went. Kept by the poller (no sampling involved) and published on the labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PollStats {
    /// Wall time spent inside polls of the span's work, in nanoseconds.
    pub busy_ns: u64,
    /// Number of polls.
    pub polls: u64,
    /// Longest single poll, in nanoseconds.
    pub max_poll_ns: u64,
    /// CPU time inside the polls, read from the polling thread's CPU clock, when every
    /// poll read it: work profiled at the high rate from its first poll (the clock
    /// costs about 0.25 µs a read, so cold work does not read it). `None` otherwise:
    /// the sample estimate ([`crate::SpanLabels::cpu_ns`]) stands in.
    pub cpu_clock_ns: Option<u64>,
    /// Time the work was runnable, woken, before its next poll began: a busy runtime's
    /// delay. Measured for polls of work profiled at the high rate (from the poll it
    /// turned hot), through [`PollTimer::poll_with_context`].
    pub sched_delay_ns: u64,
    /// Time inside the polls the polling thread was runnable but not running:
    /// preempted by the OS on a busy machine (`/proc/thread-self/schedstat`'s run
    /// delay). Read with the CPU clock, for the same polls.
    pub preempted_ns: u64,
    /// Polls longer than the poller's long-poll threshold ([`PollTimer::long_poll`]).
    pub long_polls: u64,
}

impl Default for PollStats {
    /// No polls yet: every one of them (none) read the CPU clock.
    fn default() -> Self {
        PollStats {
            busy_ns: 0,
            polls: 0,
            max_poll_ns: 0,
            cpu_clock_ns: Some(0),
            sched_delay_ns: 0,
            preempted_ns: 0,
            long_polls: 0,
        }
    }
}

impl PollStats {
    /// Accounts one poll of `ns` nanoseconds that did not read the CPU clock.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.record_poll(ns, None);
    }

    /// Accounts one poll of `ns` nanoseconds, `cpu_ns` of them on CPU if the thread's
    /// CPU clock was read around it.
    #[inline]
    pub fn record_poll(&mut self, ns: u64, cpu_ns: Option<u64>) {
        self.busy_ns += ns;
        self.polls += 1;
        self.max_poll_ns = self.max_poll_ns.max(ns);
        self.cpu_clock_ns = match (self.cpu_clock_ns, cpu_ns) {
            (Some(sum), Some(cpu)) => Some(sum + cpu.min(ns)),
            _ => None,
        };
    }
}

/// The per-poll half of [`SpanLabels`]: pushes and poll accounting. Here, not in
/// `labels.rs`, so the per-poll path is read in one file and depends on the labels,
/// not the other way round.
impl SpanLabels {
    /// Publishes the poll accounting of this span (replacing what was there).
    #[inline]
    pub fn publish_poll_stats(&self, stats: PollStats) {
        let r = &self.record;
        r.busy_ns.store(stats.busy_ns, Ordering::Relaxed);
        r.polls.store(stats.polls, Ordering::Relaxed);
        r.max_poll_ns.store(stats.max_poll_ns, Ordering::Relaxed);
        r.cpu_clock_ns.store(
            stats
                .cpu_clock_ns
                .unwrap_or(crate::sys::record::CPU_NOT_MEASURED),
            Ordering::Relaxed,
        );
        r.sched_delay_ns
            .store(stats.sched_delay_ns, Ordering::Relaxed);
        r.preempted_ns.store(stats.preempted_ns, Ordering::Relaxed);
        r.long_polls.store(stats.long_polls, Ordering::Relaxed);
    }

    /// The poll accounting last published.
    #[inline]
    pub fn poll_stats(&self) -> PollStats {
        let r = &self.record;
        let cpu = r.cpu_clock_ns.load(Ordering::Relaxed);
        let polls = r.polls.load(Ordering::Relaxed);
        PollStats {
            busy_ns: r.busy_ns.load(Ordering::Relaxed),
            polls,
            max_poll_ns: r.max_poll_ns.load(Ordering::Relaxed),
            // Polls accounted on the record directly (`account_poll`: inner spans)
            // never read the clock.
            cpu_clock_ns: (cpu != crate::sys::record::CPU_NOT_MEASURED && polls > 0).then_some(cpu),
            sched_delay_ns: r.sched_delay_ns.load(Ordering::Relaxed),
            preempted_ns: r.preempted_ns.load(Ordering::Relaxed),
            long_polls: r.long_polls.load(Ordering::Relaxed),
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
    /// Promote once this much time has passed since `started`; 0 once promoted (or
    /// never). Not an `Option`: the response body holds a timer, and every poll moves
    /// the response, so its size is paid per poll.
    slow_after_ns: u64,
    /// Nested [`PollTimer::enter`]s, and when the outermost began.
    depth: u32,
    entered_at: u64,
    /// A poll at least this long is a long poll (0: none is).
    long_poll_ns: u64,
    /// The waker hot work's polls get: stamps the first wake after each poll.
    wake: Option<Arc<WakeStamp>>,
    /// The outermost [`PollTimer::enter`] started wall-clock sampling.
    wall: bool,
}

/// Wall-clock sampling of the calling thread while a hot poll runs: stopped when
/// dropped (a panicking poll included).
struct WallSampling(bool);

/// Runs `f` with wall-clock sampling of the calling thread.
#[inline(never)]
fn with_wall_sampling<T>(f: impl FnOnce() -> T) -> T {
    let _wall = WallSampling(crate::sys::wall_begin());
    f()
}

impl Drop for WallSampling {
    #[inline(always)]
    fn drop(&mut self) {
        if self.0 {
            crate::sys::wall_end();
        }
    }
}

/// The default long-poll threshold ([`PollTimer::long_poll`]): a poll that holds a
/// runtime worker this long delays every task queued behind it.
pub const DEFAULT_LONG_POLL: Duration = Duration::from_millis(10);

/// A long poll of cold work (no CPU clock read) is reported (logged) only at this many
/// times the threshold: shorter ones may be the OS preempting the thread.
const COLD_REPORT_FACTOR: u64 = 5;

/// A long poll is logged at warn only at this many times the threshold.
const WARN_FACTOR: u64 = 2;

/// Long polls seen in this process ([`long_polls`]).
static LONG_POLLS: AtomicU64 = AtomicU64::new(0);

/// Polls longer than their poller's long-poll threshold, in this process so far
/// (each is also counted on its span, `spanprof.long_polls`).
pub fn long_polls() -> u64 {
    LONG_POLLS.load(Ordering::Relaxed)
}

impl PollTimer {
    /// Starts the clock of a span's work: it is promoted to [`Hotness::Slow`] at its
    /// first poll after `slow_after` (never with `None`).
    #[inline]
    pub fn new(slow_after: Option<Duration>) -> Self {
        PollTimer {
            stats: PollStats::default(),
            started: CLOCK.raw(),
            slow_after_ns: slow_after
                .map_or(0, |d| d.as_nanos().clamp(1, u128::from(u64::MAX)) as u64),
            depth: 0,
            entered_at: 0,
            long_poll_ns: DEFAULT_LONG_POLL.as_nanos() as u64,
            wake: None,
            wall: false,
        }
    }

    /// Counts polls of at least `threshold` as long polls (`None`: none is). Defaults
    /// to [`DEFAULT_LONG_POLL`]. Every long poll is counted on the span
    /// ([`PollStats::long_polls`]), which then gets its figures though no sample may
    /// have landed in it. For work profiled at the high rate (which reads the CPU
    /// clock and the run delay, and leaves time the OS preempted the thread out of
    /// the poll's), a long poll of [`PollTimer::poll`] or
    /// [`PollTimer::poll_with_context`] also adds an INFO event `spanprof.long_poll`
    /// (its duration, CPU, preemption, and whether it was blocked off CPU) to the
    /// `tracing` span current around the poll, and is logged at WARN: the first, then
    /// at most one a minute. Cold work's long polls are logged only past five times
    /// the threshold, where a busy machine is an unlikely cause.
    #[inline]
    pub fn long_poll(mut self, threshold: Option<Duration>) -> Self {
        self.long_poll_ns =
            threshold.map_or(0, |d| d.as_nanos().clamp(1, u128::from(u64::MAX)) as u64);
        self
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
        // Hot work from its first poll reads the thread's CPU clock and run delay
        // around each poll (two CPU-clock reads, about 0.4 µs; the run delay is read
        // again only after the thread was off CPU: hot work only).
        let clock = self.stats.cpu_clock_ns.is_some() && labels.record.is_hot();
        let before = if clock {
            ThreadTimes::now()
        } else {
            ThreadTimes::default()
        };
        let out = {
            let _guard = labels.enter();
            // Hot work is sampled by wall-clock time too while it is polled. Out of
            // line: a guard here makes every cold poll copy its output (measured:
            // +100 instructions a poll, a memcpy of the response).
            if labels.record.is_hot() {
                with_wall_sampling(f)
            } else {
                f()
            }
        };
        let ns = CLOCK.delta_as_nanos(t0, CLOCK.raw());
        let spent = clock.then(|| ThreadTimes::now().since(before));
        let cpu = spent.map(|s| s.cpu_ns.min(ns));
        self.stats.record_poll(ns, cpu);
        let preempted = match (spent, cpu) {
            (Some(s), Some(cpu)) => s.run_delay_ns.min(ns - cpu),
            _ => 0,
        };
        self.stats.preempted_ns += preempted;
        // Time the OS took the thread away is not the poll's: hot work, which reads
        // the run delay, leaves it out.
        if self.long_poll_ns != 0 && ns - preempted >= self.long_poll_ns {
            self.on_long_poll(labels, ns, cpu, preempted);
        }
        out
    }

    /// [`PollTimer::poll`] for a future's `poll`, with its `cx`: for work profiled at
    /// the high rate, the inner future gets a waker that records when it is woken,
    /// and the time from that wake to the next poll counts as scheduling delay
    /// ([`PollStats::sched_delay_ns`]). Cold work gets `cx` as it is.
    #[inline]
    pub fn poll_with_context<T>(
        &mut self,
        labels: &SpanLabels,
        cx: &mut Context<'_>,
        f: impl FnOnce(&mut Context<'_>) -> T,
    ) -> T {
        if !labels.record.is_hot() {
            return self.poll(labels, || f(cx));
        }
        self.poll_stamped(labels, cx, f)
    }

    #[inline(never)]
    fn poll_stamped<T>(
        &mut self,
        labels: &SpanLabels,
        cx: &mut Context<'_>,
        f: impl FnOnce(&mut Context<'_>) -> T,
    ) -> T {
        let start = CLOCK.raw();
        let stamp = self.wake.get_or_insert_with(WakeStamp::take).clone();
        let woken = stamp.at.swap(0, Ordering::Relaxed);
        if woken != 0 {
            self.stats.sched_delay_ns += CLOCK.delta_as_nanos(woken, start);
        }
        {
            let mut inner = stamp.inner.lock().unwrap_or_else(|e| e.into_inner());
            if !inner.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *inner = Some(cx.waker().clone());
            }
        }
        let waker = Waker::from(stamp.clone());
        let mut stamped = Context::from_waker(&waker);
        let out = self.poll(labels, || f(&mut stamped));
        // Woken during the poll: runnable from its end.
        let end = CLOCK.raw();
        let during = stamp.at.load(Ordering::Relaxed);
        if during != 0 && during < end {
            let _ = stamp
                .at
                .compare_exchange(during, end, Ordering::Relaxed, Ordering::Relaxed);
        }
        out
    }

    /// Counts a long poll and reports it: an event on the current `tracing` span and,
    /// rate limited, a warning naming the span and its route.
    #[cold]
    #[inline(never)]
    fn on_long_poll(&mut self, labels: &SpanLabels, ns: u64, cpu: Option<u64>, preempted: u64) {
        self.stats.long_polls += 1;
        LONG_POLLS.fetch_add(1, Ordering::Relaxed);
        // The span gets its figures (its long polls among them) though no CPU sample
        // may land in a poll spent blocked.
        labels.publish_poll_stats(self.stats);
        crate::sys::record::report_now(&labels.record);
        // Cold work reads no CPU clock: its long poll may be the OS's doing (a busy
        // machine preempting the thread), so it is counted, and reported only when
        // far past the threshold; the event needs the clock.
        if cpu.is_none() && ns < COLD_REPORT_FACTOR * self.long_poll_ns {
            return;
        }
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("unnamed");
        // Blocked off CPU for most of it (in a system call, on a lock; not merely
        // preempted), when the CPU clock was read; unknown otherwise.
        let off_cpu = cpu.map(|c| ns.saturating_sub(c).saturating_sub(preempted) > ns / 2);
        let (name, route) = (labels.span_name(), labels.route());
        if let (Some(off_cpu), Some(cpu)) = (off_cpu, cpu) {
            tracing::info!(
                target: "spanprof::long_poll",
                duration_ns = ns as i64,
                cpu_ns = cpu as i64,
                preempted_ns = preempted as i64,
                off_cpu,
                thread,
                "spanprof.long_poll"
            );
        }
        // The warning is for what a user must fix: twice the threshold. A loaded
        // machine holds a thread off CPU past the threshold now and then (page
        // faults, reclaim; 15 ms seen in CI on a correct set-up), which the count and
        // the event above still show.
        let warn = ns >= WARN_FACTOR * self.long_poll_ns;
        let sampled = off_cpu.is_some() && sys::wall_period() != 0;
        if !warn && !sampled {
            return;
        }
        let report = crate::long_poll::Report {
            span_id: labels.span_id(),
            name: name.to_string(),
            route: route.to_string(),
            ns,
            off_cpu,
            thread: thread.to_owned(),
            at_ns: sys::monotonic_now_ns(),
            warn,
        };
        // Hot work has wall-clock samples of the poll: the event's stack and the
        // warning wait for them (the collector keeps the one and logs the other,
        // naming the frame). Else the warning goes now.
        if sampled {
            crate::long_poll::defer(report);
        } else {
            crate::long_poll::warn(&report, None);
        }
    }

    /// The callback-style half of [`PollTimer::poll`] (a `tracing` span's enter):
    /// pushes `labels` until the matching [`PollTimer::exit`] on this thread. Enters
    /// nest; the outermost enter to its exit counts as one poll.
    pub fn enter(&mut self, labels: &SpanLabels) {
        self.depth += 1;
        if self.depth == 1 {
            self.entered_at = CLOCK.raw();
            self.promote_if_slow(labels, self.entered_at);
            labels.enter_detached();
            self.wall = labels.record.is_hot() && crate::sys::wall_begin();
            return;
        }
        labels.enter_detached();
    }

    /// Pops what [`PollTimer::enter`] pushed; at the outermost exit, accounts the poll
    /// and publishes the figures on `labels`.
    pub fn exit(&mut self, labels: &SpanLabels) {
        if self.depth == 1 && self.wall {
            self.wall = false;
            crate::sys::wall_end();
        }
        labels.exit_detached();
        self.depth = self.depth.saturating_sub(1);
        if self.depth == 0 {
            let ns = CLOCK.delta_as_nanos(self.entered_at, CLOCK.raw());
            self.stats.record(ns);
            if self.long_poll_ns != 0 && ns >= self.long_poll_ns {
                self.stats.long_polls += 1;
                LONG_POLLS.fetch_add(1, Ordering::Relaxed);
            }
            labels.publish_poll_stats(self.stats);
        }
    }

    /// The accounting so far.
    pub fn stats(&self) -> PollStats {
        self.stats
    }
}

impl Drop for PollTimer {
    fn drop(&mut self) {
        if let Some(stamp) = self.wake.take() {
            WakeStamp::give_back(stamp);
        }
    }
}

impl PollTimer {
    #[inline(always)]
    fn promote_if_slow(&mut self, labels: &SpanLabels, now: u64) {
        if self.slow_after_ns != 0 && CLOCK.delta_as_nanos(self.started, now) >= self.slow_after_ns
        {
            labels.promote(Hotness::Slow);
            self.slow_after_ns = 0;
        }
    }
}
