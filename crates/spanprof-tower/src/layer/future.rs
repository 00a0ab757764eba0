//! The response future and body: labels pushed around every poll of both, and
//! around their drop, with exact poll accounting, so streaming responses stay
//! attributed to their request and a cancelled request's destructors run labelled.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};

use super::RequestProfile;

pin_project_lite::pin_project! {
    /// The future of [`super::ProfileCorrelation`]: polls the inner future with the
    /// request's labels pushed, then hands them to the response body.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Option<F>,
        profile: Option<RequestProfile>,
    }

    impl<F> PinnedDrop for ResponseFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            // Cancelled before the response (a timeout, a client gone): the inner
            // future's destructors are the request's work too, and what was measured
            // is still published.
            if let Some(p) = this.profile.as_ref() {
                let _labels = p.labels.enter();
                this.inner.set(None);
                p.publish();
                p.labels.record_latency();
            }
        }
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, profile: Option<RequestProfile>) -> Self {
        ResponseFuture {
            inner: Some(inner),
            profile,
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<ProfiledBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let inner = this
            .inner
            .as_pin_mut()
            .expect("ResponseFuture polled after completion");
        let out = match this.profile.as_mut() {
            Some(p) => p.poll_with_context(cx, |cx| inner.poll(cx)),
            None => inner.poll(cx),
        };
        match out {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(response)) => {
                let profile = this.profile.take();
                if let Some(p) = profile.as_ref() {
                    p.publish();
                }
                Poll::Ready(Ok(response.map(|body| ProfiledBody {
                    inner: Some(body),
                    profile,
                })))
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body polled with its request's labels pushed (streaming responses,
    /// such as gRPC server streams, stay labelled for the life of the stream).
    pub struct ProfiledBody<B> {
        #[pin]
        inner: Option<B>,
        profile: Option<RequestProfile>,
    }

    impl<B> PinnedDrop for ProfiledBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if let Some(p) = this.profile.as_ref() {
                // The request is over.
                p.labels.withdraw_thread_context();
                p.labels.record_latency();
                let _labels = p.labels.enter();
                this.inner.set(None);
                p.publish();
            }
        }
    }
}

impl<B> std::fmt::Debug for ProfiledBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfiledBody").finish_non_exhaustive()
    }
}

impl<B: Body> Body for ProfiledBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(None);
        };
        match this.profile.as_mut() {
            Some(p) => {
                let mut inner = inner;
                let out = p.poll_with_context(cx, |cx| inner.as_mut().poll_frame(cx));
                let end = match &out {
                    Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                        // End of stream: publish before the span around us ends.
                        p.publish();
                        true
                    }
                    // The last frame: the server may not poll again, and may drop
                    // the body only at the connection's next request.
                    Poll::Ready(Some(Ok(_))) => inner.is_end_stream(),
                    Poll::Pending => false,
                };
                if end {
                    // Outside profilers stop reading the request's labels before
                    // OpenTelemetry stamps its span's end (at the span's exit
                    // around this poll), even in a task it spawned that is still
                    // inside its last poll.
                    p.labels.withdraw_thread_context();
                    // Its latency ends here too: the server may drop the body only
                    // at the connection's next request.
                    p.labels.record_latency();
                }
                out
            }
            None => inner.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}
