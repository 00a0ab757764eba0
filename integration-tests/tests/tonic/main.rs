//! The tonic adapter on a real gRPC server over loopback: concurrent unary calls to
//! two methods burning CPU in different functions, and a server stream labelled for
//! its whole life.

#[path = "../support/mod.rs"]
mod support;

use std::pin::Pin;

use spanprof_integration_tests::burner::burner_client::BurnerClient;
use spanprof_integration_tests::burner::burner_server::{Burner, BurnerServer};
use spanprof_integration_tests::burner::{BurnReply, BurnRequest};
use spanprof_tower::{GrpcRoute, ProfileCorrelationLayer, RoutePolicy};
use spanprof_workloads::BURNERS;
use support::web::*;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};
use tower_http::trace::TraceLayer;

#[derive(Default)]
struct Svc;

type ReplyStream = Pin<Box<dyn Stream<Item = Result<BurnReply, Status>> + Send>>;

#[tonic::async_trait]
impl Burner for Svc {
    async fn alpha(&self, r: Request<BurnRequest>) -> Result<Response<BurnReply>, Status> {
        let checksum = burn_async(u64::from(r.into_inner().millis), BURNERS[0].1).await;
        Ok(Response::new(BurnReply { checksum }))
    }

    async fn beta(&self, r: Request<BurnRequest>) -> Result<Response<BurnReply>, Status> {
        let checksum = burn_async(u64::from(r.into_inner().millis), BURNERS[1].1).await;
        Ok(Response::new(BurnReply { checksum }))
    }

    type StreamStream = ReplyStream;

    async fn stream(&self, r: Request<BurnRequest>) -> Result<Response<ReplyStream>, Status> {
        let BurnRequest { millis, count } = r.into_inner();
        // Each item burns CPU when the stream is polled, long after this handler
        // returned: only the labelled response body attributes it.
        let s = tokio_stream::iter(0..count).map(move |_| {
            Ok(BurnReply {
                checksum: burn_blocking(u64::from(millis), BURNERS[2].1),
            })
        });
        Ok(Response::new(Box::pin(s)))
    }
}

async fn serve() -> String {
    serve_layer().await.0
}

/// The server, and its layer (a handle on the layer's counters).
async fn serve_layer() -> (String, ProfileCorrelationLayer<GrpcRoute>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let layer = ProfileCorrelationLayer::builder()
        .default_policy(RoutePolicy::new().sample_rate(1.0))
        .build()
        .unwrap()
        .make_route(GrpcRoute);
    let handle = layer.clone();
    // No Nagle on the server's side either (tonic sets it only on sockets it accepts
    // itself): many small calls otherwise wait for delayed ACKs.
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener)
        .map(|s| s.inspect(|s| s.set_nodelay(true).expect("TCP_NODELAY")));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(TraceLayer::new_for_grpc().make_span_with(server_span))
            .layer(layer)
            .add_service(BurnerServer::new(Svc))
            .serve_with_incoming(incoming)
            .await
            .unwrap()
    });
    (format!("http://{addr}"), handle)
}

async fn client(url: String) -> BurnerClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    BurnerClient::new(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_spans_carry_profile_ids_and_own_profiles() {
    otel();
    let url = serve().await;
    let mut calls = Vec::new();
    for i in 0..10 {
        let url = url.clone();
        calls.push(tokio::spawn(async move {
            let mut c = client(url).await;
            let req = BurnRequest {
                millis: 60,
                count: 0,
            };
            if i % 2 == 0 {
                c.alpha(req).await.map(|_| ())
            } else {
                c.beta(req).await.map(|_| ())
            }
        }));
    }
    for c in calls {
        c.await.unwrap().expect("grpc call");
    }
    let spans = wait_spans(10, named("POST /burner.Burner/"));
    assert_eq!(spans.len(), 10);
    let profiler = profiler();
    profiler.flush();
    for span in &spans {
        assert_span_attributes(span);
        let (mine, other) = if span.name.ends_with("/Alpha") {
            ("burn_class_0", "burn_class_1")
        } else {
            ("burn_class_1", "burn_class_0")
        };
        let p = profiler.store().span_tree(span_id(span)).expect("samples");
        assert_top(&p, mine, &[other]);
        let route = &p.samples[0].labels.as_ref().unwrap().route;
        assert!(route.starts_with("/burner.Burner/"), "{route}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_streams_are_labelled_for_their_whole_life() {
    otel();
    let url = serve().await;
    let mut c = client(url).await;
    let mut stream = c
        .stream(BurnRequest {
            millis: 40,
            count: 8,
        })
        .await
        .unwrap()
        .into_inner();
    let mut n = 0;
    while let Some(item) = stream.next().await {
        item.unwrap();
        n += 1;
    }
    assert_eq!(n, 8);
    let spans = wait_spans(1, named("POST /burner.Burner/Stream"));
    assert_eq!(spans.len(), 1);
    assert_span_attributes(&spans[0]);
    let profiler = profiler();
    profiler.flush();
    let p = profiler
        .store()
        .span_tree(span_id(&spans[0]))
        .expect("samples");
    assert_top(&p, "burn_class_2", &["burn_class_0", "burn_class_1"]);
    // 8 items x 40 ms of CPU, all inside body polls, profiled hot at 1 kHz.
    assert!(p.cpu_ns() >= 200_000_000, "{} ns", p.cpu_ns());
    assert!(attr_i64(&spans[0], "spanprof.busy_ns") >= 300_000_000);
}

/// Calls `path` on the server, which serves no such method: tonic answers
/// `Unimplemented` itself.
async fn call_unimplemented(channel: tonic::transport::Channel, path: String) {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("channel ready");
    let path = http::uri::PathAndQuery::try_from(path).expect("a valid path");
    let status = grpc
        .unary(
            Request::new(BurnRequest {
                millis: 0,
                count: 0,
            }),
            path,
            tonic_prost::ProstCodec::<BurnRequest, BurnReply>::default(),
        )
        .await
        .expect_err("no such method");
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
}

/// The route label of the one request behind the exported span `span`.
fn route_of(span: &opentelemetry_sdk::trace::SpanData) -> String {
    let profiler = profiler();
    profiler.flush();
    let p = profiler
        .store()
        .span_tree(span_id(span))
        .expect("samples of the call");
    p.samples[0].labels.as_ref().unwrap().route.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_method_names_neither_fill_the_interner_nor_rename_real_methods() {
    otel();
    let (url, layer) = serve_layer().await;
    let mut c = client(url.clone()).await;
    let burn = BurnRequest {
        millis: 40,
        count: 0,
    };
    c.alpha(burn).await.expect("alpha before the flood");
    let before = spanprof::stats::intern_stats();
    // 5 000 distinct method names, each a well-formed `/package.Service/Method`: half
    // in the served service, half in services that do not exist.
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut names: Vec<String> = (0..5_000)
        .map(|i| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            if i % 2 == 0 {
                format!("/burner.Burner/M{rng:016x}")
            } else {
                format!("/scan{:08x}.Svc/Get", rng >> 32)
            }
        })
        .collect();
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let chunk = names.split_off(names.len().saturating_sub(625));
            let channel = channel.clone();
            tokio::spawn(async move {
                for path in chunk {
                    call_unimplemented(channel.clone(), path).await;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let flooded = spanprof::stats::intern_stats();
    let flood_end = std::time::SystemTime::now();
    c.alpha(burn).await.expect("alpha after the flood");
    let after = wait_spans(2, named("POST /burner.Burner/Alpha"))
        .into_iter()
        .find(|s| s.start_time > flood_end)
        .expect("the span of the call after the flood");
    assert_eq!(route_of(&after), "/burner.Burner/Alpha");
    // Past the layer's bound, new methods read `/{unknown}` (counted), a real one
    // first called after the flood too: its samples are kept under that name.
    assert!(
        layer.unknown_routes() >= 4_000,
        "{}",
        layer.unknown_routes()
    );
    c.beta(burn).await.expect("beta");
    let beta = wait_spans(1, named("POST /burner.Burner/Beta"));
    assert_eq!(route_of(&beta[0]), spanprof_tower::UNKNOWN_ROUTE);
    assert_eq!(
        flooded.overflowed, 0,
        "the flood filled the name interner: {before:?} -> {flooded:?}"
    );
    assert!(
        flooded.names - before.names <= spanprof_tower::DEFAULT_MAX_ROUTES,
        "the flood added {} names: {before:?} -> {flooded:?}",
        flooded.names - before.names
    );
}
