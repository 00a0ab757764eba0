//! The OpenTelemetry span context of the current `tracing` span, read cheaply.
//!
//! Asking `tracing-opentelemetry` for a span's context
//! (`OpenTelemetrySpanExt::context`) goes through the dispatcher, the registry's slot
//! for the span, a read lock of its extensions, a reference count and a mutex of the
//! span's OpenTelemetry data, and a clone of its context: about 1 300 instructions and
//! several atomic writes on lines the other workers touch too, once per request and
//! once per inner span. With context activation (`tracing-opentelemetry`'s default)
//! its layer has already attached the entered span's context as OpenTelemetry's
//! current context, which reads from a thread-local without a lock or a write.
//!
//! That is only the same span when the layer activates contexts and runs before
//! spanprof's: so the first [`CHECKS`] lookups that find a span ask
//! `tracing-opentelemetry` too and compare. If all agree, later lookups read the
//! attached context alone; at the first disagreement, every later lookup asks
//! `tracing-opentelemetry` (exact, as before) and one warning names the fix.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use opentelemetry::trace::{SpanContext, TraceContextExt};

/// How many lookups compare the attached context with `tracing-opentelemetry`'s
/// answer before the attached context is read alone.
pub(crate) const CHECKS: u32 = 16;

const REFUSED: u32 = u32::MAX;

/// Once the checks have passed, every this many lookups on a thread are checked again.
pub(crate) const RECHECK_EVERY: u32 = 64;

/// The warning given when the attached context is not the current span's.
pub(crate) const NOT_ATTACHED_MESSAGE: &str = "spanprof: OpenTelemetry's current context is not the entered \
tracing span's (tracing-opentelemetry's context activation is off, its layer is added after SpanProfileLayer, \
or a filter of its own hides request spans the other layers see, inside a span it does see), so spanprof asks \
tracing-opentelemetry for each span's context, about 1 µs more per span: keep tracing_opentelemetry::layer()'s \
context activation on (the default), add it to the subscriber before spanprof::SpanProfileLayer, and let it see \
the request spans ProfileCorrelationLayer runs in.";

/// Whether OpenTelemetry's attached context has been found to be the current span's,
/// for one site that looks it up (the request span in the tower layer, inner spans
/// in `SpanProfileLayer`: the layer order matters to the second only).
///
/// Alone on its cache line: it is read on every request and inner span, and the
/// linker would otherwise pack it beside statics that something writes.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct AttachedContext {
    /// Lookups still to compare; 0: the attached context is trusted; `REFUSED`: it
    /// is not, every lookup asks `tracing-opentelemetry`.
    checks_left: AtomicU32,
    /// Which of the thread's counts of lookups since the last re-check is this one's.
    site: LookupSite,
}

/// The sites that look a span's context up, each with its own re-checks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LookupSite {
    /// The request span, in `ProfileCorrelationLayer`.
    Request = 0,
    /// An inner span's first enter, in `SpanProfileLayer`.
    Entered = 1,
}

/// Whether [`NOT_ATTACHED_MESSAGE`] was given (once per process, by either site).
static WARNED: AtomicBool = AtomicBool::new(false);

/// A span context's ids, as the labels carry them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpanIds {
    pub(crate) trace_id: u128,
    pub(crate) span_id: u64,
    pub(crate) sampled: bool,
}

impl SpanIds {
    /// The ids of a valid span context of this process: a remote span context is a
    /// caller's (`tracing-opentelemetry` with no tracer gives a span its parent's
    /// context, which may be one), never a span of this process.
    #[inline]
    pub(crate) fn of(sc: &SpanContext) -> Option<SpanIds> {
        (sc.is_valid() && !sc.is_remote()).then(|| SpanIds {
            trace_id: u128::from_be_bytes(sc.trace_id().to_bytes()),
            span_id: u64::from_be_bytes(sc.span_id().to_bytes()),
            sampled: sc.is_sampled(),
        })
    }
}

impl SpanIds {
    /// The ids `tracing-opentelemetry` gives `span` (the exact lookup: the
    /// registry, the span's extensions, its OpenTelemetry data's lock).
    pub(crate) fn of_span(span: &tracing::Span) -> Option<SpanIds> {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        SpanIds::of(span.context().span().span_context())
    }
}

/// The ids of OpenTelemetry's current (attached) context's span, if one of this
/// process.
#[inline]
fn attached() -> Option<SpanIds> {
    opentelemetry::Context::map_current(|cx| SpanIds::of(cx.span().span_context()))
}

impl AttachedContext {
    /// Not yet checked.
    pub(crate) const fn new(site: LookupSite) -> Self {
        AttachedContext {
            checks_left: AtomicU32::new(CHECKS),
            site,
        }
    }

    /// The ids of the current `tracing` span's OpenTelemetry span; `exact` asks
    /// `tracing-opentelemetry` (see the module's doc for when it is called).
    /// `enclosing` is the span id of the labels the lookup is made under, if any: an
    /// attached context of that span is the enclosing span's, left attached because
    /// `tracing-opentelemetry` does not see the current span (a filter of its own),
    /// so `exact` is asked.
    #[inline]
    pub(crate) fn current_span_ids(
        &self,
        enclosing: Option<u64>,
        exact: impl FnOnce() -> Option<SpanIds>,
    ) -> Option<SpanIds> {
        let left = self.checks_left.load(Ordering::Relaxed);
        if left == 0 && !recheck_due(self.site) {
            let ids = attached();
            if enclosing.is_none() || ids.map(|ids| ids.span_id) != enclosing {
                return ids;
            }
            #[cfg(test)]
            tests::EXACT_LOOKUPS.with(|n| n.set(n.get() + 1));
            return exact();
        }
        #[cfg(test)]
        tests::EXACT_LOOKUPS.with(|n| n.set(n.get() + 1));
        let ids = exact();
        if left != REFUSED {
            let attached = attached();
            let agree = attached == ids
                || (ids.is_none()
                    && enclosing.is_some()
                    && attached.map(|a| a.span_id) == enclosing);
            if !agree {
                self.checks_left.store(REFUSED, Ordering::Relaxed);
                if !WARNED.load(Ordering::Relaxed) && !WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!("{NOT_ATTACHED_MESSAGE}");
                }
            } else if ids.is_some() && left != 0 {
                // Counts down unless another thread refused meanwhile.
                let _ = self
                    .checks_left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        (n != 0 && n != REFUSED).then(|| n - 1)
                    });
            }
        }
        ids
    }
}

/// Whether this lookup of `site`, once its lookups read the attached context alone,
/// is one to check again: every [`RECHECK_EVERY`]th of that site on the thread, so
/// that a shape of request or span first seen after the checks (a span
/// `tracing-opentelemetry` does not see inside one it does) gives other spans' ids to
/// fewer than [`RECHECK_EVERY`] lookups of a thread before it is found. A count per
/// site, or a fixed mix of request and inner-span lookups could have every re-check
/// land on the other site's. Thread-local counts: nothing shared is written.
#[inline]
fn recheck_due(site: LookupSite) -> bool {
    thread_local! {
        static LOOKUPS: [std::cell::Cell<u32>; 2] = const {
            [std::cell::Cell::new(0), std::cell::Cell::new(0)]
        };
    }
    LOOKUPS.with(|counts| {
        let n = &counts[site as usize];
        let next = n.get().wrapping_add(1) % RECHECK_EVERY;
        n.set(next);
        next == 0
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::prelude::*;

    use super::{AttachedContext, CHECKS, LookupSite, RECHECK_EVERY, SpanIds};

    thread_local! {
        /// Lookups on this thread that asked `tracing-opentelemetry`.
        pub(crate) static EXACT_LOOKUPS: Cell<u64> = const { Cell::new(0) };
    }

    /// A tracer of the SDK whose spans are sampled, exported to memory.
    pub(crate) fn tracer() -> opentelemetry_sdk::trace::SdkTracer {
        SdkTracerProvider::builder()
            .with_span_processor(SimpleSpanProcessor::new(InMemorySpanExporter::default()))
            .build()
            .tracer("spanprof-tower-tests")
    }

    /// A caller's span context, as a `traceparent` gives it.
    fn remote_span_context() -> opentelemetry::trace::SpanContext {
        opentelemetry::trace::SpanContext::new(
            opentelemetry::trace::TraceId::from(7),
            opentelemetry::trace::SpanId::from(9),
            opentelemetry::trace::TraceFlags::SAMPLED,
            true,
            Default::default(),
        )
    }

    /// A subscriber with `tracing-opentelemetry`'s layer, its context activation on or
    /// off, and a layer that records spanprof's warnings.
    pub(crate) fn otel_dispatch(activation: bool) -> (tracing::Dispatch, WarningCount) {
        otel_dispatch_seeing(activation, LevelFilter::TRACE)
    }

    /// The same, `tracing-opentelemetry`'s layer filtered to `seen` (a filter of its
    /// own: the other layers see every span).
    pub(crate) fn otel_dispatch_seeing(
        activation: bool,
        seen: LevelFilter,
    ) -> (tracing::Dispatch, WarningCount) {
        let otel = tracing_opentelemetry::layer()
            .with_tracer(tracer())
            .with_context_activation(activation)
            .with_filter(seen);
        let warnings = WarningCount::default();
        let dispatch = tracing::Dispatch::new(
            tracing_subscriber::registry()
                .with(otel)
                .with(warnings.clone()),
        );
        (dispatch, warnings)
    }

    /// Counts the warning events spanprof gives about the attached context.
    #[derive(Clone, Default)]
    pub(crate) struct WarningCount(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl WarningCount {
        pub(crate) fn get(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for WarningCount {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            struct Message(bool);
            impl tracing::field::Visit for Message {
                fn record_debug(&mut self, _: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    self.0 |= format!("{v:?}").contains("OpenTelemetry's current context");
                }
            }
            let mut m = Message(false);
            event.record(&mut m);
            if m.0 && *event.metadata().level() == tracing::Level::WARN {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// The ids `tracing-opentelemetry` gives the current span.
    fn exact() -> Option<SpanIds> {
        SpanIds::of_span(&tracing::Span::current())
    }

    /// Looks up `n` spans' ids through `check`, each inside its own entered span;
    /// returns how many lookups asked `tracing-opentelemetry`.
    fn look_up(check: &AttachedContext, n: u32) -> u32 {
        let mut asked = 0;
        for _ in 0..n {
            let span = tracing::info_span!("request");
            let want = SpanIds::of_span(&span);
            assert!(want.is_some());
            let got = span.in_scope(|| {
                check.current_span_ids(None, || {
                    asked += 1;
                    exact()
                })
            });
            assert_eq!(got, want, "a span got another span's ids");
        }
        asked
    }

    #[test]
    fn the_attached_context_is_read_alone_once_it_agreed_for_the_checks() {
        let (dispatch, warnings) = otel_dispatch(true);
        tracing::dispatcher::with_default(&dispatch, || {
            let check = AttachedContext::new(LookupSite::Request);
            assert_eq!(look_up(&check, 3 * CHECKS), CHECKS);
        });
        assert_eq!(warnings.get(), 0);
    }

    #[test]
    fn without_context_activation_every_lookup_asks_and_one_warning_names_the_fix() {
        let (dispatch, warnings) = otel_dispatch(false);
        tracing::dispatcher::with_default(&dispatch, || {
            let check = AttachedContext::new(LookupSite::Request);
            assert_eq!(look_up(&check, 3 * CHECKS), 3 * CHECKS);
        });
        assert_eq!(warnings.get(), 1);
    }

    #[test]
    fn a_context_attached_by_hand_is_not_taken_for_the_span() {
        // The checks passed; then a caller's (remote) context is attached by hand: a
        // remote span is never this process's.
        let (dispatch, _) = otel_dispatch(true);
        tracing::dispatcher::with_default(&dispatch, || {
            let check = AttachedContext::new(LookupSite::Request);
            look_up(&check, CHECKS);
            let remote = remote_span_context();
            let _cx = opentelemetry::Context::new()
                .with_remote_span_context(remote)
                .attach();
            assert_eq!(check.current_span_ids(None, exact), None);
        });
    }

    /// Inside an entered INFO span `outer` that `tracing-opentelemetry` sees, a DEBUG
    /// span it does not see (its filter is INFO): the ids `check` gives the hidden span,
    /// looked up with `enclosing` as the labels' span, and `outer`'s.
    fn hidden_inside_outer(
        check: &AttachedContext,
        enclosing: impl FnOnce(&SpanIds) -> Option<u64>,
    ) -> (Option<SpanIds>, SpanIds) {
        let outer = tracing::info_span!("outer");
        let outer_ids = SpanIds::of_span(&outer).expect("outer is seen");
        let enclosing = enclosing(&outer_ids);
        let got = outer.in_scope(|| {
            tracing::debug_span!("hidden").in_scope(|| check.current_span_ids(enclosing, exact))
        });
        (got, outer_ids)
    }

    #[test]
    fn a_span_hidden_from_opentelemetry_at_the_checks_refuses_the_attached_context() {
        // A request span tracing-opentelemetry's filter hides, inside a span it sees:
        // the attached context is the outer span's, which the request must not take.
        let (dispatch, warnings) = otel_dispatch_seeing(true, LevelFilter::INFO);
        tracing::dispatcher::with_default(&dispatch, || {
            let check = AttachedContext::new(LookupSite::Request);
            assert_eq!(hidden_inside_outer(&check, |_| None).0, None);
            look_up(&check, 3 * CHECKS);
            for _ in 0..3 * RECHECK_EVERY {
                let (got, outer) = hidden_inside_outer(&check, |_| None);
                assert_eq!(got, None, "the hidden span took {outer:?}");
            }
        });
        assert_eq!(warnings.get(), 1);
    }

    #[test]
    fn a_span_hidden_from_opentelemetry_after_the_checks_is_found_by_a_recheck() {
        let (dispatch, warnings) = otel_dispatch_seeing(true, LevelFilter::INFO);
        let wrong = tracing::dispatcher::with_default(&dispatch, || {
            let check = AttachedContext::new(LookupSite::Request);
            look_up(&check, CHECKS);
            let mut wrong = 0;
            for _ in 0..3 * RECHECK_EVERY {
                wrong += usize::from(hidden_inside_outer(&check, |_| None).0.is_some());
            }
            let (last, _) = hidden_inside_outer(&check, |_| None);
            assert_eq!(last, None);
            wrong
        });
        assert!(
            wrong < RECHECK_EVERY as usize,
            "{wrong} hidden spans took another span's ids"
        );
        assert_eq!(warnings.get(), 1);
    }

    #[test]
    fn an_inner_span_hidden_from_opentelemetry_is_asked_about_not_taken_for_its_parent() {
        // An inner span under its parent's labels (the parent's id is `enclosing`):
        // a filter of tracing-opentelemetry's own that hides it is a set-up, not a
        // mistake, so no warning, and the span gets no OpenTelemetry ids.
        let (dispatch, warnings) = otel_dispatch_seeing(true, LevelFilter::INFO);
        tracing::dispatcher::with_default(&dispatch, || {
            let check = AttachedContext::new(LookupSite::Request);
            for _ in 0..3 * RECHECK_EVERY {
                look_up(&check, 1);
                let (got, outer) = hidden_inside_outer(&check, |outer| Some(outer.span_id));
                assert_eq!(got, None, "the hidden span took {outer:?}");
            }
        });
        assert_eq!(warnings.get(), 0);
    }

    #[test]
    fn a_remote_context_is_never_a_span_of_this_process_whichever_lookup_gives_it() {
        // tracing-opentelemetry with no tracer: a span's context is its parent's, here
        // a caller's. Both lookups agree there is no span of this process.
        let warnings = WarningCount::default();
        let dispatch = tracing::Dispatch::new(
            tracing_subscriber::registry()
                .with(tracing_opentelemetry::layer())
                .with(warnings.clone()),
        );
        tracing::dispatcher::with_default(&dispatch, || {
            let check = AttachedContext::new(LookupSite::Request);
            for _ in 0..3 * CHECKS {
                let remote = remote_span_context();
                let span = tracing::info_span!("request");
                let _ =
                    span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
                assert_eq!(span.in_scope(|| check.current_span_ids(None, exact)), None);
            }
        });
        assert_eq!(warnings.get(), 0);
    }

    #[test]
    fn each_place_is_checked_again_whatever_the_other_place_looks_up() {
        // A request's lookup and its inner spans' lookups alternate on a thread: the
        // re-checks of one site must not all land on the other's lookups, whichever
        // of them a thread's count reaches first.
        let (dispatch, warnings) = otel_dispatch_seeing(true, LevelFilter::INFO);
        tracing::dispatcher::with_default(&dispatch, || {
            for offset in 0..2 {
                let request = AttachedContext::new(LookupSite::Request);
                let inner = AttachedContext::new(LookupSite::Entered);
                look_up(&request, CHECKS);
                look_up(&inner, CHECKS + offset);
                let mut wrong = 0;
                for _ in 0..3 * RECHECK_EVERY {
                    wrong += u32::from(hidden_inside_outer(&request, |_| None).0.is_some());
                    look_up(&inner, 1);
                }
                assert!(
                    wrong < RECHECK_EVERY,
                    "{wrong} hidden request spans took another span's ids"
                );
            }
        });
        assert_eq!(warnings.get(), 1);
    }
}
