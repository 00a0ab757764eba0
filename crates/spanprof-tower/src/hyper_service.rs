//! Plain hyper 1.x servers: a `hyper::service::Service` wrapper whose closure names
//! the route.

use crate::ProfileCorrelationLayer;
use crate::layer::{Correlator, ProfiledBody, ResponseFuture};

/// Wraps a hyper service (for example `hyper::service::service_fn(...)`) so that
/// every request is labelled and profiled like [`ProfileCorrelationLayer`] does,
/// with `route` naming each request's route template.
///
/// ```
/// use std::convert::Infallible;
/// use http_body_util::Full;
/// use hyper::{Request, Response, body::{Bytes, Incoming}, service::service_fn};
/// use spanprof_tower::{ProfileCorrelationLayer, hyper_service::ProfiledService};
///
/// let svc = ProfiledService::new(
///     service_fn(|_req: Request<Incoming>| async {
///         Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("paid"))))
///     }),
///     ProfileCorrelationLayer::new(),
///     |req: &Request<Incoming>| match req.uri().path() {
///         "/pay" => Some("/pay".to_owned()),
///         _ => None,
///     },
/// );
/// // hyper::server::conn::http1::Builder::new().serve_connection(io, svc)
/// # drop(svc);
/// ```
#[derive(Debug, Clone)]
pub struct ProfiledService<S, F> {
    inner: S,
    correlator: Correlator,
    route: F,
}

impl<S, F> ProfiledService<S, F> {
    /// Wraps `inner`, with the policies of `layer` and `route` naming routes.
    pub fn new<R>(inner: S, layer: ProfileCorrelationLayer<R>, route: F) -> Self {
        ProfiledService {
            inner,
            correlator: layer.correlator,
            route,
        }
    }
}

impl<S, F, B, ResBody> hyper::service::Service<http::Request<B>> for ProfiledService<S, F>
where
    S: hyper::service::Service<http::Request<B>, Response = http::Response<ResBody>>,
    F: Fn(&http::Request<B>) -> Option<String>,
{
    type Response = http::Response<ProfiledBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn call(&self, request: http::Request<B>) -> Self::Future {
        let route = (self.route)(&request);
        let mut profile = self.correlator.begin(&request, route.as_deref(), true);
        let inner = match profile.as_mut() {
            Some(p) => p.poll(|| self.inner.call(request)),
            None => self.inner.call(request),
        };
        ResponseFuture::new(inner, profile)
    }
}
