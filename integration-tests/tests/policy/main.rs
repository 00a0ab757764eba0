//! Per-route policy on a real axum server: sampling rates, determinism by trace id,
//! slow promotion (after an await, and inside one long poll), hostile headers.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use opentelemetry::Value;
use spanprof::Hotness;
use spanprof_tower::{ProfileCorrelationLayer, RoutePolicy, rate_picks};
use spanprof_workloads::BURNERS;
use support::web::*;
use tower_http::trace::TraceLayer;

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn traceparent(trace_id: u128) -> String {
    format!("00-{trace_id:032x}-{:016x}-01", (trace_id as u64) | 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_rates_match_and_agree_by_trace_id() {
    otel();
    let layer = ProfileCorrelationLayer::builder()
        .route(
            "/quarter",
            RoutePolicy::new().sample_rate(0.25).never_slow(),
        )
        .route("/never", RoutePolicy::new().sample_rate(0.0).never_slow())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/quarter", get(|| async { "q" }))
        .route("/never", get(|| async { "n" }))
        .layer(layer)
        .layer(TraceLayer::new_for_http().make_span_with(server_span));
    let base = serve(app).await;
    let n: u128 = 400;
    for batch in 0..(n / 20) {
        let mut calls = Vec::new();
        for i in 0..20 {
            let k = batch * 20 + i;
            // Trace ids as a caller would make them (varied, not sequential bits).
            let trace_id = (k + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
            for route in ["quarter", "never"] {
                let url = format!("{base}/{route}");
                let tp = traceparent(trace_id);
                calls.push(tokio::spawn(async move {
                    http_get(&url, &[("traceparent", &tp)]).await.0
                }));
            }
        }
        for c in calls {
            assert_eq!(c.await.unwrap(), 200);
        }
    }
    let quarter = wait_spans(n as usize, named("GET /quarter"));
    let never = wait_spans(n as usize, named("GET /never"));
    assert_eq!(quarter.len(), n as usize);
    assert_eq!(never.len(), n as usize);
    let is_hot = |s: &opentelemetry_sdk::trace::SpanData| {
        support::web::attr(s, "spanprof.hot").map(|v| v.as_str().into_owned())
    };
    let hot = quarter.iter().filter(|s| is_hot(s).is_some()).count();
    // Binomial(400, 0.25): mean 100, sd 8.7; four sd either side.
    assert!((65..=135).contains(&hot), "{hot} of {n} hot at rate 0.25");
    assert!(
        never.iter().all(|s| is_hot(s).is_none()),
        "rate 0 route had hot requests"
    );
    // The decision is a function of the trace id alone: the same as any other
    // service using spanprof would make.
    for s in &quarter {
        let trace_id = u128::from_be_bytes(s.span_context.trace_id().to_bytes());
        assert_eq!(
            is_hot(s).as_deref() == Some("sampled"),
            rate_picks(trace_id, 0.25),
            "span {:?}",
            s.span_context
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_are_promoted_after_the_threshold() {
    otel();
    let layer = ProfileCorrelationLayer::builder()
        .route(
            "/slow",
            RoutePolicy::new()
                .sample_rate(0.0)
                .slow_after(Duration::from_millis(300)),
        )
        .route(
            "/stuck",
            RoutePolicy::new()
                .sample_rate(0.0)
                .slow_after(Duration::from_millis(200)),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/slow",
            get(|| async {
                let start = std::time::Instant::now();
                burn_async(30, BURNERS[2].1).await;
                // How long the phase before the threshold took: on a loaded machine it
                // may overrun the threshold, and then the test cannot judge it.
                let phase1_ms = start.elapsed().as_millis();
                tokio::time::sleep(Duration::from_millis(400)).await;
                burn_async(200, BURNERS[3].1).await;
                phase1_ms.to_string()
            }),
        )
        .route(
            "/stuck",
            get(|| async { burn_blocking(600, BURNERS[4].1).to_string() }),
        )
        .layer(layer)
        .layer(TraceLayer::new_for_http().make_span_with(server_span));
    let base = serve(app).await;
    let mut attempts = 0;
    let slow_span = loop {
        attempts += 1;
        let before = wait_spans(0, named("GET /slow")).len();
        let (status, phase1_ms) = http_get(&format!("{base}/slow"), &[]).await;
        assert_eq!(status, 200);
        let spans = wait_spans(before + 1, named("GET /slow"));
        if phase1_ms.parse::<u64>().unwrap() < 240 {
            break spans.last().unwrap().clone();
        }
        assert!(
            attempts < 5,
            "the machine is too loaded: phase 1 took {phase1_ms} ms"
        );
    };
    assert_eq!(http_get(&format!("{base}/stuck"), &[]).await.0, 200);
    let profiler = profiler();
    let baseline_ns = 1_000_000_000 / u64::from(profiler.capabilities().baseline_hz);
    profiler.flush();

    // Sleeps past the threshold, then burns: baseline samples before, high rate after.
    assert_eq!(
        support::web::attr(&slow_span, "spanprof.hot"),
        Some(Value::from("slow"))
    );
    let p = profiler.store().span(span_id(&slow_span)).expect("samples");
    let in_fn = |f: &str, hot: Hotness| -> (u64, u64) {
        p.samples
            .iter()
            .filter(|s| s.labels.as_ref().unwrap().hot == hot)
            .filter(|s| s.stack.iter().any(|fr| fr.function.ends_with(f)))
            .fold((0, 0), |(n, w), s| (n + s.count, w + s.cpu_ns))
    };
    let (before_cold, _) = in_fn("burn_class_2", Hotness::Cold);
    let (before_slow, _) = in_fn("burn_class_2", Hotness::Slow);
    let (after_slow, _) = in_fn("burn_class_3", Hotness::Slow);
    let (after_cold, _) = in_fn("burn_class_3", Hotness::Cold);
    assert_eq!(
        before_slow, 0,
        "work before the threshold was sampled as slow"
    );
    assert!(
        before_cold <= 12,
        "{before_cold} baseline samples for 60 ms of CPU"
    );
    assert_eq!(after_cold, 0, "work after the threshold was sampled cold");
    // 200 ms of CPU at 1 kHz.
    assert!(
        after_slow >= 150,
        "{after_slow} high-rate samples for 200 ms of CPU"
    );

    // Stuck in one 600 ms poll with a 200 ms threshold: promoted within one baseline
    // period of the threshold, by the signal handler, not at a next poll.
    let stuck = wait_spans(1, named("GET /stuck"));
    let p = profiler.store().span(span_id(&stuck[0])).expect("samples");
    let (cold_n, cold_ns) = p
        .samples
        .iter()
        .filter(|s| s.labels.as_ref().unwrap().hot == Hotness::Cold)
        .fold((0, 0), |(n, w), s| (n + s.count, w + s.cpu_ns));
    let slow_n: u64 = p
        .samples
        .iter()
        .filter(|s| s.labels.as_ref().unwrap().hot == Hotness::Slow)
        .map(|s| s.count)
        .sum();
    assert!(
        cold_ns <= 200_000_000 + 2 * baseline_ns,
        "{cold_n} cold samples covering {cold_ns} ns before promotion"
    );
    assert!(slow_n >= 300, "{slow_n} high-rate samples after promotion");
    assert_eq!(
        support::web::attr(&stuck[0], "spanprof.hot"),
        Some(Value::from("slow"))
    );
}

/// A corpus of malformed and oversized trace headers: never a panic, never an error
/// response; the bad ones are ignored, a good one is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_trace_headers_are_ignored() {
    // No TraceLayer here: the layer itself parses `traceparent`.
    let layer = ProfileCorrelationLayer::builder()
        .default_policy(RoutePolicy::new().sample_rate(1.0))
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/echo",
            get(|| async { burn_blocking(25, BURNERS[5].1).to_string() }),
        )
        .layer(layer);
    let base = serve(app).await;
    let long = "a".repeat(70_000);
    let state_long = format!("k=v,{}", "x=y,".repeat(5000));
    let corpus: Vec<Vec<(&str, String)>> = vec![
        vec![("traceparent", "garbage".into())],
        vec![(
            "traceparent",
            "00-00000000000000000000000000000000-0000000000000000-01".into(),
        )],
        vec![(
            "traceparent",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        )],
        vec![(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01".into(),
        )],
        vec![(
            "traceparent",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01".into(),
        )],
        vec![(
            "traceparent",
            "00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        )],
        vec![(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x".into(),
        )],
        vec![(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736--01".into(),
        )],
        vec![("traceparent", format!("00-{long}-00f067aa0ba902b7-01"))],
        vec![(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".repeat(50),
        )],
        vec![("traceparent", "   ".into())],
        vec![("tracestate", state_long.clone())],
        vec![
            ("traceparent", "00-1234-5678-01".into()),
            ("tracestate", "=,=,=,,,===".into()),
        ],
    ];
    for headers in &corpus {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (status, _) = http_get(&format!("{base}/echo"), &h).await;
        assert_eq!(
            status,
            200,
            "headers {:?}",
            &h.iter().map(|(k, v)| (k, v.len())).collect::<Vec<_>>()
        );
    }
    // A well-formed header is used.
    let good = 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736u128;
    let (status, _) = http_get(
        &format!("{base}/echo"),
        &[
            ("traceparent", &traceparent(good)),
            ("tracestate", &state_long),
        ],
    )
    .await;
    assert_eq!(status, 200);
    let profiler = profiler();
    profiler.flush();
    let spans = profiler.store().spans();
    let echo: Vec<_> = spans
        .iter()
        .filter(|s| &*s.labels.route == "/echo")
        .collect();
    assert!(
        echo.len() >= corpus.len(),
        "{} labelled requests",
        echo.len()
    );
    let with_trace: Vec<u128> = echo
        .iter()
        .map(|s| s.labels.trace_id)
        .filter(|t| *t != 0)
        .collect();
    assert_eq!(
        with_trace,
        vec![good],
        "only the well-formed header gives a trace id"
    );
}
