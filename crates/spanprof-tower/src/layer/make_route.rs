//! Naming a request's route: the framework's route template, never the raw path.

use std::borrow::Cow;

/// The route label of requests no route template matched.
pub const UNMATCHED_ROUTE: &str = "(unmatched)";

/// Names the route of a request: a template such as `/cart/{id}` or the gRPC method
/// path `/package.Service/Method`. Returning `None` labels the request
/// [`UNMATCHED_ROUTE`]. Never return a raw path with ids or a query string: routes
/// become labels, and labels must stay few and free of secrets.
///
/// Closures `FnMut(&http::Request<B>) -> Option<String>` implement it.
pub trait MakeRoute<B> {
    /// The route template of `request`.
    fn make_route(&mut self, request: &http::Request<B>) -> Option<Cow<'static, str>>;
}

impl<B, F> MakeRoute<B> for F
where
    F: FnMut(&http::Request<B>) -> Option<String>,
{
    fn make_route(&mut self, request: &http::Request<B>) -> Option<Cow<'static, str>> {
        self(request).map(Cow::Owned)
    }
}

/// The default: axum's `MatchedPath` when present (feature `axum`), else the gRPC
/// method path for gRPC requests, else [`UNMATCHED_ROUTE`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultRoute;

impl<B> MakeRoute<B> for DefaultRoute {
    fn make_route(&mut self, request: &http::Request<B>) -> Option<Cow<'static, str>> {
        #[cfg(feature = "axum")]
        if let Some(m) = request.extensions().get::<axum::extract::MatchedPath>() {
            return Some(Cow::Owned(m.as_str().to_owned()));
        }
        GrpcRoute.make_route(request)
    }
}

/// gRPC: the route is the method path `/package.Service/Method` (a fixed set per
/// server); anything else is unmatched.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcRoute;

impl<B> MakeRoute<B> for GrpcRoute {
    fn make_route(&mut self, request: &http::Request<B>) -> Option<Cow<'static, str>> {
        is_grpc(request.headers()).then_some(())?;
        let path = request.uri().path();
        let mut parts = path.strip_prefix('/')?.split('/');
        let (service, method) = (parts.next()?, parts.next()?);
        let ok = parts.next().is_none()
            && service.contains('.')
            && !method.is_empty()
            && path.len() <= 128
            && path
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/._".contains(&b));
        ok.then(|| Cow::Owned(path.to_owned()))
    }
}

pub(crate) fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}
