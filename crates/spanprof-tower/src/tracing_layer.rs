//! [`SpanProfileLayer`]: a `tracing_subscriber::Layer` that narrows the labels to the
//! inner `tracing` span being entered, so an inner span such as `calculate_total`
//! has its own span-scoped profile while its local root's profile still includes it.

use std::borrow::Cow;

use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use spanprof_core::{NameId, PollTimer, SpanLabels};
use tracing::Subscriber;
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::{LookupSpan, SpanRef};

use spanprof_core::span_map::{self, Inserted};

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

impl SpanSelector {
    /// How the selector reads in a message: `apply`, `target my_jobs`, `level INFO`.
    fn describe(&self) -> String {
        match self {
            SpanSelector::Name(n) => format!("`{n}`"),
            SpanSelector::Target(t) => format!("target {t}"),
            SpanSelector::Level(l) => format!("level {l}"),
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
        span_map::init();
        spanprof_core::init_latency();
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
        let selector = selector.into();
        spanprof_core::setup::filters::roots_configured(selector.describe());
        self.roots.push((selector, policy));
        self
    }
}

/// The state of a span whose labels did not fit in the core's span map (both of its
/// buckets full), kept in its extensions instead: an allocation each, counted in
/// `span_map::overflowed`.
struct Overflowed {
    labels: SpanLabels,
    timer: PollTimer,
}

/// Marks, in a span's extensions, that its labels are in the core's span map. A
/// zero-sized value costs no allocation, and the extensions are memory of the span's
/// own that `tracing-opentelemetry` touches at every enter too: a span without it
/// (a request's own span, entered at every poll before its labels are pushed) is
/// known to have no labels without probing the map.
struct InSpanMap;

/// Marks a root candidate (a span [`SpanProfileLayer::profile_roots`] picks, created
/// outside labelled work), decided at its first enter.
struct RootCandidate;

impl<S> tracing_subscriber::Layer<S> for SpanProfileLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        // The service's filter may disable a span a root selector picks: checked once
        // a subscriber listens (`spanprof_core::setup::filters`).
        if metadata.is_span() && self.root_of(metadata).is_some() {
            spanprof_core::setup::filters::watch_root_callsite(metadata);
        }
        tracing::subscriber::Interest::always()
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        // Only spans made outside labelled work can be roots; the rest is decided at
        // their first enter, where their OpenTelemetry context is attached.
        if self.roots.is_empty()
            || spanprof_core::labels_active()
            || self.root_of(attrs.metadata()).is_none()
        {
            return;
        }
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(RootCandidate);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        // Its labels end here (an overflowed entry goes with the span's extensions),
        // and a root's latency (`record_latency` does nothing for inner spans).
        let Some(span) = ctx.span(&id) else { return };
        let ext = span.extensions();
        if ext.get::<InSpanMap>().is_some() {
            drop(ext);
            if let Some(labels) = span_map::remove(id.into_u64()) {
                labels.record_latency();
            }
        } else if let Some(e) = ext.get::<Overflowed>() {
            e.labels.record_latency();
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let candidate = {
            let mut ext = span.extensions_mut();
            // A span with labels of its own: pushed from the span map.
            if ext.get_mut::<InSpanMap>().is_some() {
                drop(ext);
                span_map::enter(id.into_u64());
                return;
            }
            if let Some(e) = ext.get_mut::<Overflowed>() {
                e.timer.enter(&e.labels);
                return;
            }
            ext.get_mut::<RootCandidate>().is_some()
        };
        // Entered outside labelled work (a request's own span is entered at every
        // poll, before its labels are pushed): nothing to decide, but samples under
        // it are counted, so that CPU-heavy work nothing profiles is reported.
        if !spanprof_core::labels_active() {
            if candidate {
                span.extensions_mut().remove::<RootCandidate>();
                if let Some(policy) = self.root_of(span.metadata()) {
                    spanprof_core::setup::filters::root_span_seen();
                    let labels = root(id, span.name(), policy);
                    store_and_enter(&span, id, labels);
                    return;
                }
            }
            spanprof_core::setup::enter_unprofiled_span(id.into_u64(), span.metadata());
            return;
        }
        let Some(labels) = decide(id, span.metadata().name()) else {
            return;
        };
        store_and_enter(&span, id, labels);
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        // The push is on this thread's own stack: no table. The figures are counted
        // at every outermost exit: the span may end (and be exported) before this
        // layer hears of its close.
        if span_map::exit(id.into_u64())
            || spanprof_core::setup::exit_unprofiled_span(id.into_u64())
        {
            return;
        }
        if let Some(span) = ctx.span(id)
            && let Some(e) = span.extensions_mut().get_mut::<Overflowed>()
        {
            e.timer.exit(&e.labels);
        }
    }
}

impl SpanProfileLayer {
    /// The policy of the first selector that picks a span of `meta`, if any.
    #[inline]
    fn root_of(&self, meta: &tracing::Metadata<'_>) -> Option<&RoutePolicy> {
        self.roots
            .iter()
            .find(|(s, _)| s.matches(meta))
            .map(|(_, policy)| policy)
    }
}

/// Keeps span `id`'s new labels in the span map (or, both its buckets full, in its
/// extensions) and enters them. Another thread may have entered the span for the
/// first time too and stored its decision meanwhile: the first one stored stands.
fn store_and_enter<'a, R>(span: &SpanRef<'a, R>, id: &Id, labels: SpanLabels)
where
    R: LookupSpan<'a>,
{
    match span_map::insert(id.into_u64(), labels) {
        Inserted::Stored | Inserted::Exists(_) => {
            let mut ext = span.extensions_mut();
            if ext.get_mut::<InSpanMap>().is_none() {
                ext.insert(InSpanMap);
            }
            drop(ext);
            span_map::enter(id.into_u64());
        }
        Inserted::Full(labels) => {
            let mut ext = span.extensions_mut();
            if ext.get_mut::<Overflowed>().is_none() {
                ext.insert(Overflowed {
                    labels,
                    timer: PollTimer::new(None),
                });
            }
            if let Some(e) = ext.get_mut::<Overflowed>() {
                e.timer.enter(&e.labels);
            }
        }
    }
}

/// Whether the span `id` (named `name`), entered inside labelled work and not decided
/// yet, gets labels of its own: yes, unless it is the span those labels are for.
///
/// The labels in force are the enclosing span's (the tracing parent's when it has
/// labels of its own, else the request's or job's), and their anchor is the span
/// whose OpenTelemetry context is attached while they are: the enclosing span
/// itself, or, for one `tracing-opentelemetry` does not see, its nearest ancestor
/// it does see.
fn decide(id: &Id, name: &'static str) -> Option<SpanLabels> {
    let parent = spanprof_core::current_labels()?;
    let enclosing = match parent.anchor() {
        0 => parent.span_id(),
        anchor => anchor,
    };
    let ids = own_span_context(id, enclosing);
    if ids.is_some_and(|(sid, _)| sid == parent.span_id()) {
        return None;
    }
    let (sid, otel, sampled) = match ids {
        Some((sid, sampled)) => (sid, true, sampled),
        None => (random_span_id(), false, false),
    };
    // Interned through the thread's own cache: no shared lock per span. Inner spans
    // are promoted by the signal handler, from the slow deadline they inherit.
    let name = NameId::intern_static(name);
    Some(registry::labelled(
        otel && sampled,
        parent.hotness(),
        |report| {
            parent.child_with(sid, name, |b| {
                b.anchor(if otel { sid } else { enclosing })
                    .report_first_sample(report)
            })
        },
    ))
}

/// The labels and state of a root span (`SpanProfileLayer::profile_roots`) created
/// outside labelled work, at its first enter: its OpenTelemetry ids, its name as span
/// name and route, and `policy`'s decision.
fn root(id: &Id, name: &'static str, policy: &RoutePolicy) -> SpanLabels {
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
    registry::labelled(otel && sampled, hot, |report| {
        let b = SpanLabels::builder()
            .trace_id(trace_id)
            .span_id(sid)
            .root_span_id(sid)
            .span_name_id(name)
            .route_id(name)
            .hot(hot)
            .anchor(sid)
            .report_first_sample(report);
        policy.apply(b).build()
    })
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
        let held = spanprof_core::testing::hold_name_interner();
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
    fn a_profile_root_records_its_latency_when_it_closes() {
        // Its samples are classed against the durations of its name's spans.
        let layer = super::SpanProfileLayer::new()
            .profile_roots("latency_job_test", crate::RoutePolicy::new());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..3 {
                let span = tracing::info_span!("latency_job_test");
                span.in_scope(|| std::thread::sleep(Duration::from_millis(2)));
                // Entered again: one job, one duration, counted at the close.
                span.in_scope(|| {});
            }
        });
        let latency = spanprof_core::route_latency("latency_job_test");
        assert_eq!(latency.requests, 3, "{latency:?}");
        assert!(
            latency
                .buckets
                .iter()
                .all(|&(from_ns, n)| n == 0 || from_ns >= 1_000_000),
            "{latency:?}"
        );
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
