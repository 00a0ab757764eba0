//! The cost of `ProfileCorrelationLayer`: per request (against the same service
//! without it, no network) and per poll of a request's future, including the
//! busy/idle accounting.
//!
//! `cargo bench -p spanprof-bench --bench layer_overhead`

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use spanprof::tower::{ProfileCorrelationLayer, RoutePolicy};
use tower::{Layer, Service, ServiceExt, service_fn};

/// A response future that stays pending: each poll does a tiny amount of work.
struct Spin(u64);

impl Future for Spin {
    type Output = Result<http::Response<String>, Infallible>;
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0 = black_box(self.0.wrapping_add(1));
        Poll::Pending
    }
}

fn bench(c: &mut Criterion) {
    let profiler = spanprof::Profiler::builder().start().expect("profiler");
    let layer = ProfileCorrelationLayer::builder()
        .default_policy(RoutePolicy::new().sample_rate(0.0).never_slow())
        .profiler(profiler.clone())
        .build()
        .unwrap();
    let handler = |_req: http::Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(black_box(String::from("ok"))))
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();

    let mut g = c.benchmark_group("layer");
    g.bench_function("request/bare", |b| {
        let svc = service_fn(handler);
        b.iter(|| {
            let req = http::Request::get("/checkout").body(()).unwrap();
            rt.block_on(svc.oneshot(req)).unwrap()
        })
    });
    g.bench_function("request/layered", |b| {
        let svc = layer
            .clone()
            .make_route(|_: &http::Request<()>| Some("/checkout".to_owned()))
            .layer(service_fn(handler));
        b.iter(|| {
            let req = http::Request::get("/checkout").body(()).unwrap();
            rt.block_on(svc.clone().oneshot(req)).unwrap()
        })
    });

    let mut cx = Context::from_waker(Waker::noop());
    g.bench_function("poll/bare", |b| {
        let mut f = pin!(Spin(0));
        b.iter(|| black_box(f.as_mut().poll(&mut cx).is_pending()))
    });
    g.bench_function("poll/layered", |b| {
        let mut svc = layer
            .clone()
            .make_route(|_: &http::Request<()>| Some("/checkout".to_owned()))
            .layer(service_fn(|_req: http::Request<()>| Spin(0)));
        let fut = svc.call(http::Request::get("/checkout").body(()).unwrap());
        let mut f = pin!(fut);
        b.iter(|| black_box(f.as_mut().poll(&mut cx).is_pending()))
    });
    g.finish();
    profiler.stop();
}

criterion_group!(benches, bench);
criterion_main!(benches);
