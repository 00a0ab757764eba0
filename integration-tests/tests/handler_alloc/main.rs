//! The signal handler never allocates: a counting global allocator sees no
//! allocator call from inside the handler over at least 100 000 samples taken while
//! the sampled code itself allocates heavily.

use std::time::{Duration, Instant};

use spanprof::{HandlerAllocCounter, Hotness, Profiler, SpanLabels};

#[global_allocator]
static ALLOC: HandlerAllocCounter = HandlerAllocCounter::new();

#[test]
fn handler_allocates_nothing_over_100k_samples() {
    let profiler = Profiler::builder().high_hz(4000).start().expect("profiler");
    let target = 100_000;
    let deadline = Instant::now() + Duration::from_secs(120);
    let threads: Vec<_> = (0..2)
        .map(|t| {
            std::thread::spawn(move || {
                spanprof::register_current_thread();
                let labels = SpanLabels::builder()
                    .span_id(100 + t)
                    .span_name("alloc-heavy")
                    .hot(Hotness::Sampled)
                    .build();
                let _g = labels.enter();
                let mut keep: Vec<Vec<u8>> = Vec::new();
                while Instant::now() < deadline {
                    for i in 0..1000 {
                        keep.push(vec![i as u8; 64 + (i % 512)]);
                    }
                    keep.clear();
                    if spanprof::Profiler::current()
                        .is_some_and(|p| p.sampler_stats().samples >= target)
                    {
                        break;
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = profiler.sampler_stats();
    profiler.stop();
    assert!(stats.samples >= target, "only {} samples", stats.samples);
    assert!(
        ALLOC.total() > 1_000_000,
        "the workload should allocate a lot"
    );
    assert_eq!(
        ALLOC.in_handler(),
        0,
        "allocator called from the signal handler"
    );
}

/// Allocations the calling thread makes per call of `call` (after a warm-up: a
/// route's name and policy are new on its first request).
fn allocations_per_call(call: &dyn Fn(), n: u64) -> f64 {
    for _ in 0..10 {
        call();
    }
    let before = ALLOC.allocations_on_this_thread();
    for _ in 0..n {
        call();
    }
    (ALLOC.allocations_on_this_thread() - before) as f64 / n as f64
}

/// On a route it has seen before, `ProfileCorrelationLayer` allocates one thing per
/// request: the request's label record. Naming the route, finding its policy and
/// interning its names are done once per route, not per request (the correlation
/// layer's cost, docs/benchmarks.md, issue 12). A gRPC call, so the route is the
/// request's own path (`GrpcRoute`), against the same service without the layer.
#[test]
fn the_layer_allocates_only_the_label_record_per_request() {
    use http_body_util::BodyExt;
    use tower::{Layer, ServiceExt};
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let handler = tower::service_fn(|_: http::Request<()>| async {
        let body = http_body_util::Full::new(bytes::Bytes::from_static(b"paid"));
        Ok::<_, std::convert::Infallible>(http::Response::new(body))
    });
    let layer = spanprof::tower::ProfileCorrelationLayer::builder()
        .route("/shop.Checkout/Pay", spanprof::tower::RoutePolicy::new())
        .build()
        .expect("layer")
        .make_route(spanprof::tower::GrpcRoute);
    let layered = layer.layer(handler);
    let request = || {
        http::Request::post("/shop.Checkout/Pay")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
    };
    let bare = allocations_per_call(
        &|| {
            rt.block_on(async {
                let response = handler.oneshot(request()).await.unwrap();
                response.into_body().collect().await.unwrap();
            })
        },
        200,
    );
    let with_layer = allocations_per_call(
        &|| {
            rt.block_on(async {
                let response = layered.clone().oneshot(request()).await.unwrap();
                response.into_body().collect().await.unwrap();
            })
        },
        200,
    );
    assert!(
        with_layer - bare <= 1.0,
        "the layer allocates {:.2} times per request ({bare:.2} without it, {with_layer:.2} with it)",
        with_layer - bare
    );
}
