//! [`SpanProfileLayer`]: a `tracing_subscriber::Layer` that narrows the labels to the
//! inner `tracing` span being entered, so an inner span such as `calculate_total`
//! has its own span-scoped profile while its local root's profile still includes it.

use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use spanprof_core::{NameId, PollTimer, SpanLabels};
use tracing::Subscriber;
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::otel_context::{AttachedContext, Place, SpanIds};
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
#[derive(Debug, Default, Clone, Copy)]
pub struct SpanProfileLayer {
    _private: (),
}

impl SpanProfileLayer {
    /// The layer.
    pub fn new() -> Self {
        // Calibrate the clock now rather than in the first request's span.
        PollTimer::calibrate();
        SpanProfileLayer { _private: () }
    }
}

/// Per-span state kept in the span's extensions.
enum Profiled {
    /// Entered outside labelled work, or the request span itself: nothing to do.
    No,
    Yes {
        labels: SpanLabels,
        timer: PollTimer,
        /// The span id of the nearest span, this one or an ancestor, that
        /// `tracing-opentelemetry` sees: the context it leaves attached while this
        /// span is entered is that span's.
        otel_anchor: u64,
    },
}

impl<S> tracing_subscriber::Layer<S> for SpanProfileLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, _attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {}

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        // Most enters are of spans decided before, and most of those are not profiled
        // (a request's own span is entered at every poll, before its labels are
        // pushed): a read lock tells, and only profiled spans take the write lock.
        let decided = span
            .extensions()
            .get::<Profiled>()
            .map(|p| matches!(p, Profiled::Yes { .. }));
        match decided {
            Some(false) => return,
            Some(true) => {}
            None => {
                // Decide once, at the first enter. The extensions lock is not held
                // here: reading the OpenTelemetry context locks this span's data too.
                // The nearest span tracing-opentelemetry sees, as the parent span
                // knows it (a request span's is its labels' own).
                let anchor =
                    span.parent()
                        .and_then(|parent| match parent.extensions().get::<Profiled>() {
                            Some(Profiled::Yes { otel_anchor, .. }) => Some(*otel_anchor),
                            _ => None,
                        });
                let profiled = decide(id, span.metadata().name(), anchor);
                let mut ext = span.extensions_mut();
                // Another thread may have entered the span for the first time too and
                // recorded its decision meanwhile: the first one recorded stands.
                if ext.get_mut::<Profiled>().is_none() {
                    ext.insert(profiled);
                }
                if let Some(Profiled::Yes { labels, timer, .. }) = ext.get_mut::<Profiled>() {
                    timer.enter(labels);
                }
                return;
            }
        }
        let mut ext = span.extensions_mut();
        if let Some(Profiled::Yes { labels, timer, .. }) = ext.get_mut::<Profiled>() {
            timer.enter(labels);
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        if !matches!(
            span.extensions().get::<Profiled>(),
            Some(Profiled::Yes { .. })
        ) {
            return;
        }
        let mut ext = span.extensions_mut();
        if let Some(Profiled::Yes { labels, timer, .. }) = ext.get_mut::<Profiled>() {
            // Publishes at every outermost exit: the span may end (and be exported)
            // before this layer hears of its close.
            timer.exit(labels);
        }
    }
}

/// Whether the span `id` (named `name`), entered for the first time, gets labels of
/// its own: yes inside labelled work, unless it is the span those labels are for.
/// `anchor` is the parent span's `otel_anchor`, if it has labels of its own.
fn decide(id: &Id, name: &'static str, anchor: Option<u64>) -> Profiled {
    let Some(parent) = spanprof_core::current_labels() else {
        return Profiled::No;
    };
    let enclosing = anchor.unwrap_or_else(|| parent.span_id());
    match own_span_context(id, enclosing) {
        Some((sid, _)) if sid == parent.span_id() => Profiled::No,
        ids => {
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
            // Inner spans are promoted by the signal handler, from the slow deadline
            // they inherit.
            Profiled::Yes {
                labels,
                timer: PollTimer::new(None),
                otel_anchor: if otel { sid } else { enclosing },
            }
        }
    }
}

/// Whether an entered span's context can be read from OpenTelemetry's attached one.
static ENTERED_SPAN: AttachedContext = AttachedContext::new(Place::Entered);

/// The OpenTelemetry span id of the span being entered (it is the current span
/// while layers hear of the enter) and whether it is sampled, if
/// `tracing-opentelemetry` gives it one: read from OpenTelemetry's attached context
/// once that is known to be the entered span's (`otel_context`).
fn own_span_context(id: &Id, enclosing: u64) -> Option<(u64, bool)> {
    ENTERED_SPAN
        .current_span_ids(Some(enclosing), || {
            let current = tracing::Span::current();
            if current.id().as_ref() != Some(id) {
                return None;
            }
            SpanIds::of_span(&current)
        })
        .map(|ids| (ids.span_id, ids.sampled))
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
