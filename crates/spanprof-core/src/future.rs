//! Futures and streams whose every poll (and drop) runs with span labels pushed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;

use crate::labels::SpanLabels;

pin_project_lite::pin_project! {
    /// A future or stream that pushes its [`SpanLabels`] into the polling thread's
    /// slot around every poll of the inner value and around its drop.
    ///
    /// Made by [`WithSpanLabels::with_span_labels`] or [`SpanLabels::instrument`].
    /// Works on any executor and any tokio build (no `tokio_unstable` needed).
    #[derive(Debug)]
    pub struct Labelled<T> {
        labels: SpanLabels,
        #[pin]
        inner: Option<T>,
    }

    impl<T> PinnedDrop for Labelled<T> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            let _guard = this.labels.enter();
            // Drop the inner value inside the labels: its destructor's work is the span's.
            this.inner.set(None);
        }
    }
}

impl<T> Labelled<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, labels: SpanLabels) -> Self {
        Labelled {
            labels,
            inner: Some(inner),
        }
    }

    /// The labels pushed around each poll.
    pub fn labels(&self) -> &SpanLabels {
        &self.labels
    }

    /// One poll helper for both `Future` and `Stream`.
    #[inline]
    fn poll_with<R>(self: Pin<&mut Self>, f: impl FnOnce(Pin<&mut T>) -> Poll<R>) -> Poll<R> {
        let this = self.project();
        let _guard = this.labels.enter();
        match this.inner.as_pin_mut() {
            Some(inner) => f(inner),
            None => panic!("Labelled polled after its inner value was dropped"),
        }
    }
}

impl<F: Future> Future for Labelled<F> {
    type Output = F::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.poll_with(|f| f.poll(cx))
    }
}

impl<S: Stream> Stream for Labelled<S> {
    type Item = S::Item;

    #[inline]
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        self.poll_with(|s| s.poll_next(cx))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.as_ref().map_or((0, Some(0)), |s| s.size_hint())
    }
}

/// Attaches [`SpanLabels`] to any future or stream.
///
/// ```
/// use spanprof_core::{SpanLabels, WithSpanLabels};
/// # async fn handler() {}
/// let labels = SpanLabels::builder().span_id(7).span_name("GET /health").build();
/// let fut = handler().with_span_labels(labels);
/// # drop(fut);
/// ```
pub trait WithSpanLabels: Sized {
    /// Wraps `self` so that every poll runs with `labels` in the thread's slot.
    fn with_span_labels(self, labels: SpanLabels) -> Labelled<Self> {
        Labelled::new(self, labels)
    }

    /// Wraps `self` with the labels active right now, if any (unchanged otherwise,
    /// but still wrapped so the type is the same). Like [`crate::current_labels`], this
    /// carries the labels without keeping their span alive: work that outlives the
    /// span is sampled as detached.
    fn with_current_span_labels(self) -> Labelled<Self> {
        let labels = crate::current_labels().unwrap_or_else(|| SpanLabels::builder().build());
        Labelled::new(self, labels)
    }
}

impl<T> WithSpanLabels for T {}

impl SpanLabels {
    /// Wraps a future or stream so every poll runs with these labels.
    pub fn instrument<T>(&self, inner: T) -> Labelled<T> {
        Labelled::new(inner, self.clone())
    }
}

/// Like [`tokio::task::spawn_blocking`], but the closure runs with the labels that are
/// active where it was spawned. tokio's task hooks do not cover blocking tasks, so
/// this is how blocking work stays attributed to its span. The labels are carried,
/// not owned: if the span ends while the closure still runs, the rest of its work is
/// sampled as detached (see [`SpanLabels`]).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let sum = spanprof_core::spawn_blocking(|| (0..1000u64).sum::<u64>()).await.unwrap();
/// assert_eq!(sum, 499500);
/// # }
/// ```
pub fn spawn_blocking<F, R>(f: F) -> tokio::task::JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let labels = crate::current_labels();
    tokio::task::spawn_blocking(move || match labels {
        Some(l) => {
            let _g = l.enter();
            f()
        }
        None => f(),
    })
}

/// Like [`tokio::task::spawn_local`], but the future runs with the labels that are
/// active where it was spawned. tokio runs no task hooks for `LocalSet` tasks, so
/// even with `--cfg tokio_unstable` a `tokio::task::spawn_local` child does not
/// inherit its parent's labels; this carries them (without keeping the span alive,
/// as [`spawn_blocking`] does). Must be called inside a `LocalSet`, as tokio's.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let local = tokio::task::LocalSet::new();
/// let n = local
///     .run_until(async { spanprof_core::spawn_local(async { 6 * 7 }).await.unwrap() })
///     .await;
/// assert_eq!(n, 42);
/// # }
/// ```
pub fn spawn_local<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    match crate::current_labels() {
        Some(labels) => tokio::task::spawn_local(Labelled::new(future, labels)),
        None => tokio::task::spawn_local(future),
    }
}
