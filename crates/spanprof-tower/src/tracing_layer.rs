//! [`SpanProfileLayer`]: a `tracing_subscriber::Layer` that narrows the labels to the
//! inner `tracing` span being entered, so an inner span such as `calculate_total`
//! has its own span-scoped profile while its local root's profile still includes it.

use std::borrow::Cow;

use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use spanprof_core::{NameId, PollTimer, SpanLabels};
use tracing::Subscriber;
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::inner_spans::{self, Entry};
use crate::otel_context::{AttachedContext, LookupSite, SpanIds};
use crate::policy::RoutePolicy;
use crate::registry;

/// Narrows span labels on `tracing` span enter and exit.
///
/// A span entered while labels are active (inside a request handled by
/// [`crate::ProfileCorrelationLayer`], or any labelled future) gets labels of its own:
/// the same trace, route and local root, its own span id (its OpenTelemetry span id
/// when `tracing-opentelemetry` is installed, else a random one) and its name. Its
/// samples carry its span id; its local root's profile (`SpanProfileStore::span_tree`)
/// and CPU figures include them. Spans entered with no labels active are left alone.
///
/// Add it to the registry after `tracing_opentelemetry`'s layer (with that layer's
/// context activation on, its default): the entered span's OpenTelemetry context is
/// then attached by the time this layer hears of the enter, and is read from a
/// thread-local. In the other order, or without context activation, each inner span
/// asks `tracing-opentelemetry` for its context instead (about 1 µs more per span
/// here), and one warning names the fix.
///
/// ```
/// use opentelemetry::trace::TracerProvider as _;
/// use tracing_subscriber::prelude::*;
///
/// let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
/// let subscriber = tracing_subscriber::registry()
///     .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("shop")))
///     .with(spanprof_tower::SpanProfileLayer::new());
/// # drop(subscriber);
/// ```
#[derive(Debug, Default, Clone)]
pub struct SpanProfileLayer {
    /// Spans that start a profile of their own when created outside labelled work.
    roots: Vec<(SpanSelector, RoutePolicy)>,
}

/// Which `tracing` spans [`SpanProfileLayer::profile_roots`] selects: by name, by
/// target (a module path and the modules under it), or by level (that level and the
/// more severe ones). Only names and static metadata are read, never field values.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpanSelector {
    /// Spans of this name (`info_span!("job")`, `#[instrument]`'s function name).
    Name(Cow<'static, str>),
    /// Spans whose target is this module path or one under it.
    Target(Cow<'static, str>),
    /// Spans of this level or a more severe one (`Level::INFO`: INFO, WARN, ERROR).
    Level(tracing::Level),
}

impl SpanSelector {
    fn matches(&self, meta: &tracing::Metadata<'_>) -> bool {
        match self {
            SpanSelector::Name(n) => meta.name() == n,
            SpanSelector::Target(t) => meta
                .target()
                .strip_prefix(&**t)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::")),
            SpanSelector::Level(l) => meta.level() <= l,
        }
    }
}

impl From<&'static str> for SpanSelector {
    /// A span name.
    fn from(name: &'static str) -> Self {
        SpanSelector::Name(Cow::Borrowed(name))
    }
}

impl From<String> for SpanSelector {
    /// A span name.
    fn from(name: String) -> Self {
        SpanSelector::Name(Cow::Owned(name))
    }
}

impl From<tracing::Level> for SpanSelector {
    fn from(level: tracing::Level) -> Self {
        SpanSelector::Level(level)
    }
}

impl SpanProfileLayer {
    /// The layer.
    pub fn new() -> Self {
        // Calibrate the clock and allocate the table of inner spans now rather than
        // in the first request's span.
        PollTimer::calibrate();
        inner_spans::init();
        SpanProfileLayer { roots: Vec::new() }
    }

    /// Profiles the spans `selector` picks that are created outside any request (or
    /// other labelled work): background jobs, queue consumers, cron tasks, start-up
    /// work. Each such span becomes a local root of its own, as a request is: labels
    /// from its OpenTelemetry ids on every poll of the work it is entered around, its
    /// inner spans and the tasks it spawns under it, `pyroscope.profile.id` and the
    /// `spanprof.*` figures through [`crate::SpanProfileProcessor`], and `policy`'s
    /// sample rate, slow threshold and high rate. The route and the span name of its
    /// samples are the span's name. Selectors are tried in the order added; a span
    /// created inside labelled work stays an inner span of that work.
    ///
    /// ```
    /// use spanprof_tower::{RoutePolicy, SpanProfileLayer};
    /// let layer = SpanProfileLayer::new().profile_roots("job", RoutePolicy::new().sample_rate(1.0));
    /// # drop(layer);
    /// ```
    pub fn profile_roots(mut self, selector: impl Into<SpanSelector>, policy: RoutePolicy) -> Self {
        self.roots.push((selector.into(), policy));
        self
    }
}

/// The state of a span whose entry did not fit in [`inner_spans`]'s table, kept in
/// its extensions instead.
struct Overflowed(Entry);

impl<S> tracing_subscriber::Layer<S> for SpanProfileLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        if spanprof_core::labels_active() {
            return;
        }
        // Made outside labelled work: its callsite remembered on this thread, where
        // the metadata comes free, for when it is entered unprofiled (a request's
        // span, entered at every poll before its labels are pushed, is not looked up).
        created_outside::remember(id.into_u64(), attrs.metadata());
        // A root candidate: decided at its first enter, where its OpenTelemetry
        // context is attached.
        if let Some(k) = self
            .roots
            .iter()
            .position(|(s, _)| s.matches(attrs.metadata()))
        {
            root_candidates::add(id.into_u64(), k);
        }
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        // Its labels end here (an overflowed entry goes with the span's extensions).
        drop(inner_spans::remove(id.into_u64()));
        root_candidates::take(id.into_u64());
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        // A span with labels of its own: one probe of the table (one cache line).
        if inner_spans::with(id.into_u64(), |e| e.timer.enter(&e.labels)).is_some()
            || with_overflowed(&ctx, id, |e| e.timer.enter(&e.labels)).is_some()
        {
            return;
        }
        // Entered outside labelled work (a request's own span is entered at every
        // poll, before its labels are pushed): nothing to decide, but samples under
        // it are counted, so that CPU-heavy work nothing profiles is reported.
        if !spanprof_core::labels_active() {
            if let Some(k) = root_candidates::take(id.into_u64()) {
                let entry = root(id, ctx.span(id).map_or("", |s| s.name()), &self.roots[k].1);
                if let Err(entry) =
                    inner_spans::insert(id.into_u64(), entry, |e| e.timer.enter(&e.labels))
                    && let Some(span) = ctx.span(id)
                {
                    let mut ext = span.extensions_mut();
                    if ext.get_mut::<Overflowed>().is_none() {
                        ext.insert(Overflowed(entry));
                    }
                    if let Some(Overflowed(e)) = ext.get_mut::<Overflowed>() {
                        e.timer.enter(&e.labels);
                    }
                }
                return;
            }
            let meta = created_outside::metadata(id.into_u64()).or_else(|| ctx.metadata(id));
            if let Some(meta) = meta {
                spanprof_core::setup::enter_unprofiled_span(id.into_u64(), meta);
            }
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        // The nearest span tracing-opentelemetry sees, as the parent span knows it (a
        // request span's is its labels' own).
        let anchor = span.parent().and_then(|parent| {
            inner_spans::with(parent.id().into_u64(), |e| e.otel_anchor)
                .or_else(|| with_overflowed(&ctx, &parent.id(), |e| e.otel_anchor))
        });
        let Some(entry) = decide(id, span.metadata().name(), anchor) else {
            return;
        };
        // Another thread may have entered the span for the first time too and stored
        // its decision meanwhile: the first one stored stands.
        if let Err(entry) = inner_spans::insert(id.into_u64(), entry, |e| e.timer.enter(&e.labels))
        {
            let mut ext = span.extensions_mut();
            if ext.get_mut::<Overflowed>().is_none() {
                ext.insert(Overflowed(entry));
            }
            if let Some(Overflowed(e)) = ext.get_mut::<Overflowed>() {
                e.timer.enter(&e.labels);
            }
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        // Publishes at every outermost exit: the span may end (and be exported)
        // before this layer hears of its close.
        if inner_spans::with(id.into_u64(), |e| e.timer.exit(&e.labels)).is_some()
            || with_overflowed(&ctx, id, |e| e.timer.exit(&e.labels)).is_some()
        {
            return;
        }
        spanprof_core::setup::exit_unprofiled_span(id.into_u64());
    }
}

/// Runs `f` on span `id`'s entry kept in its extensions, if the table ever
/// overflowed and this span's did.
fn with_overflowed<S, R>(
    ctx: &Context<'_, S>,
    id: &Id,
    f: impl FnOnce(&mut Entry) -> R,
) -> Option<R>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    if inner_spans::overflowed() == 0 {
        return None;
    }
    let span = ctx.span(id)?;
    let mut ext = span.extensions_mut();
    ext.get_mut::<Overflowed>().map(|Overflowed(e)| f(e))
}

/// Whether the span `id` (named `name`), entered inside labelled work and not decided
/// yet, gets labels of its own: yes, unless it is the span those labels are for.
/// `anchor` is the parent span's `otel_anchor`, if it has labels of its own.
fn decide(id: &Id, name: &'static str, anchor: Option<u64>) -> Option<Entry> {
    let parent = spanprof_core::current_labels()?;
    let enclosing = anchor.unwrap_or_else(|| parent.span_id());
    let ids = own_span_context(id, enclosing);
    if ids.is_some_and(|(sid, _)| sid == parent.span_id()) {
        return None;
    }
    let (sid, otel, sampled) = match ids {
        Some((sid, sampled)) => (sid, true, sampled),
        None => (random_span_id(), false, false),
    };
    // Interned through the thread's own cache: no shared lock per span.
    let labels = parent.child_named(sid, NameId::intern_static(name));
    if otel && sampled && registry::enabled() {
        if registry::track_at_start(labels.hotness()) {
            registry::track(&labels);
        } else {
            labels.report_first_sample();
        }
    }
    // Inner spans are promoted by the signal handler, from the slow deadline they
    // inherit.
    Some(Entry {
        labels,
        timer: PollTimer::new(None),
        otel_anchor: if otel { sid } else { enclosing },
    })
}

/// The labels and state of a root span (`SpanProfileLayer::profile_roots`) created
/// outside labelled work, at its first enter: its OpenTelemetry ids, its name as span
/// name and route, and `policy`'s decision.
fn root(id: &Id, name: &'static str, policy: &RoutePolicy) -> Entry {
    let ids = own_span_ids(id, 0);
    let (trace_id, sid, sampled, otel) = match ids {
        Some(ids) => (ids.trace_id, ids.span_id, ids.sampled, true),
        None => (0, random_span_id(), true, false),
    };
    let hot = policy.decide(
        if trace_id != 0 {
            trace_id
        } else {
            u128::from(sid)
        },
        sampled,
    );
    let name = NameId::intern_static(name);
    let mut b = SpanLabels::builder()
        .trace_id(trace_id)
        .span_id(sid)
        .root_span_id(sid)
        .span_name_id(name)
        .route_id(name)
        .hot(hot);
    if let Some(after) = policy.slow_after {
        b = b.slow_after(after);
    }
    if let Some(hz) = policy.high_rate_hz {
        b = b.high_rate_hz(hz);
    }
    let labels = b.build();
    if otel && sampled && registry::enabled() {
        if registry::track_at_start(hot) {
            registry::track(&labels);
        } else {
            labels.report_first_sample();
        }
    }
    Entry {
        labels,
        timer: PollTimer::new(None),
        otel_anchor: sid,
    }
}

/// The callsites of the last spans made on this thread outside labelled work, by span
/// id: where a span is usually first entered, its metadata without a lookup.
mod created_outside {
    use std::cell::Cell;

    type Meta = &'static tracing::Metadata<'static>;

    const SPANS: usize = 8;

    struct Recent {
        spans: [Cell<(u64, Option<Meta>)>; SPANS],
        next: Cell<usize>,
    }

    thread_local! {
        static RECENT: Recent = const {
            Recent {
                spans: [const { Cell::new((0, None)) }; SPANS],
                next: Cell::new(0),
            }
        };
    }

    pub(super) fn remember(id: u64, meta: Meta) {
        RECENT.with(|r| {
            let next = r.next.get();
            r.spans[next % SPANS].set((id, Some(meta)));
            r.next.set(next.wrapping_add(1));
        });
    }

    pub(super) fn metadata(id: u64) -> Option<Meta> {
        RECENT.with(|r| {
            r.spans
                .iter()
                .map(Cell::get)
                .find(|(i, _)| *i == id)
                .and_then(|(_, m)| m)
        })
    }
}

/// Root candidates: spans a selector picked at creation, outside labelled work, not
/// entered yet (a few at a time: a job's span is entered as soon as it is made).
mod root_candidates {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static CANDIDATES: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);
    /// How many there are: most enters see 0 and take no lock.
    static COUNT: AtomicUsize = AtomicUsize::new(0);
    /// Most candidates kept; past it, new ones are not profiled.
    const MAX: usize = 4096;

    pub(super) fn add(id: u64, selector: usize) {
        let mut c = CANDIDATES.lock().unwrap_or_else(|e| e.into_inner());
        let map = c.get_or_insert_with(HashMap::new);
        if map.len() < MAX && map.insert(id, selector).is_none() {
            COUNT.fetch_add(1, Ordering::Release);
        }
    }

    /// Takes span `id`'s selector, if it is a candidate.
    #[inline]
    pub(super) fn take(id: u64) -> Option<usize> {
        if COUNT.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut c = CANDIDATES.lock().unwrap_or_else(|e| e.into_inner());
        let k = c.as_mut()?.remove(&id)?;
        COUNT.fetch_sub(1, Ordering::Release);
        Some(k)
    }
}

/// Whether an entered span's context can be read from OpenTelemetry's attached one.
static ENTERED_SPAN: AttachedContext = AttachedContext::new(LookupSite::Entered);

/// The OpenTelemetry span id of the span being entered (it is the current span
/// while layers hear of the enter) and whether it is sampled, if
/// `tracing-opentelemetry` gives it one: read from OpenTelemetry's attached context
/// once that is known to be the entered span's (`otel_context`).
fn own_span_context(id: &Id, enclosing: u64) -> Option<(u64, bool)> {
    own_span_ids(id, enclosing).map(|ids| (ids.span_id, ids.sampled))
}

/// [`own_span_context`] with the trace id.
fn own_span_ids(id: &Id, enclosing: u64) -> Option<SpanIds> {
    ENTERED_SPAN.current_span_ids(Some(enclosing), || {
        let current = tracing::Span::current();
        if current.id().as_ref() != Some(id) {
            return None;
        }
        SpanIds::of_span(&current)
    })
}

fn random_span_id() -> u64 {
    u64::from_be_bytes(RandomIdGenerator::default().new_span_id().to_bytes())
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use spanprof_core::SpanLabels;
    use tracing_subscriber::prelude::*;

    #[test]
    fn an_inner_span_of_a_name_seen_before_takes_no_lock_of_the_interner() {
        // Reading the interner under its lock writes the lock's reader count, one
        // cache line every worker shares, at every inner span of every request.
        // The labels the inner span runs under (their name is read later: reading it
        // takes the interner's lock).
        fn inner() -> Option<SpanLabels> {
            tracing::info_span!("validate_order_test").in_scope(spanprof_core::current_labels)
        }
        fn name(labels: Option<SpanLabels>) -> Option<String> {
            labels.map(|l| l.span_name().to_string())
        }
        let subscriber = tracing_subscriber::registry().with(super::SpanProfileLayer::new());
        let dispatch = tracing::Dispatch::new(subscriber);
        let (warm_tx, warm_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let worker = std::thread::spawn(move || {
            tracing::dispatcher::with_default(&dispatch, || {
                let parent = SpanLabels::builder().trace_id(1).span_id(7).build();
                let _in = parent.enter();
                assert_eq!(name(inner()).as_deref(), Some("validate_order_test"));
                warm_tx.send(()).ok();
                go_rx.recv().ok();
                let labels = inner();
                done_tx.send(()).ok();
                assert_eq!(name(labels).as_deref(), Some("validate_order_test"));
            });
        });
        warm_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("warmed up");
        let held = spanprof_core::hold_name_interner_for_test();
        go_tx.send(()).ok();
        let waited = done_rx.recv_timeout(Duration::from_secs(2)).is_err();
        drop(held);
        worker.join().expect("worker");
        assert!(
            !waited,
            "the inner span's labels waited for the interner's lock"
        );
    }

    #[test]
    fn an_inner_span_reads_its_context_from_opentelemetry_once_checked() {
        // tracing-opentelemetry's layer added first, as docs/layer.md says: it has
        // attached the entered span's context before this layer hears of the enter.
        // Asking tracing-opentelemetry instead costs ~1 300 instructions and several
        // shared atomic writes per inner span.
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;

        use crate::otel_context::CHECKS;
        use crate::otel_context::tests::{EXACT_LOOKUPS, WarningCount, tracer};

        let warnings = WarningCount::default();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(tracer()))
            .with(super::SpanProfileLayer::new())
            .with(warnings.clone());
        let spans = 3 * u64::from(CHECKS);
        tracing::subscriber::with_default(subscriber, || {
            let parent = SpanLabels::builder().trace_id(1).span_id(7).build();
            let _in = parent.enter();
            for _ in 0..spans {
                let span = tracing::info_span!("calculate_total");
                let want =
                    u64::from_be_bytes(span.context().span().span_context().span_id().to_bytes());
                let labels = span
                    .in_scope(spanprof_core::current_labels)
                    .expect("the inner span has labels");
                assert_eq!(
                    labels.span_id(),
                    want,
                    "the inner span's own OpenTelemetry id"
                );
                assert_eq!(&*labels.span_name(), "calculate_total");
            }
        });
        let asked = EXACT_LOOKUPS.with(|n| n.get());
        assert!(
            asked <= u64::from(CHECKS),
            "{asked} of {spans} inner spans asked tracing-opentelemetry for their context"
        );
        assert_eq!(warnings.get(), 0);
    }

    #[test]
    fn inner_spans_hidden_from_opentelemetry_at_any_depth_get_labels_of_their_own() {
        // tracing-opentelemetry filtered to INFO (a filter of its own), this layer
        // not: `#[instrument(level = "debug")]` functions calling each other inside a
        // profiled INFO span. The attached context stays the INFO span's at every
        // depth; taking it, the first DEBUG span would be decided to be its parent and
        // run under the parent's labels, and the second take the INFO span's id (its
        // parent's id is one of spanprof's, not the attached one).
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        use tracing_subscriber::filter::LevelFilter;

        use crate::otel_context::RECHECK_EVERY;
        use crate::otel_context::tests::{WarningCount, tracer};

        let warnings = WarningCount::default();
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_opentelemetry::layer()
                    .with_tracer(tracer())
                    .with_filter(LevelFilter::INFO),
            )
            .with(super::SpanProfileLayer::new())
            .with(warnings.clone());
        tracing::subscriber::with_default(subscriber, || {
            let parent = SpanLabels::builder().trace_id(1).span_id(7).build();
            let _in = parent.enter();
            for _ in 0..3 * RECHECK_EVERY {
                let outer = tracing::info_span!("price_items");
                let outer_id =
                    u64::from_be_bytes(outer.context().span().span_context().span_id().to_bytes());
                let (middle, inner) = outer.in_scope(|| {
                    tracing::debug_span!("round_prices").in_scope(|| {
                        let middle = spanprof_core::current_labels();
                        let inner = tracing::debug_span!("round_one")
                            .in_scope(spanprof_core::current_labels);
                        (middle, inner)
                    })
                });
                let (middle, inner) = (middle.expect("labels"), inner.expect("labels"));
                assert_eq!(&*middle.span_name(), "round_prices");
                assert_ne!(middle.span_id(), outer_id);
                assert_eq!(&*inner.span_name(), "round_one");
                assert_ne!(inner.span_id(), outer_id);
                assert_ne!(inner.span_id(), middle.span_id());
                assert_eq!(inner.parent_span_id(), middle.span_id());
            }
        });
        assert_eq!(warnings.get(), 0);
    }

    #[test]
    fn a_span_first_entered_on_two_threads_at_once_is_decided_once() {
        // Both threads can find the span undecided; the second to record its decision
        // must not insert another (tracing-subscriber asserts an extension is new).
        let subscriber = tracing_subscriber::registry().with(super::SpanProfileLayer::new());
        let dispatch = tracing::Dispatch::new(subscriber);
        for _ in 0..2000 {
            let span =
                tracing::dispatcher::with_default(&dispatch, || tracing::info_span!("shared"));
            let start = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                let threads: Vec<_> = (0..2)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            span.in_scope(|| {});
                        })
                    })
                    .collect();
                for t in threads {
                    t.join().expect("entering the span panicked");
                }
            });
        }
    }
}
