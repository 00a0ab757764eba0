//! Where there is no sampler (every target but Linux; built here on Linux with
//! `RUSTFLAGS="--cfg spanprof_force_unsupported"`, as `scripts/test` does), the
//! layer still builds with no configuration and a real axum server still labels
//! every request by its route. In a normal build this file compiles to nothing.
#![cfg(spanprof_force_unsupported)]

use axum::Router;
use axum::routing::get;
use http_body_util::{BodyExt, Empty};
use spanprof_tower::ProfileCorrelationLayer;

async fn whoami() -> String {
    tokio::task::yield_now().await;
    spanprof_core::current_labels()
        .map_or_else(|| "unlabelled".to_owned(), |l| l.route().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_server_labels_requests_with_profiling_unavailable() {
    assert!(spanprof_core::Profiler::current_or_start().is_err());
    let app = Router::new()
        .route("/cart/{id}", get(whoami))
        .layer(ProfileCorrelationLayer::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut client, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(format!("http://{addr}/cart/42?coupon=secret"))
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = client.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        &body[..],
        b"/cart/{id}",
        "route template, never the raw path"
    );
}
