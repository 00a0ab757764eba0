//! The hyper adapter on a plain hyper 1.x server over loopback, with a closure that
//! names the route.

#[path = "../support/mod.rs"]
mod support;

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use spanprof_tower::hyper_service::ProfiledService;
use spanprof_tower::{ProfileCorrelationLayer, RoutePolicy};
use spanprof_workloads::BURNERS;
use support::web::*;
use tracing::Instrument;

async fn handle(req: http::Request<Incoming>) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let class = if req.uri().path() == "/pay" { 0 } else { 1 };
    let v = burn_async(60, BURNERS[class].1).await;
    Ok(http::Response::new(Full::new(Bytes::from(v.to_string()))))
}

fn route(req: &http::Request<Incoming>) -> Option<String> {
    match req.uri().path() {
        "/pay" => Some("/pay".to_owned()),
        p if p.starts_with("/refund/") => Some("/refund/{id}".to_owned()),
        _ => None,
    }
}

async fn serve() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let layer = ProfileCorrelationLayer::builder()
        .default_policy(RoutePolicy::new().sample_rate(1.0))
        .build()
        .unwrap();
    tokio::spawn(async move {
        loop {
            let (io, _) = listener.accept().await.unwrap();
            let profiled = ProfiledService::new(service_fn(handle), layer.clone(), route);
            tokio::spawn(async move {
                // The server span around each request, as a hyper user would write it.
                let svc = service_fn(move |req: http::Request<Incoming>| {
                    let span = server_span(&req);
                    let fut = span.in_scope(|| hyper::service::Service::call(&profiled, req));
                    fut.instrument(span)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(io), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_spans_carry_profile_ids_and_own_profiles() {
    otel();
    let base = serve().await;
    let mut calls = Vec::new();
    for i in 0..10 {
        let url = if i % 2 == 0 {
            format!("{base}/pay")
        } else {
            format!("{base}/refund/{i}")
        };
        calls.push(tokio::spawn(async move { http_get(&url, &[]).await }));
    }
    for c in calls {
        assert_eq!(c.await.unwrap().0, 200);
    }
    let spans = wait_spans(10, named("GET /"));
    assert_eq!(spans.len(), 10);
    let profiler = profiler();
    profiler.flush();
    for span in &spans {
        assert_span_attributes(span);
        let (mine, other, route) = if span.name == "GET /pay" {
            ("burn_class_0", "burn_class_1", "/pay")
        } else {
            ("burn_class_1", "burn_class_0", "/refund/{id}")
        };
        let p = profiler.store().span_tree(span_id(span)).expect("samples");
        assert_top(&p, mine, &[other]);
        assert_eq!(&*p.samples[0].labels.as_ref().unwrap().route, route);
    }
}
