//! The signal handler never allocates: a counting global allocator sees no
//! allocator call from inside the handler over at least 100 000 samples taken while
//! the sampled code itself allocates heavily.

use std::time::{Duration, Instant};

use spanprof::{Hotness, Profiler, SpanLabels};
use spanprof_core::testing::HandlerAllocCounter;

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

/// A gRPC service answering every call with `paid`.
fn paid_handler() -> impl tower::Service<
    http::Request<()>,
    Response = http::Response<http_body_util::Full<bytes::Bytes>>,
    Error = std::convert::Infallible,
    Future = impl Future + Send,
> + Copy
+ Send {
    tower::service_fn(|_: http::Request<()>| async {
        let body = http_body_util::Full::new(bytes::Bytes::from_static(b"paid"));
        Ok::<_, std::convert::Infallible>(http::Response::new(body))
    })
}

/// A gRPC call of `/shop.Checkout/Pay`.
fn pay_request() -> http::Request<()> {
    http::Request::post("/shop.Checkout/Pay")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap()
}

/// On a route it has seen before, `ProfileCorrelationLayer` allocates nothing per
/// request: the request's label record comes from the pool; naming the route, finding
/// its policy and interning its names are done once per route. A gRPC call, so the
/// route is the request's own path (`GrpcRoute`), against the same service without
/// the layer.
#[test]
fn the_layer_allocates_nothing_per_request() {
    use http_body_util::BodyExt;
    use tower::{Layer, ServiceExt};
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let handler = paid_handler();
    let layer = spanprof::tower::ProfileCorrelationLayer::builder()
        .route("/shop.Checkout/Pay", spanprof::tower::RoutePolicy::new())
        .build()
        .expect("layer")
        .make_route(spanprof::tower::GrpcRoute);
    let layered = layer.layer(handler);
    let bare = allocations_per_call(
        &|| {
            rt.block_on(async {
                let response = handler.oneshot(pay_request()).await.unwrap();
                response.into_body().collect().await.unwrap();
            })
        },
        200,
    );
    let with_layer = allocations_per_call(
        &|| {
            rt.block_on(async {
                let response = layered.clone().oneshot(pay_request()).await.unwrap();
                response.into_body().collect().await.unwrap();
            })
        },
        200,
    );
    assert!(
        with_layer - bare <= 0.01,
        "the layer allocates {:.2} times per request ({bare:.2} without it, {with_layer:.2} with it)",
        with_layer - bare
    );
}

/// The documented set-up, with a request span and an inner span as `TraceLayer` and
/// `#[instrument]` make them, against the same stack without spanprof: a request no
/// sample lands in allocates nothing more on the thread that serves it (its records
/// come from the pool, an inner span's state lives in a table, not in a boxed span
/// extension, and nothing is tracked for the span processor).
#[test]
fn a_request_no_sample_lands_in_allocates_nothing_more_than_the_stack() {
    use http_body_util::BodyExt;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{BatchSpanProcessor, InMemorySpanExporter};
    use tower::{Layer, ServiceExt};
    use tracing::Instrument;
    use tracing_subscriber::prelude::*;

    // The profiler the layer starts samples at 99 Hz: a sample may land in one of the
    // requests, whose attributes the batching processor writes on its own thread.
    let per_request = |spanprof: bool| {
        let exporter = InMemorySpanExporter::default();
        let provider = if spanprof {
            opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_span_processor(spanprof::tower::SpanProfileProcessor::batch(
                    exporter.clone(),
                ))
                .build()
        } else {
            opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_span_processor(BatchSpanProcessor::builder(exporter.clone()).build())
                .build()
        };
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("alloc")))
            .with(spanprof.then(spanprof::tower::SpanProfileLayer::new));
        let _default = tracing::subscriber::set_default(subscriber);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let handler = tower::service_fn(|_: http::Request<()>| {
            async {
                let body = http_body_util::Full::new(bytes::Bytes::from_static(b"paid"));
                Ok::<_, std::convert::Infallible>(http::Response::new(body))
            }
            .instrument(tracing::info_span!("validate_order"))
        });
        let layered = spanprof::tower::ProfileCorrelationLayer::builder()
            .build()
            .expect("layer")
            .make_route(spanprof::tower::GrpcRoute)
            .layer(handler);
        let n = allocations_per_call(
            &|| {
                rt.block_on(
                    async {
                        if spanprof {
                            let response = layered.clone().oneshot(pay_request()).await.unwrap();
                            response.into_body().collect().await.unwrap();
                        } else {
                            let response = handler.oneshot(pay_request()).await.unwrap();
                            response.into_body().collect().await.unwrap();
                        }
                    }
                    .instrument(tracing::info_span!("request")),
                )
            },
            200,
        );
        provider.shutdown().expect("shutdown");
        n
    };
    let stack = per_request(false);
    let with_spanprof = per_request(true);
    assert!(
        with_spanprof - stack <= 0.01,
        "spanprof allocates {:.2} times per request ({stack:.2} with the stack alone, {with_spanprof:.2} with spanprof)",
        with_spanprof - stack
    );
}

/// Allocations per request on the thread that serves it and ends its span, through
/// `ProfileCorrelationLayer` inside a `tracing` request span exported by the
/// provider `processor` builds; and the spans that provider exported.
fn request_allocations(
    processor: impl opentelemetry_sdk::trace::SpanProcessor + 'static,
    exporter: &opentelemetry_sdk::trace::InMemorySpanExporter,
) -> (f64, Vec<opentelemetry_sdk::trace::SpanData>) {
    use http_body_util::BodyExt;
    use opentelemetry::trace::TracerProvider as _;
    use tower::{Layer, ServiceExt};
    use tracing::Instrument;
    use tracing_subscriber::prelude::*;

    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_span_processor(processor)
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("alloc")))
        .with(spanprof::tower::SpanProfileLayer::new());
    let _default = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let handler = paid_handler();
    let layered = spanprof::tower::ProfileCorrelationLayer::builder()
        .build()
        .expect("layer")
        .make_route(spanprof::tower::GrpcRoute)
        .layer(handler);
    let per_request = allocations_per_call(
        &|| {
            rt.block_on(
                async {
                    let response = layered.clone().oneshot(pay_request()).await.unwrap();
                    response.into_body().collect().await.unwrap();
                }
                .instrument(tracing::info_span!("request")),
            )
        },
        200,
    );
    provider.force_flush().expect("flush");
    let spans = exporter.get_finished_spans().expect("spans");
    provider.shutdown().expect("shutdown");
    (per_request, spans)
}

/// With a batching pipeline, spanprof's span processor allocates nothing on the
/// thread that ends a span: the profile id's string and the longer attribute list
/// are made on the batch processor's thread, which also frees them. Allocated on the
/// request's thread and freed on the exporter's, they cost about a point of CPU per
/// request on a 50 µs handler. The spans exported carry the same attributes. With
/// the figures on every span (`figures_on_every_span`), so that every span gets them.
#[test]
fn the_batching_span_processor_allocates_nothing_on_the_request_thread() {
    use opentelemetry_sdk::trace::{BatchSpanProcessor, InMemorySpanExporter, SpanData};
    use spanprof::tower::SpanProfileProcessor;

    let plain = InMemorySpanExporter::default();
    let (without, _) =
        request_allocations(BatchSpanProcessor::builder(plain.clone()).build(), &plain);
    // The control: attributes written as the span ends, on the request's thread.
    let on_end = InMemorySpanExporter::default();
    let (written_on_end, spans_on_end) = request_allocations(
        SpanProfileProcessor::new(BatchSpanProcessor::builder(on_end.clone()).build())
            .figures_on_every_span(),
        &on_end,
    );
    let batched = InMemorySpanExporter::default();
    let (written_in_batch, spans) = request_allocations(
        SpanProfileProcessor::batch(batched.clone()).figures_on_every_span(),
        &batched,
    );
    assert!(
        written_on_end - without >= 1.0,
        "the control should allocate on the request's thread (the attribute list): {:.2}",
        written_on_end - without
    );
    assert!(
        written_in_batch - without <= 0.1,
        "the span processor allocates {:.2} times per request on the request's thread",
        written_in_batch - without
    );
    // The same attributes both ways: every key (but `spanprof.hot`, there when the
    // layer's sample rate picked the request, and the profile id, there when a sample
    // landed in the request), the profile id the span's own.
    let keys = |span: &SpanData| {
        let mut keys: Vec<String> = span
            .attributes
            .iter()
            .map(|kv| kv.key.to_string())
            .filter(|k| k != spanprof::tower::ATTR_HOT && k != spanprof::tower::ATTR_PROFILE_ID)
            .collect();
        keys.sort();
        keys
    };
    assert_eq!(spans.len(), 210, "every request's span exported");
    assert_eq!(spans_on_end.len(), 210);
    for (span, control) in spans.iter().zip(&spans_on_end) {
        assert_eq!(keys(span), keys(control));
        let attr = |key: &str| {
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .map(|kv| kv.value.clone())
        };
        let id = format!(
            "{:016x}",
            u64::from_be_bytes(span.span_context.span_id().to_bytes())
        );
        let sampled = matches!(
            attr(spanprof::tower::ATTR_CPU_SAMPLES),
            Some(opentelemetry::Value::I64(n)) if n > 0
        );
        assert_eq!(
            attr(spanprof::tower::ATTR_PROFILE_ID),
            sampled.then(|| opentelemetry::Value::from(id))
        );
        assert!(
            matches!(attr(spanprof::tower::ATTR_POLLS), Some(opentelemetry::Value::I64(n)) if n >= 1)
        );
    }
    assert!(
        keys(&spans[0])
            .iter()
            .any(|k| k == spanprof::tower::ATTR_CPU_NS)
    );
}

/// The same through a real axum server on loopback (one current-thread runtime, so
/// the server's allocations are all on this thread): `TraceLayer` and
/// tracing-opentelemetry, with and without spanprof's documented layers, the same
/// requests from a client on that runtime. Cold requests (sample rate 0) allocate
/// nothing more; hot ones (sample rate 1) at most one wake stamp each (the waker that
/// measures their scheduling delay, reused unless the server still holds a waker
/// made from it).
#[test]
fn an_axum_request_no_sample_lands_in_allocates_nothing_more_than_the_stack() {
    use axum::{Router, routing::post};
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{BatchSpanProcessor, InMemorySpanExporter};
    use tower_http::trace::{DefaultMakeSpan, TraceLayer};
    use tracing_subscriber::prelude::*;

    #[tracing::instrument]
    fn validate(n: usize) -> usize {
        n * 2
    }
    let per_request = |spanprof: Option<f64>| {
        let exporter = InMemorySpanExporter::default();
        let provider = if spanprof.is_some() {
            opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_span_processor(spanprof::tower::SpanProfileProcessor::batch(
                    exporter.clone(),
                ))
                .build()
        } else {
            opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_span_processor(BatchSpanProcessor::builder(exporter.clone()).build())
                .build()
        };
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("alloc")))
            .with(spanprof.map(|_| spanprof::tower::SpanProfileLayer::new()));
        let _default = tracing::subscriber::set_default(subscriber);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let app = Router::new().route(
            "/api/orders",
            post(|body: String| async move { validate(body.len()).to_string() }),
        );
        // One `Router::layer` call with the layers in a `ServiceBuilder`, as the docs
        // set it up: axum boxes each route's service once per call.
        let trace = TraceLayer::new_for_http()
            .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO));
        let app = if let Some(rate) = spanprof {
            let layer = spanprof::tower::ProfileCorrelationLayer::builder()
                .default_policy(spanprof::tower::RoutePolicy::new().sample_rate(rate))
                .build()
                .expect("layer");
            app.layer(tower::ServiceBuilder::new().layer(trace).layer(layer))
        } else {
            app.layer(tower::ServiceBuilder::new().layer(trace))
        };
        let n = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<http_body_util::Full<bytes::Bytes>>();
            let call = || async {
                let request = http::Request::post(format!("http://{addr}/api/orders"))
                    .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
                    .unwrap();
                let response = client.request(request).await.unwrap();
                http_body_util::BodyExt::collect(response.into_body())
                    .await
                    .unwrap();
            };
            for _ in 0..20 {
                call().await;
            }
            let before = ALLOC.allocations_on_this_thread();
            let n = 500;
            for _ in 0..n {
                call().await;
            }
            (ALLOC.allocations_on_this_thread() - before) as f64 / f64::from(n)
        });
        provider.shutdown().expect("shutdown");
        n
    };
    let stack = per_request(None);
    let cold = per_request(Some(0.0));
    assert!(
        cold - stack <= 0.02,
        "spanprof allocates {:.2} times per cold request ({stack:.2} with the stack alone, {cold:.2} with spanprof)",
        cold - stack
    );
    let hot = per_request(Some(1.0));
    assert!(
        hot - stack <= 1.05,
        "spanprof allocates {:.2} times per hot request ({stack:.2} with the stack alone, {hot:.2} with spanprof)",
        hot - stack
    );
}
