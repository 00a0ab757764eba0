//! The `tower::Service` made by [`crate::ProfileCorrelationLayer`].

use std::task::{Context, Poll};

use super::future::ResponseFuture;
use super::{Correlator, MakeRoute};

/// Labels and profiles each request to the inner service. Made by
/// [`crate::ProfileCorrelationLayer`].
#[derive(Clone, Debug)]
pub struct ProfileCorrelation<S, R> {
    inner: S,
    correlator: Correlator,
    make_route: R,
}

impl<S, R> ProfileCorrelation<S, R> {
    pub(crate) fn new(inner: S, correlator: Correlator, make_route: R) -> Self {
        ProfileCorrelation {
            inner,
            correlator,
            make_route,
        }
    }
}

impl<S, R, B, ResBody> tower_service::Service<http::Request<B>> for ProfileCorrelation<S, R>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<ResBody>>,
    R: MakeRoute<B>,
{
    type Response = http::Response<super::ProfiledBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let names_routes = self.make_route.names_http_routes();
        let route = self.make_route.make_route(&request);
        let mut profile = self
            .correlator
            .begin(&request, route.as_deref(), names_routes);
        drop(route);
        // The inner service's own work in `call` is the request's too.
        let inner = match profile.as_mut() {
            Some(p) => p.poll(|| self.inner.call(request)),
            None => self.inner.call(request),
        };
        ResponseFuture::new(inner, profile)
    }
}
