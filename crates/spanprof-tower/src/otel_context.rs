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

/// The warning given when the attached context is not the current span's.
pub(crate) const NOT_ATTACHED_MESSAGE: &str = "spanprof: OpenTelemetry's current context is not the entered \
tracing span's (tracing-opentelemetry's context activation is off, or its layer is added after \
SpanProfileLayer), so spanprof asks tracing-opentelemetry for each span's context, about 1 µs more per span: \
keep tracing_opentelemetry::layer()'s context activation on (the default) and add it to the subscriber before \
spanprof::SpanProfileLayer.";

/// Whether OpenTelemetry's attached context has been found to be the current span's,
/// for one place that looks it up (the request span in the tower layer, inner spans
/// in `SpanProfileLayer`: the layer order matters to the second only).
#[derive(Debug)]
pub(crate) struct AttachedContext {
    /// Lookups still to compare; 0: the attached context is trusted; `REFUSED`: it
    /// is not, every lookup asks `tracing-opentelemetry`.
    checks_left: AtomicU32,
}

/// Whether [`NOT_ATTACHED_MESSAGE`] was given (once per process, by either place).
static WARNED: AtomicBool = AtomicBool::new(false);

/// A span context's ids, as the labels carry them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpanIds {
    pub(crate) trace_id: u128,
    pub(crate) span_id: u64,
    pub(crate) sampled: bool,
}

impl SpanIds {
    /// The ids of a valid span context.
    pub(crate) fn of(sc: &SpanContext) -> Option<SpanIds> {
        sc.is_valid().then(|| SpanIds {
            trace_id: u128::from_be_bytes(sc.trace_id().to_bytes()),
            span_id: u64::from_be_bytes(sc.span_id().to_bytes()),
            sampled: sc.is_sampled(),
        })
    }
}

/// The ids of OpenTelemetry's current (attached) context's span, if a local one:
/// a remote span context is a caller's, never a span of this process.
fn attached() -> Option<SpanIds> {
    opentelemetry::Context::map_current(|cx| {
        let span = cx.span();
        let sc = span.span_context();
        if sc.is_remote() {
            None
        } else {
            SpanIds::of(sc)
        }
    })
}

impl AttachedContext {
    /// Not yet checked.
    pub(crate) const fn new() -> Self {
        AttachedContext {
            checks_left: AtomicU32::new(CHECKS),
        }
    }

    /// The ids of the current `tracing` span's OpenTelemetry span; `exact` asks
    /// `tracing-opentelemetry` (see the module's doc for when it is called).
    pub(crate) fn current_span_ids(
        &self,
        exact: impl FnOnce() -> Option<SpanIds>,
    ) -> Option<SpanIds> {
        let left = self.checks_left.load(Ordering::Relaxed);
        if left == 0 {
            return attached();
        }
        #[cfg(test)]
        tests::EXACT_LOOKUPS.with(|n| n.set(n.get() + 1));
        let ids = exact();
        if left != REFUSED && ids.is_some() {
            if attached() == ids {
                // Counts down unless another thread refused meanwhile.
                let _ = self
                    .checks_left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        (n != 0 && n != REFUSED).then(|| n - 1)
                    });
            } else {
                self.checks_left.store(REFUSED, Ordering::Relaxed);
                if !WARNED.load(Ordering::Relaxed) && !WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!("{NOT_ATTACHED_MESSAGE}");
                }
            }
        }
        ids
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::prelude::*;

    use super::{AttachedContext, CHECKS, SpanIds};

    thread_local! {
        /// Lookups on this thread that asked `tracing-opentelemetry`.
        pub(crate) static EXACT_LOOKUPS: Cell<u64> = const { Cell::new(0) };
    }

    /// A subscriber with `tracing-opentelemetry`'s layer, its context activation on or
    /// off, and a layer that records spanprof's warnings.
    pub(crate) fn otel_dispatch(activation: bool) -> (tracing::Dispatch, WarningCount) {
        let provider = SdkTracerProvider::builder()
            .with_span_processor(SimpleSpanProcessor::new(InMemorySpanExporter::default()))
            .build();
        let otel = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("otel-context-tests"))
            .with_context_activation(activation);
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
        let cx = tracing::Span::current().context();
        let span = cx.span();
        SpanIds::of(span.span_context())
    }

    /// Looks up `n` spans' ids through `check`, each inside its own entered span;
    /// returns how many lookups asked `tracing-opentelemetry`.
    fn look_up(check: &AttachedContext, n: u32) -> u32 {
        let mut asked = 0;
        for _ in 0..n {
            let span = tracing::info_span!("request");
            let want = SpanIds::of(span.context().span().span_context());
            assert!(want.is_some());
            let got = span.in_scope(|| {
                check.current_span_ids(|| {
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
            let check = AttachedContext::new();
            assert_eq!(look_up(&check, 3 * CHECKS), CHECKS);
        });
        assert_eq!(warnings.get(), 0);
    }

    #[test]
    fn without_context_activation_every_lookup_asks_and_one_warning_names_the_fix() {
        let (dispatch, warnings) = otel_dispatch(false);
        tracing::dispatcher::with_default(&dispatch, || {
            let check = AttachedContext::new();
            assert_eq!(look_up(&check, 3 * CHECKS), 3 * CHECKS);
        });
        assert_eq!(warnings.get(), 1);
    }

    #[test]
    fn a_context_attached_by_hand_is_not_taken_for_the_span() {
        // The checks passed; then a caller's (remote) context is attached inside a
        // span: a remote span is never this process's.
        let (dispatch, _) = otel_dispatch(true);
        tracing::dispatcher::with_default(&dispatch, || {
            let check = AttachedContext::new();
            look_up(&check, CHECKS);
            let remote = opentelemetry::trace::SpanContext::new(
                opentelemetry::trace::TraceId::from(7),
                opentelemetry::trace::SpanId::from(9),
                opentelemetry::trace::TraceFlags::SAMPLED,
                true,
                Default::default(),
            );
            let _cx = opentelemetry::Context::new()
                .with_remote_span_context(remote)
                .attach();
            assert_eq!(check.current_span_ids(exact), None);
        });
    }
}
