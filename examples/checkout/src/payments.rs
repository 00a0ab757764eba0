//! The payments service: a plain hyper 1.x server (the Hyper adapter), called by the
//! checkout API over loopback HTTP.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use spanprof::tower::hyper::ProfiledService;
use tracing::Instrument;

use crate::telemetry::{backend_layer, server_span};

/// A fraud score: a little CPU per payment.
#[inline(never)]
pub fn fraud_score(body: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for _ in 0..200 {
        for b in body {
            h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h % 100
}

async fn pay(req: http::Request<Incoming>) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let score = fraud_score(&body);
    // The card network round trip.
    tokio::time::sleep(Duration::from_millis(4)).await;
    Ok(http::Response::new(Full::new(Bytes::from(format!(
        "{{\"approved\":{}}}",
        score < 97
    )))))
}

fn route(req: &http::Request<Incoming>) -> Option<String> {
    (req.uri().path() == "/pay").then(|| "/pay".to_owned())
}

/// Serves payments on `addr` (loopback); returns the bound address.
pub async fn serve(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let layer = backend_layer()?;
    tokio::spawn(async move {
        loop {
            let Ok((io, _)) = listener.accept().await else {
                return;
            };
            let profiled = ProfiledService::new(service_fn(pay), layer.clone(), route);
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<Incoming>| {
                    let span = server_span(&req, "payments");
                    let fut = span.in_scope(|| hyper::service::Service::call(&profiled, req));
                    fut.instrument(span)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(io), svc)
                    .await;
            });
        }
    });
    Ok(bound)
}
