//! The payments service: a plain hyper 1.x server (the Hyper adapter), called by the
//! checkout API over loopback HTTP. Its spans, profile labels and logs are named by
//! route template (`POST /pay`; anything else `(unmatched)`), never by the raw path;
//! `GET /health` answers without a span.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use spanprof::tower::UNMATCHED_ROUTE;
use spanprof::tower::hyper_service::ProfiledService;
use tracing::Instrument;

use crate::accept::Acceptor;
use crate::stop::Stop;
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

/// Payments of at least this much go through manual review ([`legacy_manual_review`]):
/// the large carts of the example's load, never an ordinary cart.
pub const REVIEW_CENTS: u64 = 300_000;

/// The legacy review service's client, synchronous: it holds the runtime worker
/// polling the request for its whole round trip (about 40 ms). On purpose: the
/// example's slowness that is not CPU, which spanprof shows as blocked time, a long
/// poll and a warning naming this route.
#[inline(never)]
pub fn legacy_manual_review(amount_cents: u64) -> bool {
    std::thread::sleep(Duration::from_millis(40));
    amount_cents < 100_000_000
}

/// `amount_cents` of a payment body (`{"amount_cents":N}`), 0 if absent.
fn amount_cents(body: &[u8]) -> u64 {
    let body = String::from_utf8_lossy(body);
    body.split("\"amount_cents\":")
        .nth(1)
        .map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn pay(req: http::Request<Incoming>) -> Result<http::Response<Full<Bytes>>, Infallible> {
    if route(&req) != "/pay" {
        let mut resp = http::Response::new(Full::new(Bytes::from_static(b"not found\n")));
        *resp.status_mut() = http::StatusCode::NOT_FOUND;
        return Ok(resp);
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let score = fraud_score(&body);
    let amount = amount_cents(&body);
    let reviewed = amount < REVIEW_CENTS || legacy_manual_review(amount);
    // The card network round trip.
    tokio::time::sleep(Duration::from_millis(4)).await;
    Ok(http::Response::new(Full::new(Bytes::from(format!(
        "{{\"approved\":{}}}",
        score < 97 && reviewed
    )))))
}

/// The route template of a payments request: one of the service's routes, else
/// [`UNMATCHED_ROUTE`] (a raw path may hold ids or secrets, and names must stay few).
pub fn route<B>(req: &http::Request<B>) -> &'static str {
    match req.uri().path() {
        "/pay" => "/pay",
        "/health" => "/health",
        _ => UNMATCHED_ROUTE,
    }
}

/// Serves payments on `acceptor` until `stop`, then finishes the requests in flight.
pub async fn serve(mut acceptor: Acceptor, stop: Stop) -> std::io::Result<()> {
    let layer = backend_layer()?;
    let graceful = GracefulShutdown::new();
    loop {
        let io = tokio::select! {
            _ = stop.stopped() => break,
            (io, _) = acceptor.accept() => io,
        };
        let profiled = ProfiledService::new(service_fn(pay), layer.clone(), |req: &_| {
            Some(route(req).to_owned())
        });
        // `GET /health` (probed every second) is answered here, with no span and
        // unprofiled; every other request goes through the profiled service.
        let svc = service_fn(move |req: http::Request<Incoming>| {
            let fut = (route(&req) != "/health").then(|| {
                let span = server_span(&req, "payments", route(&req));
                span.in_scope(|| hyper::service::Service::call(&profiled, req))
                    .instrument(span)
            });
            async move {
                match fut {
                    Some(fut) => fut.await.map(|resp| resp.map(BodyExt::boxed)),
                    None => Ok(http::Response::new(
                        Full::new(Bytes::from_static(b"ok\n")).boxed(),
                    )),
                }
            }
        });
        let conn =
            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), svc);
        tokio::spawn(graceful.watch(conn));
    }
    drop(acceptor);
    graceful.shutdown().await;
    Ok(())
}
