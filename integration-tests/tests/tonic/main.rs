//! The tonic adapter on a real gRPC server over loopback: concurrent unary calls to
//! two methods burning CPU in different functions, and a server stream labelled for
//! its whole life.

#[path = "../support/mod.rs"]
mod support;

use std::pin::Pin;

use spanprof_bench::BURNERS;
use spanprof_integration_tests::burner::burner_client::BurnerClient;
use spanprof_integration_tests::burner::burner_server::{Burner, BurnerServer};
use spanprof_integration_tests::burner::{BurnReply, BurnRequest};
use spanprof_tower::{GrpcRoute, ProfileCorrelationLayer, RoutePolicy};
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let layer = ProfileCorrelationLayer::builder()
        .default_policy(RoutePolicy::new().sample_rate(1.0))
        .build()
        .unwrap()
        .make_route(GrpcRoute);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(TraceLayer::new_for_grpc().make_span_with(server_span))
            .layer(layer)
            .add_service(BurnerServer::new(Svc))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap()
    });
    format!("http://{addr}")
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
