//! What happens at the edges of a span's life (issue 9): work that outlives its span
//! is sampled as detached (no span id, baseline rate, route kept); the layer's drop
//! of a cancelled request runs labelled; `spawn_local` children inherit.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use spanprof::defaults::DETACHED_SPAN_NAME;
use spanprof::{Hotness, Profiler, SpanLabels, WithSpanLabels};
use spanprof_workloads::BURNERS;
use support::web::burn_blocking;

/// A runtime with spanprof's hooks (task label inheritance with `tokio_unstable`).
fn runtime(workers: usize) -> tokio::runtime::Runtime {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut b);
    b.worker_threads(workers).enable_all().build().unwrap()
}

fn hot_request(span_id: u64, route: &str) -> SpanLabels {
    SpanLabels::builder()
        .trace_id(0xED6E_0000_0000_0000_0000_0000_0000_0000 | u128::from(span_id))
        .span_id(span_id)
        .span_name(&format!("GET {route}"))
        .route(route)
        .hot(Hotness::Sampled)
        .build()
}

/// What a span's samples look like before and after it ended.
#[derive(Debug)]
struct AfterEnd {
    /// Store samples of the span when it ended (all drained).
    at_end: u64,
    /// Store samples of the span after the work ran on.
    later: u64,
    /// Samples written as detached while the work ran on.
    detached: u64,
    /// CPU the work used after the span ended, ns.
    cpu_after_ns: u64,
    /// Window samples after the end: (span name, route, span id, count).
    window: Vec<(String, String, u64, u64)>,
}

/// Runs `request` (which starts work that goes on after it returns, then waits on
/// the channel before burning `after_ms` of CPU and sending its CPU time back) and
/// measures what the span's samples do after the request ended.
fn after_end(
    profiler: &Profiler,
    span_id: u64,
    start: impl FnOnce(tokio::sync::oneshot::Receiver<()>, std::sync::mpsc::Sender<u64>),
) -> AfterEnd {
    let (go_tx, go_rx) = tokio::sync::oneshot::channel();
    let (cpu_tx, cpu_rx) = std::sync::mpsc::channel();
    start(go_rx, cpu_tx);
    // The work may still have been running with the span's labels up to the end
    // (between its last message and its next await), and a signal taken then can be
    // in its handler, which takes ~30 µs on these VMs, while `flush` drains: that
    // sample, taken while the span was live, would land after the drain and count as
    // one carrying the id after the end. Let such handlers finish first.
    std::thread::sleep(Duration::from_millis(50));
    profiler.flush();
    let at_end = profiler
        .store()
        .span_summary(span_id)
        .map_or(0, |s| s.samples);
    let window = profiler.window(10_000);
    let detached_before = profiler.sampler_stats().detached;
    go_tx.send(()).unwrap();
    let cpu_after_ns = cpu_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    profiler.flush();
    let later = profiler
        .store()
        .span_summary(span_id)
        .map_or(0, |s| s.samples);
    let window = window
        .take()
        .samples
        .iter()
        .filter_map(|s| {
            let l = s.labels.as_ref()?;
            Some((
                l.span_name.to_string(),
                l.route.to_string(),
                l.span_id,
                s.count,
            ))
        })
        .collect();
    AfterEnd {
        at_end,
        later,
        detached: profiler.sampler_stats().detached - detached_before,
        cpu_after_ns,
        window,
    }
}

#[track_caller]
fn assert_detached_after_end(a: &AfterEnd, span_id: u64, route: &str, baseline_hz: u32) {
    assert!(a.at_end > 0, "the span was never sampled while live: {a:?}");
    assert_eq!(
        a.later,
        a.at_end,
        "{} samples carry the span id after the span ended: {a:?}",
        a.later - a.at_end
    );
    assert!(
        a.window.iter().all(|w| w.2 != span_id),
        "window samples with the ended span's id: {a:?}"
    );
    let detached: u64 = a
        .window
        .iter()
        .filter(|w| w.0 == DETACHED_SPAN_NAME && w.1 == route)
        .map(|w| w.3)
        .sum();
    assert!(
        detached >= 20,
        "work after the end should be sampled as detached with its route: {a:?}"
    );
    // At the baseline rate: ~1 sample per 1/baseline_hz of CPU; the high rate would
    // give ten times as many. Three times the expectation leaves room for noise.
    let expected = a.cpu_after_ns as f64 * f64::from(baseline_hz) / 1e9;
    assert!(
        (a.detached as f64) < 3.0 * expected,
        "{} detached samples for {expected:.0} expected at the baseline rate: {a:?}",
        a.detached
    );
}

/// A task spawned by a request (tokio's hooks give it the request's labels) goes on
/// burning CPU after the request returned: from then on it is detached.
#[cfg(tokio_unstable)]
#[test]
fn a_spawned_task_outliving_its_request_is_detached() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let rt = runtime(2);
    let span_id = 0xED6E_0001;
    let a = after_end(&profiler, span_id, |go, cpu| {
        rt.block_on(
            async move {
                let (live_tx, live_rx) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    // While the request lives: its samples carry its span id.
                    burn_blocking(300, BURNERS[0].1);
                    live_tx.send(()).unwrap();
                    go.await.unwrap();
                    let start = spanprof::stats::thread_cpu_time();
                    for _ in 0..1000 {
                        burn_blocking(1, BURNERS[1].1);
                        tokio::task::yield_now().await;
                    }
                    cpu.send((spanprof::stats::thread_cpu_time() - start).as_nanos() as u64)
                        .unwrap();
                });
                live_rx.await.unwrap();
            }
            .with_span_labels(hot_request(span_id, "/orders")),
        )
    });
    drop(rt);
    profiler.stop();
    assert_detached_after_end(
        &a,
        span_id,
        "/orders",
        spanprof::defaults::DEFAULT_BASELINE_HZ,
    );
}

/// `spanprof::spawn_blocking` carries the labels without keeping the span alive.
#[test]
fn blocking_work_outliving_its_request_is_detached() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let rt = runtime(1);
    let span_id = 0xED6E_0002;
    let a = after_end(&profiler, span_id, |go, cpu| {
        rt.block_on(
            async move {
                let (live_tx, live_rx) = tokio::sync::oneshot::channel();
                let _detached = spanprof::spawn_blocking(move || {
                    burn_blocking(300, BURNERS[0].1);
                    live_tx.send(()).unwrap();
                    go.blocking_recv().unwrap();
                    let start = spanprof::stats::thread_cpu_time();
                    burn_blocking(1000, BURNERS[1].1);
                    cpu.send((spanprof::stats::thread_cpu_time() - start).as_nanos() as u64)
                        .unwrap();
                });
                live_rx.await.unwrap();
            }
            .with_span_labels(hot_request(span_id, "/export")),
        )
    });
    drop(rt);
    profiler.stop();
    assert_detached_after_end(
        &a,
        span_id,
        "/export",
        spanprof::defaults::DEFAULT_BASELINE_HZ,
    );
}

/// A handler behind the real layer and a real server starts background work and
/// answers: once the response is done (and its span exported), the background work
/// no longer carries the request's span id.
#[cfg(tokio_unstable)]
#[test]
fn background_work_of_a_served_request_is_detached_after_the_response() {
    use axum::Router;
    use axum::routing::get;
    use spanprof_tower::{ProfileCorrelationLayer, RoutePolicy};
    use support::web::*;
    use tower_http::trace::TraceLayer;

    let _serial = support::serial();
    otel();
    let profiler = Profiler::builder().start().expect("profiler");
    let rt = runtime(2);
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (cpu_tx, cpu_rx) = std::sync::mpsc::channel::<u64>();
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some((go_rx, cpu_tx))));
    let handler = move || {
        let slot = slot.clone();
        async move {
            let (go, cpu) = slot.lock().unwrap().take().expect("one request");
            tokio::spawn(async move {
                go.await.unwrap();
                let start = spanprof::stats::thread_cpu_time();
                for _ in 0..1000 {
                    burn_blocking(1, BURNERS[1].1);
                    tokio::task::yield_now().await;
                }
                cpu.send((spanprof::stats::thread_cpu_time() - start).as_nanos() as u64)
                    .unwrap();
            });
            burn_blocking(200, BURNERS[0].1);
            "queued"
        }
    };
    let span = rt.block_on(async {
        let layer = ProfileCorrelationLayer::builder()
            .profiler(profiler.clone())
            .default_policy(RoutePolicy::new().sample_rate(1.0))
            .build()
            .unwrap();
        let app = Router::new()
            .route("/jobs/{id}", get(handler))
            .layer(layer)
            .layer(TraceLayer::new_for_http().make_span_with(server_span));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let (status, _) = http_get(&format!("http://{addr}/jobs/7"), &[]).await;
        assert_eq!(status, 200);
        wait_spans(1, named("GET /jobs/{id}")).remove(0)
    });
    let span_id = span_id(&span);
    profiler.flush();
    let at_end = profiler
        .store()
        .span_summary(span_id)
        .map_or(0, |s| s.samples);
    let detached_before = profiler.sampler_stats().detached;
    go_tx.send(()).unwrap();
    let cpu_after_ns = cpu_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    profiler.flush();
    let later = profiler
        .store()
        .span_summary(span_id)
        .map_or(0, |s| s.samples);
    let detached = profiler.sampler_stats().detached - detached_before;
    drop(rt);
    profiler.stop();
    assert!(at_end > 0, "the request was never sampled");
    assert_eq!(
        later, at_end,
        "samples with the span id of a request already answered"
    );
    assert!(
        detached >= 20 && (detached as f64) < 3.0 * cpu_after_ns as f64 * 99.0 / 1e9,
        "{detached} detached samples over {cpu_after_ns} ns of CPU"
    );
}

/// Hot work is sampled at its rate even when it takes turns with cold work in polls
/// shorter than the high period: the CPU estimate of each span matches its CPU.
#[test]
fn hot_work_next_to_cold_work_is_sampled_at_its_rate() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let mechanism = profiler.capabilities().mechanism;
    let mut results = Vec::new();
    for poll_us in [50, 200, 1000] {
        // Cold polls three quarters as long as the hot ones keep a fixed sampling
        // period from landing on a poll boundary.
        let o = spanprof_workloads::Interleaving {
            hot_poll_us: poll_us,
            cold_poll_us: poll_us * 3 / 4,
            hot_cpu_ms: 1500,
        }
        .run(&profiler, 0xED6E_1000 + poll_us * 16);
        results.push((poll_us, (o.hot_ratio, o.cold_ratio)));
    }
    profiler.stop();
    eprintln!("{mechanism:?}: (poll us, (hot, cold) estimate / actual) = {results:?}");
    for (poll_us, (hot, cold)) in &results {
        assert!(
            (0.75..=1.25).contains(hot),
            "{mechanism:?}, {poll_us} us polls: hot span's CPU estimate / actual = {hot:.3} \
             (all: {results:?})"
        );
        assert!(
            (0.5..=1.5).contains(cold),
            "{mechanism:?}, {poll_us} us polls: cold span's CPU estimate / actual = {cold:.3} \
             (all: {results:?})"
        );
    }
}

/// A request future the layer drops before it finished (here: a timeout outside the
/// layer; a client that went away is the same) runs its destructor with the
/// request's labels, as `Labelled` does.
#[test]
fn a_cancelled_request_is_dropped_with_its_labels() {
    use axum::Router;
    use axum::routing::get;
    use spanprof_tower::ProfileCorrelationLayer;
    use support::web::http_get;

    struct OnDrop(std::sync::mpsc::Sender<Option<(u64, String)>>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            let labels = spanprof::current_labels();
            let _ = self
                .0
                .send(labels.map(|l| (l.span_id(), l.route().to_string())));
        }
    }

    let _serial = support::serial();
    let rt = runtime(2);
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Arc::new(std::sync::Mutex::new(tx));
    let handler = move || {
        let guard = OnDrop(tx.lock().unwrap().clone());
        async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            "never"
        }
    };
    let status = rt.block_on(async {
        let app = Router::new()
            .route("/slow/{id}", get(handler))
            .layer(ProfileCorrelationLayer::new())
            .layer(tower_http::timeout::TimeoutLayer::with_status_code(
                http::StatusCode::REQUEST_TIMEOUT,
                Duration::from_millis(200),
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        http_get(&format!("http://{addr}/slow/1"), &[]).await.0
    });
    assert_eq!(status, http::StatusCode::REQUEST_TIMEOUT);
    let dropped_with = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    drop(rt);
    match dropped_with {
        Some((span, route)) => {
            assert_ne!(span, 0);
            assert_eq!(route, "/slow/{id}");
        }
        None => panic!("the cancelled request's future was dropped without its labels"),
    }
}

/// tokio runs no task hooks for `LocalSet` tasks, so `tokio::task::spawn_local`
/// children do not inherit; `spanprof::spawn_local` carries the labels itself.
#[test]
fn spawn_local_children_inherit_labels() {
    let _serial = support::serial();
    let profiler = Profiler::builder().start().expect("profiler");
    let rt = runtime(1);
    let labels = hot_request(0xED6E_3000, "/local");
    let (ours, tokios, cpu) = rt.block_on(async {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(
                async {
                    let ours = spanprof::spawn_local(async {
                        let start = spanprof::stats::thread_cpu_time();
                        for _ in 0..300 {
                            burn_blocking(1, BURNERS[2].1);
                            tokio::task::yield_now().await;
                        }
                        let cpu = spanprof::stats::thread_cpu_time() - start;
                        (spanprof::current_labels().map(|l| l.span_id()), cpu)
                    });
                    let tokios = tokio::task::spawn_local(async {
                        spanprof::current_labels().map(|l| l.span_id())
                    });
                    let (ours, cpu) = ours.await.unwrap();
                    (ours, tokios.await.unwrap(), cpu)
                }
                .with_span_labels(labels.clone()),
            )
            .await
    });
    profiler.flush();
    let p = profiler.store().span(0xED6E_3000);
    drop(rt);
    profiler.stop();
    assert_eq!(
        ours,
        Some(0xED6E_3000),
        "spanprof::spawn_local child's labels"
    );
    assert_eq!(
        tokios, None,
        "tokio runs no hooks for LocalSet tasks: if this changed, the docs should too"
    );
    let p = p.expect("samples of the local child");
    assert!(
        p.cpu_ns_in(BURNERS[2].0) as f64 >= 0.5 * cpu.as_nanos() as f64,
        "the local child's CPU ({cpu:?}) is in its parent's profile: {:?}",
        p.top_functions(5)
    );
}
