//! Spans ride out a collector outage: the SDK's batch processor in front of
//! `OtlpSpanExporter` (OTLP over gRPC) against a real OTLP trace server over
//! loopback that is away for 30 s — its port closed, answering `UNAVAILABLE`, or
//! accepting and never answering — while a service ends about 80 spans a second.
//! Every span arrives once it is back. And a shutdown against a collector that hangs
//! ends within its deadline, counting what it could not send.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_sdk::trace::SdkTracerProvider;
use spanprof_export::{OtlpProtocol, OtlpSpanExporter, OtlpSpansConfig};

/// How the server answers.
const UP: u8 = 0;
const UNAVAILABLE: u8 = 1;
const HANGS: u8 = 2;

/// An OTLP trace server recording the span ids it accepted.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<HashSet<Vec<u8>>>>,
    mode: Arc<AtomicU8>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        match self.mode.load(Ordering::Relaxed) {
            UNAVAILABLE => return Err(tonic::Status::unavailable("collector restarting")),
            HANGS => std::future::pending::<()>().await,
            _ => {}
        }
        let mut got = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.insert(s.span_id);
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Serves `collector` on `addr` until the runtime ends.
fn serve(rt: &tokio::runtime::Runtime, collector: Collector, addr: SocketAddr) {
    let listener = rt.block_on(tokio::net::TcpListener::bind(addr)).unwrap();
    rt.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap()
    });
}

/// A free port on 127.0.0.1 (bound, then released).
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The exporter and its provider, as the checkout example sets them up, with a
/// short request timeout so a hanging server is given up on quickly.
fn provider(addr: SocketAddr) -> (SdkTracerProvider, spanprof_export::SpanDeliveryHandle) {
    let mut cfg = OtlpSpansConfig::new(format!("http://{addr}"), OtlpProtocol::Grpc);
    cfg.delivery.request_timeout = Duration::from_secs(2);
    cfg.delivery.max_backoff = Duration::from_secs(2);
    let exporter = OtlpSpanExporter::start(cfg).unwrap();
    let handle = exporter.handle();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .build();
    (provider, handle)
}

/// Ends ~80 spans a second for `secs` seconds; returns their ids.
fn spans_for(provider: &SdkTracerProvider, secs: f64) -> Vec<Vec<u8>> {
    let tracer = provider.tracer("outage");
    let start = Instant::now();
    let mut ids = Vec::new();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        let mut span = tracer.start(format!("request {}", n % 7));
        span.set_attribute(opentelemetry::KeyValue::new("n", n as i64));
        ids.push(span.span_context().span_id().to_bytes().to_vec());
        span.end();
        n += 1;
        std::thread::sleep(Duration::from_micros(12_500));
    }
    ids
}

/// A 30 s outage in the middle of 40 s of spans, the server in `away` meanwhile
/// (or, with `closed`, its port not listening at all): every span arrives.
fn ride_out(away: u8, closed: bool) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let collector = Collector::default();
    let addr = free_addr();
    if !closed {
        serve(&rt, collector.clone(), addr);
    }
    let (provider, handle) = provider(addr);
    let mut sent = spans_for(&provider, 5.0);
    collector.mode.store(away, Ordering::Relaxed);
    let outage = Instant::now();
    sent.extend(spans_for(&provider, 30.0));
    collector.mode.store(UP, Ordering::Relaxed);
    if closed {
        serve(&rt, collector.clone(), addr);
    }
    sent.extend(spans_for(&provider, 5.0));
    let lasted = outage.elapsed();
    // Everything queued goes once the server answers: wait for it, bounded.
    let deadline = Instant::now() + Duration::from_secs(30);
    while collector.spans.lock().unwrap().len() < sent.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    handle.shutdown_by(Instant::now() + Duration::from_secs(5));
    provider.shutdown().unwrap();
    let got = collector.spans.lock().unwrap().clone();
    let lost: Vec<_> = sent.iter().filter(|id| !got.contains(*id)).collect();
    let stats = handle.stats();
    assert!(lasted >= Duration::from_secs(30));
    assert!(
        lost.is_empty(),
        "{} of {} spans lost ({stats:?})",
        lost.len(),
        sent.len()
    );
    assert!(
        sent.len() >= 2_500,
        "about 80 spans a second: {}",
        sent.len()
    );
    assert_eq!(stats.dropped(), 0, "{stats:?}");
    assert!(
        stats.retried > 0,
        "the outage was retried through: {stats:?}"
    );
}

#[test]
fn spans_survive_a_collector_whose_port_is_closed_for_30_s() {
    ride_out(UP, true);
}

#[test]
fn spans_survive_a_collector_answering_unavailable_for_30_s() {
    ride_out(UNAVAILABLE, false);
}

#[test]
fn spans_survive_a_collector_that_never_answers_for_30_s() {
    ride_out(HANGS, false);
}

/// A collector that accepts and never answers: the provider's shutdown returns
/// within the deadline given, the spans it could not send counted as dropped at
/// shutdown.
#[test]
fn shutdown_against_a_hung_collector_ends_within_its_deadline() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let collector = Collector::default();
    collector.mode.store(HANGS, Ordering::Relaxed);
    let addr = free_addr();
    serve(&rt, collector, addr);
    let (provider, handle) = provider(addr);
    let sent = spans_for(&provider, 2.0).len() as u64;
    let start = Instant::now();
    // The service's one deadline: the exporter's flush ends a little before the
    // provider stops waiting for it.
    handle.shutdown_by(start + Duration::from_millis(2_500));
    let result = provider.shutdown_with_timeout(Duration::from_secs(3));
    let took = start.elapsed();
    assert!(
        took < Duration::from_millis(3_000),
        "shutdown took {took:?} ({result:?})"
    );
    assert!(result.is_ok(), "{result:?}");
    let stats = handle.stats();
    assert_eq!(stats.sent, 0, "{stats:?}");
    assert_eq!(stats.dropped_shutdown, sent, "{stats:?}");
}
