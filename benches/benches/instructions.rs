//! Deterministic instruction counts (Callgrind, through gungraun) of spanprof's hot
//! paths: a poll through `Labelled` (label push, hot check, pop) against a bare
//! poll, `SpanLabels::enter()` + drop, one request and one poll through
//! `ProfileCorrelationLayer` against the same service without it, and one request
//! through the user's tracing stack with and without spanprof's layers. Each benchmark
//! repeats its path `N` times so the per-iteration figure is exact to a fraction of
//! an instruction; `scripts/instructions` compares them with the committed baseline
//! (`benches/instructions-baseline.json`) and fails on a regression.
//!
//! Needs valgrind and `gungraun-runner` at the version of the `gungraun` dev-dependency:
//! `scripts/instructions` installs both. No profiler runs: the sampler's signals would
//! make the counts depend on timing.
//!
//! `cargo bench -p spanprof-bench --bench instructions`

// gungraun's macros generate public modules without docs.
#![allow(missing_docs)]

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use gungraun::{library_benchmark, library_benchmark_group, main};
use spanprof::tower::{ProfileCorrelationLayer, ProfiledBody, RoutePolicy};
use spanprof::{Labelled, SpanLabels, WithSpanLabels};
use tower::{Layer, Service, service_fn};

/// Iterations per benchmark.
const N: u64 = 1000;

/// A future that is never ready: every poll does the same tiny amount of work.
struct Spin(u64);

impl Future for Spin {
    type Output = Result<http::Response<String>, Infallible>;
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0 = black_box(self.0.wrapping_add(1));
        Poll::Pending
    }
}

fn labels() -> SpanLabels {
    SpanLabels::builder()
        .trace_id(1)
        .span_id(2)
        .span_name("bench")
        .build()
}

fn poll_n<F: Future + ?Sized>(mut f: Pin<&mut F>, n: u64) -> u64 {
    let mut cx = Context::from_waker(Waker::noop());
    let mut pending = 0;
    for _ in 0..n {
        pending += u64::from(black_box(f.as_mut().poll(&mut cx)).is_pending());
    }
    pending
}

fn bare_future(n: u64) -> (Pin<Box<Spin>>, u64) {
    let mut f = Box::pin(Spin(0));
    poll_n(f.as_mut(), 1);
    (f, n)
}

fn labelled_future(n: u64) -> (Pin<Box<Labelled<Spin>>>, u64) {
    let mut f = Box::pin(Spin(0).with_span_labels(labels()));
    poll_n(f.as_mut(), 1);
    (f, n)
}

#[library_benchmark]
#[bench::n(args = (N), setup = bare_future)]
fn poll_bare((mut f, n): (Pin<Box<Spin>>, u64)) -> u64 {
    poll_n(f.as_mut(), n)
}

#[library_benchmark]
#[bench::n(args = (N), setup = labelled_future)]
fn poll_labelled((mut f, n): (Pin<Box<Labelled<Spin>>>, u64)) -> u64 {
    poll_n(f.as_mut(), n)
}

fn labels_n(n: u64) -> (SpanLabels, u64) {
    let l = labels();
    drop(l.enter());
    (l, n)
}

#[library_benchmark]
#[bench::n(args = (N), setup = labels_n)]
fn push_pop((l, n): (SpanLabels, u64)) {
    for _ in 0..n {
        let _g = black_box(&l).enter();
    }
}

/// The layer, sample rate 0, never slow. Its profiler is stopped before anything is
/// measured (no signal may land in a measured path), as `overhead`'s old version did.
fn layer() -> ProfileCorrelationLayer {
    let mut builder = ProfileCorrelationLayer::builder()
        .default_policy(RoutePolicy::new().sample_rate(0.0).never_slow());
    let profiler = spanprof::Profiler::builder().start().ok();
    if let Some(p) = &profiler {
        builder = builder.profiler(p.clone());
    }
    let layer = builder.build().unwrap();
    if let Some(p) = profiler {
        p.stop();
    }
    layer
}

type Handler =
    fn(http::Request<()>) -> std::future::Ready<Result<http::Response<String>, Infallible>>;

fn handler(
    _req: http::Request<()>,
) -> std::future::Ready<Result<http::Response<String>, Infallible>> {
    std::future::ready(Ok(http::Response::new(black_box(String::from("ok")))))
}

fn request() -> http::Request<()> {
    http::Request::get("/checkout").body(()).unwrap()
}

/// Runs `n` requests through `svc` to completion, on this thread, without a runtime
/// (the handler is ready at once).
fn serve_n<S, B>(svc: &mut S, n: u64) -> u64
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible>,
{
    let mut ok = 0;
    for _ in 0..n {
        let mut fut = std::pin::pin!(svc.call(request()));
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(Ok(resp)) = fut.as_mut().poll(&mut cx) {
            ok += u64::from(resp.status().is_success());
        }
    }
    ok
}

fn bare_service(n: u64) -> (tower::util::ServiceFn<Handler>, u64) {
    let mut svc = service_fn(handler as Handler);
    serve_n(&mut svc, 2);
    (svc, n)
}

/// Every request's route (a plain function, so the layered service has a name).
type RouteFn = fn(&http::Request<()>) -> Option<String>;

fn route(_: &http::Request<()>) -> Option<String> {
    Some("/checkout".to_owned())
}

type Layered =
    <ProfileCorrelationLayer<RouteFn> as Layer<tower::util::ServiceFn<Handler>>>::Service;

fn layered_service(n: u64) -> (Layered, u64) {
    let mut svc = layer()
        .make_route(route as RouteFn)
        .layer(service_fn(handler as Handler));
    serve_n(&mut svc, 2);
    (svc, n)
}

#[library_benchmark]
#[bench::n(args = (N), setup = bare_service)]
fn request_bare((mut svc, n): (tower::util::ServiceFn<Handler>, u64)) -> u64 {
    serve_n(&mut svc, n)
}

#[library_benchmark]
#[bench::n(args = (N), setup = layered_service)]
fn request_layered((mut svc, n): (Layered, u64)) -> u64 {
    serve_n(&mut svc, n)
}

/// A request's response future through the layer, boxed.
type LayeredFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<ProfiledBody<String>>, Infallible>>>>;

fn layered_poll(n: u64) -> (LayeredFuture, u64) {
    let mut svc = layer()
        .make_route(route as RouteFn)
        .layer(service_fn(|_req: http::Request<()>| Spin(0)));
    let mut f: LayeredFuture = Box::pin(svc.call(request()));
    poll_n(f.as_mut(), 1);
    (f, n)
}

#[library_benchmark]
#[bench::n(args = (N), setup = layered_poll)]
fn poll_layered((mut f, n): (LayeredFuture, u64)) -> u64 {
    poll_n(f.as_mut(), n)
}

library_benchmark_group!(
    name = per_poll;
    benchmarks = poll_bare, poll_labelled, push_pop, poll_layered
);

/// A span processor that drops every span as it ends, on the thread that ends it (a
/// batch processor's thread would run beside the measured one).
#[derive(Debug)]
struct DropSpans;

impl opentelemetry_sdk::trace::SpanProcessor for DropSpans {
    fn on_start(&self, _: &mut opentelemetry_sdk::trace::Span, _: &opentelemetry::Context) {}
    fn on_end(&self, span: opentelemetry_sdk::trace::SpanData) {
        drop(black_box(span));
    }
    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(
        &self,
        _: std::time::Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }
}

/// The user's stack as `overhead`'s servers run it, on this thread: a `request` span
/// (`TraceLayer`'s) entered around each poll, an inner span (`validate_order`, as
/// `#[instrument]` makes it), tracing-opentelemetry building both spans; with
/// `spanprof`, `SpanProfileLayer`, `SpanProfileProcessor` and the correlation layer,
/// as the docs set them up. No sample lands (the profiler is stopped), so this is what
/// a request no sample touches costs.
struct Stack {
    _default: tracing::subscriber::DefaultGuard,
    _provider: opentelemetry_sdk::trace::SdkTracerProvider,
}

fn stack(spanprof: bool) -> Stack {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::prelude::*;
    let provider = if spanprof {
        opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_span_processor(spanprof::tower::SpanProfileProcessor::new(DropSpans))
            .build()
    } else {
        opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_span_processor(DropSpans)
            .build()
    };
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("instructions")))
        .with(spanprof.then(spanprof::tower::SpanProfileLayer::new));
    Stack {
        _default: tracing::subscriber::set_default(subscriber),
        _provider: provider,
    }
}

fn validating_handler(
    _req: http::Request<()>,
) -> std::future::Ready<Result<http::Response<String>, Infallible>> {
    let _span = tracing::info_span!("validate_order").entered();
    std::future::ready(Ok(http::Response::new(black_box(String::from("ok")))))
}

/// Runs `n` requests through `svc` inside a `request` span each.
fn serve_in_spans<S, B>(svc: &mut S, n: u64) -> u64
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible>,
{
    let mut ok = 0;
    for _ in 0..n {
        let span = tracing::info_span!("request");
        let mut fut = std::pin::pin!(span.in_scope(|| svc.call(request())));
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(Ok(resp)) = span.in_scope(|| fut.as_mut().poll(&mut cx)) {
            ok += u64::from(resp.status().is_success());
        }
    }
    ok
}

type StackService = tower::util::ServiceFn<Handler>;

fn stack_service(n: u64) -> (Stack, StackService, u64) {
    let stack = stack(false);
    let mut svc = service_fn(validating_handler as Handler);
    serve_in_spans(&mut svc, 20);
    (stack, svc, n)
}

type StackLayered =
    <ProfileCorrelationLayer<RouteFn> as Layer<tower::util::ServiceFn<Handler>>>::Service;

fn stack_layered_service(n: u64) -> (Stack, StackLayered, u64) {
    let stack = stack(true);
    let mut svc = layer()
        .make_route(route as RouteFn)
        .layer(service_fn(validating_handler as Handler));
    serve_in_spans(&mut svc, 20);
    (stack, svc, n)
}

#[library_benchmark]
#[bench::n(args = (N), setup = stack_service)]
fn request_stack((_stack, mut svc, n): (Stack, StackService, u64)) -> u64 {
    serve_in_spans(&mut svc, n)
}

#[library_benchmark]
#[bench::n(args = (N), setup = stack_layered_service)]
fn request_stack_spanprof((_stack, mut svc, n): (Stack, StackLayered, u64)) -> u64 {
    serve_in_spans(&mut svc, n)
}

library_benchmark_group!(
    name = per_request;
    benchmarks = request_bare, request_layered, request_stack, request_stack_spanprof
);

main!(library_benchmark_groups = per_poll, per_request);
