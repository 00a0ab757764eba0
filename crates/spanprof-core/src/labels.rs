//! Span labels: the identity of the work being polled, as written into every sample.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};

use crate::sys::record::RecordRef;

use crate::intern::{self, NameId};
use crate::profile::Hotness;
use crate::sys;
use crate::sys::record::{ENDED, HOT_BITS, LabelIds, LabelRecord};

/// The labels of one span: trace id, span id, local-root span id, span name, route
/// and whether the work is *hot* (profiled at the high rate).
///
/// Cloning is cheap (two atomic increments). Push them around a poll with
/// [`SpanLabels::enter`], wrap a future with [`crate::WithSpanLabels::with_span_labels`],
/// or let the tokio hooks carry them into spawned tasks.
///
/// **The span ends when the last handle made by the builder (or cloned from one)
/// drops**, or at [`SpanLabels::end`]; handles from [`crate::current_labels`] carry
/// the labels into other work without keeping the span alive. Work
/// that outlives it, such as a task spawned by the request that keeps running after
/// the response (a client connection task, a lazily started worker), is sampled from
/// then on as *detached*: at the baseline rate, with no trace or span id, the span
/// name [`crate::DETACHED_SPAN_NAME`] and the route of the span that spawned it. So
/// no sample ever carries the id of a span that had ended when it was taken.
///
/// ```
/// use spanprof_core::SpanLabels;
/// let labels = SpanLabels::builder()
///     .trace_id(0x4bf92f3577b34da6a3ce929d0e0e4736)
///     .span_id(0x00f067aa0ba902b7)
///     .span_name("POST /checkout")
///     .route("/checkout")
///     .build();
/// assert_eq!(labels.span_id_hex(), "00f067aa0ba902b7");
/// ```
pub struct SpanLabels {
    pub(crate) record: RecordRef,
    /// Whether this handle keeps the span alive (handles from
    /// [`crate::current_labels`] only carry the labels).
    owner: bool,
}

impl Clone for SpanLabels {
    fn clone(&self) -> Self {
        if self.owner {
            SpanLabels::owning(self.record.clone())
        } else {
            SpanLabels::carrying(self.record.clone())
        }
    }
}

impl Drop for SpanLabels {
    fn drop(&mut self) {
        if self.owner && self.record.owners.fetch_sub(1, Ordering::AcqRel) == 1 {
            end(&self.record);
        }
    }
}

/// Ends the span of `record`. Hot work ending on this thread pauses the thread's high
/// rate (its perf event keeps the rest of the interval for the next hot push) unless
/// the work it is polling is hot too (`sys::on_hot_end`).
#[inline]
fn end(record: &LabelRecord) {
    if record.end() {
        crate::threads::on_hot_end();
    }
}

impl SpanLabels {
    /// A new owning handle to `record`.
    #[inline]
    pub(crate) fn owning(record: RecordRef) -> SpanLabels {
        record.owners.fetch_add(1, Ordering::Relaxed);
        SpanLabels {
            record,
            owner: true,
        }
    }

    /// The owning handle of a record built with one owner counted already.
    #[inline]
    fn owned(record: RecordRef) -> SpanLabels {
        SpanLabels {
            record,
            owner: true,
        }
    }

    /// Gives up this handle as its record and whether it owns the span, without
    /// touching the counts (the span map keeps it so; [`SpanLabels::from_parts`]
    /// makes the handle again).
    #[inline]
    pub(crate) fn into_parts(mut self) -> (RecordRef, bool) {
        // Dropped as a non-owner, the handle leaves the owner count alone.
        let owner = std::mem::replace(&mut self.owner, false);
        (self.record.clone(), owner)
    }

    /// A handle again from [`SpanLabels::into_parts`].
    #[inline]
    pub(crate) fn from_parts(record: RecordRef, owner: bool) -> SpanLabels {
        SpanLabels { record, owner }
    }

    /// The integration's word kept with the labels
    /// ([`SpanLabelsBuilder::anchor`]; 0 when unset).
    #[doc(hidden)]
    #[inline]
    pub fn anchor(&self) -> u64 {
        self.record.anchor
    }

    /// A handle to `record` that carries the labels without keeping the span alive.
    #[inline]
    pub(crate) fn carrying(record: RecordRef) -> SpanLabels {
        SpanLabels {
            record,
            owner: false,
        }
    }

    /// Ends the span now, whatever handles are left: from now on work still running
    /// under these labels is sampled as detached (see the type's documentation).
    /// Dropping the last handle does the same.
    #[inline]
    pub fn end(&self) {
        end(&self.record);
    }

    /// Withdraws these labels from OpenTelemetry's thread context (feature
    /// `otel-thread-ctx`): from now on a profiler outside the process reads their
    /// record as invalid, whichever thread polls them, while spanprof's own samples
    /// still carry them until the span ends. For the end of a request's work, which
    /// comes before its span's end (`ProfileCorrelationLayer` calls it when the
    /// response is complete): OpenTelemetry stamps a span's end at its last exit,
    /// and a task the request spawned may still be inside its last poll then.
    /// Does nothing without the feature.
    pub fn withdraw_thread_context(&self) {
        #[cfg(spanprof_otel_ctx)]
        self.record.otel.valid.store(0, Ordering::Release);
    }

    /// Whether the span has ended.
    #[inline]
    pub fn is_ended(&self) -> bool {
        self.record.state.load(Ordering::Acquire) & ENDED != 0
    }

    /// Records that this local root's work is over, for the latency classes of its
    /// route (`span_latency` on its samples): its duration from the moment its
    /// labels were built. The first call counts; the layers make it when a request
    /// (or a `profile_roots` span) ends. Does nothing for an inner span's labels or
    /// labels without a route.
    pub fn record_latency(&self) {
        use crate::sys::record::{LATENCY, SAMPLED};
        let r = &self.record;
        // Called at the body's end and again as it drops: the second call reads.
        if r.root.is_some()
            || r.started == 0
            || r.ids.route == NameId::NONE
            || r.flags.load(Ordering::Relaxed) & LATENCY != 0
        {
            return;
        }
        let now = crate::clock::CLOCK.raw();
        let flags = r.flags.fetch_or(LATENCY, Ordering::AcqRel);
        if flags & LATENCY != 0 {
            return;
        }
        let ns = crate::clock::CLOCK.delta_as_nanos(r.started, now);
        let sampled = flags & SAMPLED != 0;
        crate::latency::record(r.ids.route, r.ids.root_span_id, ns, sampled);
    }

    /// Starts building labels.
    #[inline]
    pub fn builder() -> SpanLabelsBuilder {
        SpanLabelsBuilder::default()
    }

    /// The 128-bit trace id (0 when the work has no trace).
    #[inline]
    pub fn trace_id(&self) -> u128 {
        self.record.ids.trace_id
    }

    /// The 64-bit span id.
    #[inline]
    pub fn span_id(&self) -> u64 {
        self.record.ids.span_id
    }

    /// The parent span id (0 for a root).
    #[inline]
    pub fn parent_span_id(&self) -> u64 {
        self.record.ids.parent_span_id
    }

    /// The local-root span id.
    #[inline]
    pub fn root_span_id(&self) -> u64 {
        self.record.ids.root_span_id
    }

    /// The span id as 16 lowercase hex digits (the `pyroscope.profile.id` form).
    pub fn span_id_hex(&self) -> String {
        format!("{:016x}", self.record.ids.span_id)
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.record.ids.trace_id)
    }

    /// The span name.
    pub fn span_name(&self) -> Arc<str> {
        intern::resolve(self.record.ids.span_name)
    }

    /// The route template (empty when unknown).
    pub fn route(&self) -> Arc<str> {
        intern::resolve(self.record.ids.route)
    }

    /// Whether, and why, the work is profiled at the high rate.
    #[inline]
    pub fn hotness(&self) -> Hotness {
        Hotness::from_u8(self.record.state.load(Ordering::Relaxed) & HOT_BITS)
    }

    /// Raises the work to the high rate from now on (for example when it ran past its
    /// slow threshold). Takes effect at the next poll on any thread and, for work stuck in
    /// one long poll, at the next baseline sample of the thread running it. Never lowers,
    /// and does nothing once the span has ended.
    #[inline]
    pub fn promote(&self, why: Hotness) {
        self.record.promote(why);
    }

    /// Samples taken so far while these labels were active (exact count); for a local
    /// root, also those of the inner spans made from it with [`SpanLabels::child`] or [`SpanLabels::child_named`].
    #[inline]
    pub fn cpu_samples(&self) -> u64 {
        self.record.cpu_samples.load(Ordering::Relaxed)
    }

    /// Weighted CPU estimate of those samples, in nanoseconds.
    #[inline]
    pub fn cpu_ns(&self) -> u64 {
        self.record.cpu_ns.load(Ordering::Relaxed)
    }

    /// Labels for a child span of this one: same trace and local root, new span id and
    /// name; same route, hotness, slow deadline and high rate. The child of an ended
    /// span starts ended.
    pub fn child(&self, span_id: u64, span_name: &str) -> SpanLabels {
        self.child_named(span_id, NameId::intern(span_name))
    }

    /// [`SpanLabels::child`] with the name interned already ([`NameId::intern_static`]
    /// for a `tracing` span's name).
    pub fn child_named(&self, span_id: u64, span_name: NameId) -> SpanLabels {
        self.child_with(span_id, span_name, |b| b)
    }

    /// [`SpanLabels::child_named`], with more set on the child's builder
    /// (`spanprof-tower`: the anchor, and the first-sample report).
    #[doc(hidden)]
    pub fn child_with(
        &self,
        span_id: u64,
        span_name: NameId,
        more: impl FnOnce(SpanLabelsBuilder) -> SpanLabelsBuilder,
    ) -> SpanLabels {
        let mut b = SpanLabels::builder()
            .trace_id(self.record.ids.trace_id)
            .span_id(span_id)
            .parent_span_id(self.record.ids.span_id)
            .root_span_id(self.record.ids.root_span_id)
            .span_name_id(span_name)
            .route_id(self.record.ids.route)
            .trace_flags(self.record.trace_flags)
            .hot(self.hotness());
        b.slow_deadline_ns = self.record.slow_deadline_ns;
        b.high_ns = self.record.high_ns;
        b.root = Some(match &self.record.root {
            Some(root) => root.clone(),
            None => self.record.clone(),
        });
        let child = more(b).build();
        if self.is_ended() {
            child.end();
        }
        child
    }

    /// Hands these labels to the hook set with [`crate::on_first_sample`] the first
    /// time a sample lands in their work (or, for a local root, in its tree's), on
    /// the thread that pops them next. What `spanprof-tower` asks for the spans whose
    /// attributes its span processor writes; call it before the labels are first
    /// pushed.
    #[inline]
    pub fn report_first_sample(&self) {
        self.record
            .flags
            .fetch_or(crate::sys::record::REPORT, Ordering::Relaxed);
    }

    /// Whether two handles point at the same label record.
    pub fn ptr_eq(&self, other: &SpanLabels) -> bool {
        RecordRef::ptr_eq(&self.record, &other.record)
    }
}

impl fmt::Debug for SpanLabels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpanLabels")
            .field(
                "trace_id",
                &format_args!("{:032x}", self.record.ids.trace_id),
            )
            .field("span_id", &format_args!("{:016x}", self.record.ids.span_id))
            .field(
                "root_span_id",
                &format_args!("{:016x}", self.record.ids.root_span_id),
            )
            .field("span_name", &self.span_name())
            .field("route", &self.route())
            .field("hot", &self.hotness())
            .field("ended", &self.is_ended())
            .finish()
    }
}

/// Builds [`SpanLabels`]. Unset ids are 0; an unset root span id is the span id
/// (the span is its own local root).
#[derive(Default, Clone)]
pub struct SpanLabelsBuilder {
    trace_id: u128,
    span_id: u64,
    parent_span_id: u64,
    root_span_id: Option<u64>,
    span_name: Option<NameId>,
    route: Option<NameId>,
    hot: Hotness,
    slow_deadline_ns: u64,
    high_ns: u64,
    root: Option<RecordRef>,
    trace_flags: u8,
    anchor: u64,
    report: bool,
}

impl fmt::Debug for SpanLabelsBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpanLabelsBuilder")
            .field("trace_id", &format_args!("{:032x}", self.trace_id))
            .field("span_id", &format_args!("{:016x}", self.span_id))
            .finish_non_exhaustive()
    }
}

impl SpanLabelsBuilder {
    /// Promotes the work to the high rate (`Hotness::Slow`) once it has run for
    /// `after` from now, even in the middle of a poll (the signal handler checks).
    #[inline]
    pub fn slow_after(mut self, after: std::time::Duration) -> Self {
        self.slow_deadline_ns = crate::sys::monotonic_now_ns()
            .saturating_add(u64::try_from(after.as_nanos()).unwrap_or(u64::MAX));
        self
    }

    /// Samples this work at `hz` while it is hot, instead of the profiler's high rate.
    /// Capped by what the mechanism can deliver; 0 means the profiler's rate.
    #[inline]
    pub fn high_rate_hz(mut self, hz: u32) -> Self {
        self.high_ns = if hz == 0 {
            0
        } else {
            1_000_000_000 / u64::from(hz.min(crate::MAX_HIGH_HZ))
        };
        self
    }

    /// Sets the 128-bit trace id.
    #[inline]
    pub fn trace_id(mut self, id: u128) -> Self {
        self.trace_id = id;
        self
    }

    /// Sets the 64-bit span id.
    #[inline]
    pub fn span_id(mut self, id: u64) -> Self {
        self.span_id = id;
        self
    }

    /// Sets the W3C trace flags of the span (bit 0: sampled). Defaults to 0. Published
    /// to outside profilers with the feature `otel-thread-ctx`.
    #[inline]
    pub fn trace_flags(mut self, flags: u8) -> Self {
        self.trace_flags = flags;
        self
    }

    /// Sets the parent span id (0 for none).
    #[inline]
    pub fn parent_span_id(mut self, id: u64) -> Self {
        self.parent_span_id = id;
        self
    }

    /// Sets the local-root span id. Defaults to the span id.
    #[inline]
    pub fn root_span_id(mut self, id: u64) -> Self {
        self.root_span_id = Some(id);
        self
    }

    /// Sets the span name. Interned: past the interner's bound every new name reads
    /// as `"(other)"` and is counted in [`crate::intern_stats`].
    pub fn span_name(mut self, name: &str) -> Self {
        self.span_name = Some(intern::intern(name));
        self
    }

    /// Sets the route template (for example `POST /checkout`), interned like the name.
    /// Never pass a raw path: ids and query strings would blow the bound and leak data.
    pub fn route(mut self, route: &str) -> Self {
        self.route = Some(intern::intern(route));
        self
    }

    /// Sets the span name interned before ([`NameId::intern`]): no interner lookup.
    #[inline]
    pub fn span_name_id(mut self, name: NameId) -> Self {
        self.span_name = Some(name);
        self
    }

    /// Sets the route interned before ([`NameId::intern`]): no interner lookup.
    #[inline]
    pub fn route_id(mut self, route: NameId) -> Self {
        self.route = Some(route);
        self
    }

    /// Sets whether the work starts hot.
    #[inline]
    pub fn hot(mut self, hot: Hotness) -> Self {
        self.hot = hot;
        self
    }

    /// Keeps an integration's word with the labels ([`SpanLabels::anchor`]).
    #[doc(hidden)]
    #[inline]
    pub fn anchor(mut self, anchor: u64) -> Self {
        self.anchor = anchor;
        self
    }

    /// [`SpanLabels::report_first_sample`], set as the labels are built (no atomic
    /// write to the record afterwards).
    #[inline]
    pub fn report_first_sample(mut self, report: bool) -> Self {
        self.report = report;
        self
    }

    /// Builds the labels: one record from the pool (allocated only when the pool has
    /// none free).
    #[inline]
    pub fn build(self) -> SpanLabels {
        let span_name = self.span_name.unwrap_or(NameId::NONE);
        let route = self.route.unwrap_or(NameId::NONE);
        let root_span_id = self.root_span_id.unwrap_or(self.span_id);
        // The one owner is this handle (`owners` starts at 1: no atomic add).
        SpanLabels::owned(RecordRef::new(LabelRecord {
            // The local root's ids, so that an outside reader charges the tree to its
            // root as spanprof's own profiles do, and the name of the span itself.
            #[cfg(spanprof_otel_ctx)]
            otel: crate::sys::record::ThreadCtxRecord::new(
                self.trace_id,
                root_span_id,
                self.trace_flags,
                [
                    (crate::otel_ctx::KEY_ROUTE, intern::name_of(route)),
                    (crate::otel_ctx::KEY_SPAN_NAME, intern::name_of(span_name)),
                ],
            ),
            ids: LabelIds {
                trace_id: self.trace_id,
                span_id: self.span_id,
                parent_span_id: self.parent_span_id,
                root_span_id,
                span_name,
                route,
            },
            state: AtomicU8::new(self.hot as u8),
            owners: AtomicUsize::new(1),
            cpu_samples: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            // A local root's latency starts here (one TSC read; none for inner spans).
            started: if self.root.is_none() {
                crate::clock::CLOCK.raw()
            } else {
                0
            },
            root: self.root,
            slow_deadline_ns: self.slow_deadline_ns,
            high_ns: self.high_ns,
            anchor: self.anchor,
            busy_ns: AtomicU64::new(0),
            polls: AtomicU64::new(0),
            max_poll_ns: AtomicU64::new(0),
            cpu_clock_ns: AtomicU64::new(crate::sys::record::CPU_NOT_MEASURED),
            sched_delay_ns: AtomicU64::new(0),
            preempted_ns: AtomicU64::new(0),
            long_polls: AtomicU64::new(0),
            flags: AtomicU8::new(if self.report {
                crate::sys::record::REPORT
            } else {
                0
            }),
            refs: AtomicUsize::new(0),
            trace_flags: self.trace_flags,
        }))
    }
}

/// Whether labels are active on this thread right now (one thread-local load: the
/// cheap form of `current_labels().is_some()`).
#[inline]
pub fn labels_active() -> bool {
    !sys::slot::current_ptr().is_null()
}

/// The span id of the labels active on this thread right now, if any: the cheap form
/// of `current_labels().map(|l| l.span_id())` (no handle, so no count written).
#[inline]
pub fn current_span_id() -> Option<u64> {
    sys::slot::with_current(|r| r.ids.span_id)
}

/// The labels active on this thread right now, if any (a new handle to them).
///
/// This is how work handed to another thread keeps its labels: capture here,
/// [`SpanLabels::enter`] there ([`crate::spawn_blocking`] and [`crate::spawn_local`]
/// do exactly that). The handle carries the labels without keeping their span alive:
/// when the span ends, work still running under them is sampled as detached (see
/// [`SpanLabels`]).
#[inline]
pub fn current_labels() -> Option<SpanLabels> {
    sys::slot::current().map(SpanLabels::carrying)
}
