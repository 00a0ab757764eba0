//! Set-up mistakes that used to fail silently (issue 11) each log one warning naming
//! the fix, with a real axum server and a real client; and the documented set-up logs
//! none. The warnings are once per process, so every test here needs a process of its
//! own: the suite runs under cargo-nextest, which gives each test one.

#[path = "../support/mod.rs"]
mod support;

use support::web;

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::{Router, routing::get};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
use spanprof::tower::MakeRoute;
use spanprof::{ProfileCorrelationLayer, RoutePolicy, SpanProfileLayer, SpanProfileProcessor};
use tower_http::trace::{DefaultMakeSpan, MakeSpan, TraceLayer};
use tracing::level_filters::LevelFilter;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::prelude::*;

type Logs = Arc<Mutex<Vec<String>>>;

/// Installs the process's subscriber: captured logs at `level` and, with `otel`,
/// tracing-opentelemetry exporting to memory through spanprof's span processor, then
/// `SpanProfileLayer`, in the documented order.
fn subscriber(level: LevelFilter, otel: bool) -> (Logs, InMemorySpanExporter) {
    subscriber_with(level, otel.then_some(Otel::Documented))
}

/// How tracing-opentelemetry's layer is set up next to `SpanProfileLayer`.
#[derive(Clone, Copy, PartialEq)]
enum Otel {
    /// Added before `SpanProfileLayer`, context activation on (its default).
    Documented,
    /// Added after `SpanProfileLayer`.
    AfterSpanProfileLayer,
    /// Added before it, with context activation off.
    NoContextActivation,
}

fn subscriber_with(level: LevelFilter, otel: Option<Otel>) -> (Logs, InMemorySpanExporter) {
    let logs: Logs = Arc::default();
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name("setup").build())
        .with_span_processor(
            SpanProfileProcessor::new(SimpleSpanProcessor::new(exporter.clone()))
                // Every request span tracked, so that each shows it was linked (the profile
                // id itself only on spans a sample landed in).
                .figures_on_every_span(),
        )
        .build();
    let otel_layer = |activation: bool| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("setup"))
            .with_context_activation(activation)
            .boxed()
    };
    let mut layers = vec![support::LogCapture(logs.clone()).boxed()];
    match otel {
        Some(Otel::Documented) => {
            layers.extend([otel_layer(true), SpanProfileLayer::new().boxed()])
        }
        Some(Otel::NoContextActivation) => {
            layers.extend([otel_layer(false), SpanProfileLayer::new().boxed()])
        }
        Some(Otel::AfterSpanProfileLayer) => {
            layers.extend([SpanProfileLayer::new().boxed(), otel_layer(true)])
        }
        None => layers.push(SpanProfileLayer::new().boxed()),
    }
    tracing_subscriber::registry()
        .with(layers)
        .with(level)
        .init();
    (logs, exporter)
}

/// Inner spans (`GET /inner`) whose labels carried their own OpenTelemetry span id,
/// and those that carried another.
static INNER_RIGHT: AtomicUsize = AtomicUsize::new(0);
static INNER_WRONG: AtomicUsize = AtomicUsize::new(0);

/// `GET /inner`: enters an inner span and checks the labels it runs under.
async fn inner() -> &'static str {
    let span = tracing::info_span!("calculate_total");
    let want = span.context().span().span_context().span_id();
    let got = span.in_scope(|| spanprof::current_labels().map(|l| l.span_id()));
    let right = got == Some(u64::from_be_bytes(want.to_bytes()));
    let count = if right { &INNER_RIGHT } else { &INNER_WRONG };
    count.fetch_add(1, Ordering::Relaxed);
    "inner"
}

/// spanprof's warnings in `logs` that contain `needle`.
fn warnings(logs: &Logs, needle: &str) -> Vec<String> {
    logs.lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("WARN") && l.contains("spanprof:") && l.contains(needle))
        .cloned()
        .collect()
}

fn all_warnings(logs: &Logs) -> Vec<String> {
    warnings(logs, "")
}

/// Every warning but the one a build without `--cfg tokio_unstable` rightly gets (the
/// suite's second pass is built so on purpose).
fn warnings_but_tokio_unstable(logs: &Logs) -> Vec<String> {
    let mut found = all_warnings(logs);
    if !cfg!(tokio_unstable) {
        found.retain(|w| !w.contains("tokio_unstable"));
    }
    found
}

fn runtime(hooks: bool) -> tokio::runtime::Runtime {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if hooks {
        spanprof::install_runtime_hooks(&mut b);
    }
    b.worker_threads(2).enable_all().build().unwrap()
}

/// Serves `app` on loopback and GETs each of `paths` in turn; returns the statuses.
fn serve_and_get(rt: &tokio::runtime::Runtime, app: Router, paths: &[&str]) -> Vec<u16> {
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let mut statuses = Vec::new();
        for p in paths {
            let (status, _) = web::http_get(&format!("http://{addr}{p}"), &[]).await;
            statuses.push(status.as_u16());
        }
        server.abort();
        statuses
    })
}

fn app() -> Router {
    Router::new()
        .route("/hash", get(|| async { "hashed" }))
        .route("/cart/{id}", get(|| async { "cart" }))
        .route("/health", get(|| async { "ok" }))
        .route("/inner", get(inner))
}

/// Waits (up to 20 s) until `done`; the assertions after it say what was missing.
fn wait_until(done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Spans that carry `pyroscope.profile.id`.
fn profile_ids(exporter: &InMemorySpanExporter) -> usize {
    exporter
        .get_finished_spans()
        .unwrap()
        .iter()
        .filter(|s| web::attr(s, spanprof::tower::ATTR_PROFILE_ID).is_some())
        .count()
}

/// Request (root) spans whose spanprof figures were written: the requests the layers
/// linked.
fn linked_spans(exporter: &InMemorySpanExporter) -> usize {
    exporter
        .get_finished_spans()
        .unwrap()
        .iter()
        .filter(|s| s.parent_span_id == opentelemetry::trace::SpanId::INVALID)
        .filter(|s| web::attr(s, spanprof::tower::ATTR_POLLS).is_some())
        .count()
}

#[test]
fn the_documented_setup_warns_about_nothing_and_links_every_span() {
    let logs = serve_inner_spans(Otel::Documented);
    let mut unexpected = all_warnings(&logs);
    if !cfg!(tokio_unstable) {
        // This pass of the suite is built without it on purpose: that is a mistake
        // the documented set-up avoids, and it is the one warning here.
        let found = warnings(&logs, "tokio_unstable");
        assert_eq!(found.len(), 1, "{unexpected:?}");
        // scripts/test builds this pass with RUSTFLAGS, which replaced the project's
        // .cargo/config.toml: the warning says so, rather than ask for the config line.
        if option_env!("RUSTFLAGS").is_some() {
            assert!(
                found[0].contains("from the RUSTFLAGS environment variable"),
                "{}",
                found[0]
            );
        }
        unexpected.retain(|w| !w.contains("tokio_unstable"));
    }
    assert_eq!(unexpected, Vec::<String>::new());
}

/// Serves 20 requests of `/hash` and 20 of `/inner` through the documented layers
/// under `otel`; returns the logs once every request span has been exported.
fn serve_inner_spans(otel: Otel) -> Logs {
    let (logs, exporter) = subscriber_with(LevelFilter::INFO, Some(otel));
    let rt = runtime(true);
    let app = app().layer(ProfileCorrelationLayer::new()).layer(
        TraceLayer::new_for_http()
            .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO)),
    );
    let statuses = serve_and_get(&rt, app, &["/hash", "/inner"].repeat(20));
    assert_eq!(statuses, [200; 40]);
    wait_until(|| linked_spans(&exporter) == 40);
    assert_eq!(linked_spans(&exporter), 40, "every request span is linked");
    assert_eq!(INNER_RIGHT.load(Ordering::Relaxed), 20);
    assert_eq!(
        INNER_WRONG.load(Ordering::Relaxed),
        0,
        "inner spans ran under another span's id"
    );
    logs
}

#[test]
fn opentelemetry_added_after_span_profile_layer_is_reported_once_and_ids_stay_exact() {
    // SpanProfileLayer then hears of an enter before tracing-opentelemetry attaches
    // the span's context: it must ask tracing-opentelemetry for every inner span.
    let logs = serve_inner_spans(Otel::AfterSpanProfileLayer);
    let found = warnings(&logs, "current context");
    assert_eq!(found.len(), 1, "{:?}", all_warnings(&logs));
    assert!(
        found[0].contains("before spanprof::SpanProfileLayer"),
        "{found:?}"
    );
}

#[test]
fn context_activation_off_is_reported_once_and_ids_stay_exact() {
    let logs = serve_inner_spans(Otel::NoContextActivation);
    let found = warnings(&logs, "current context");
    assert_eq!(found.len(), 1, "{:?}", all_warnings(&logs));
    assert!(found[0].contains("context activation"), "{found:?}");
}

#[test]
fn trace_layer_spans_filtered_out_by_level_are_reported_once() {
    // TraceLayer's request spans are DEBUG; a usual `info` filter never creates them.
    let (logs, exporter) = subscriber(LevelFilter::INFO, true);
    let rt = runtime(true);
    let app = app()
        .layer(ProfileCorrelationLayer::new())
        .layer(TraceLayer::new_for_http());
    serve_and_get(&rt, app, &["/hash", "/cart/7"].repeat(10));
    let found = warnings(&logs, "no tracing span current");
    assert_eq!(found.len(), 1, "{:?}", all_warnings(&logs));
    assert!(
        found[0].contains("at DEBUG") && found[0].contains("Level::INFO"),
        "{}",
        found[0]
    );
    assert_eq!(linked_spans(&exporter), 0);
}

/// Health checks often get no span on purpose (`make_span` returns `Span::none()`
/// for them): with the rest of the service traced, those requests are no set-up
/// mistake, whichever comes first; and an idle service that only answers its probes
/// says nothing either.
#[test]
fn a_route_deliberately_without_a_span_is_not_reported() {
    let (logs, exporter) = subscriber(LevelFilter::INFO, true);
    let rt = runtime(true);
    let make_span = |req: &http::Request<_>| match req.uri().path() {
        "/health" => tracing::Span::none(),
        _ => DefaultMakeSpan::new()
            .level(tracing::Level::INFO)
            .make_span(req),
    };
    let app = app()
        .layer(ProfileCorrelationLayer::new())
        .layer(TraceLayer::new_for_http().make_span_with(make_span));
    let mut paths = vec!["/health"; 30];
    paths.extend(["/hash"; 5]);
    paths.extend(["/health"; 5]);
    assert_eq!(serve_and_get(&rt, app, &paths), [200; 40]);
    wait_until(|| profile_ids(&exporter) == 5);
    assert_eq!(warnings_but_tokio_unstable(&logs), Vec::<String>::new());
}

#[test]
fn profiling_outside_trace_layer_is_reported_once() {
    let (logs, exporter) = subscriber(LevelFilter::DEBUG, true);
    let rt = runtime(true);
    // Reversed: with axum the last layer added is the outermost, so profiling runs
    // before the span exists.
    let app = app()
        .layer(TraceLayer::new_for_http())
        .layer(ProfileCorrelationLayer::new());
    serve_and_get(&rt, app, &["/hash", "/cart/7"].repeat(10));
    let found = warnings(&logs, "no tracing span current");
    assert_eq!(found.len(), 1, "{:?}", warnings_but_tokio_unstable(&logs));
    assert!(found[0].contains("outermost"), "{}", found[0]);
    // The silent failure the warning replaces: spans exist, none carries a profile id.
    wait_until(|| exporter.get_finished_spans().unwrap().len() >= 20);
    assert_eq!(profile_ids(&exporter), 0);
}

#[test]
fn a_span_without_opentelemetry_is_reported_once() {
    let (logs, _) = subscriber(LevelFilter::DEBUG, false);
    let rt = runtime(true);
    let app = app()
        .layer(ProfileCorrelationLayer::new())
        .layer(TraceLayer::new_for_http());
    serve_and_get(&rt, app, &["/hash"; 20]);
    let found = warnings(&logs, "no OpenTelemetry context");
    assert_eq!(found.len(), 1, "{:?}", warnings_but_tokio_unstable(&logs));
    assert!(
        found[0].contains("tracing_opentelemetry::layer()"),
        "{}",
        found[0]
    );
}

/// Names no HTTP route, as the default route namer does when spanprof is built
/// without its `axum` feature.
#[derive(Clone)]
struct NoRoutes;
impl<B> MakeRoute<B> for NoRoutes {
    fn make_route<'a>(&mut self, _: &'a http::Request<B>) -> Option<Cow<'a, str>> {
        None
    }
    fn names_http_routes(&self) -> bool {
        false
    }
}

#[test]
fn per_route_settings_on_a_layer_that_cannot_see_routes_are_reported() {
    let (logs, _) = subscriber(LevelFilter::INFO, true);
    let rt = runtime(true);
    let layer = ProfileCorrelationLayer::builder()
        .route("/hash", RoutePolicy::new().sample_rate(1.0))
        .build()
        .unwrap()
        .make_route(NoRoutes);
    let app = app().layer(layer).layer(
        TraceLayer::new_for_http()
            .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO)),
    );
    serve_and_get(&rt, app, &["/hash"; 5]);
    let found = warnings(&logs, "cannot see HTTP routes");
    assert_eq!(found.len(), 1, "{:?}", warnings_but_tokio_unstable(&logs));
    assert!(
        found[0].contains("`axum` feature") && found[0].contains("/hash"),
        "{}",
        found[0]
    );
}

#[test]
fn a_route_key_that_is_not_the_routers_template_is_reported_at_its_routes_first_request() {
    let (logs, _) = subscriber(LevelFilter::INFO, true);
    let rt = runtime(true);
    let layer = ProfileCorrelationLayer::builder()
        .route("/cart/{cart_id}", RoutePolicy::new().sample_rate(1.0)) // the router says {id}
        .route("GET /cart/42", RoutePolicy::new().sample_rate(1.0)) // a raw path
        .route("GET /hash", RoutePolicy::new().sample_rate(1.0))
        .disable_route("/health")
        .build()
        .unwrap();
    let app = app().layer(layer.clone()).layer(
        TraceLayer::new_for_http()
            .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO)),
    );
    serve_and_get(&rt, app, &["/hash", "/health"]);
    assert_eq!(
        warnings_but_tokio_unstable(&logs),
        Vec::<String>::new(),
        "nothing to say before a request of the cart route"
    );
    serve_and_get(&rt, app_again(layer.clone()), &["/cart/7", "/cart/8"]);
    assert_eq!(
        layer.unmatched_route_keys(),
        ["/cart/{cart_id}", "GET /cart/42"]
    );
    let found = warnings_but_tokio_unstable(&logs);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found
            .iter()
            .any(|w| w.contains("\"/cart/{cart_id}\"") && w.contains("\"/cart/{id}\"")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|w| w.contains("\"GET /cart/42\"") && w.contains("\"/cart/{id}\"")),
        "{found:?}"
    );
}

/// Keys that are right but whose routes had no request (GET-only traffic never names
/// `POST /checkout`) are no mistake, however many requests the others get.
#[test]
fn route_keys_of_routes_without_traffic_are_not_reported() {
    let (logs, _) = subscriber(LevelFilter::INFO, true);
    let rt = runtime(true);
    let layer = ProfileCorrelationLayer::builder()
        .route("/cart/{id}", RoutePolicy::new().sample_rate(0.5))
        .route("POST /hash", RoutePolicy::new().sample_rate(1.0))
        .disable_route("/health")
        .build()
        .unwrap();
    let app = app().layer(layer.clone()).layer(
        TraceLayer::new_for_http()
            .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO)),
    );
    serve_and_get(&rt, app, &["/hash"; 1100]);
    assert_eq!(
        layer.unmatched_route_keys(),
        ["/cart/{id}", "/health", "POST /hash"]
    );
    assert_eq!(warnings_but_tokio_unstable(&logs), Vec::<String>::new());
}

fn app_again(layer: ProfileCorrelationLayer) -> Router {
    app().layer(layer).layer(
        TraceLayer::new_for_http()
            .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO)),
    )
}

#[test]
fn a_runtime_without_spanprof_hooks_is_reported_once() {
    // What `#[tokio::main]` gives: a runtime nobody installed the hooks on.
    let (logs, _) = subscriber(LevelFilter::INFO, true);
    let rt = runtime(false);
    let app = app().layer(ProfileCorrelationLayer::new()).layer(
        TraceLayer::new_for_http()
            .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO)),
    );
    serve_and_get(&rt, app, &["/hash"; 10]);
    let found = warnings(&logs, "install_runtime_hooks");
    assert_eq!(found.len(), 1, "{:?}", all_warnings(&logs));
    assert!(found[0].contains("#[tokio::main]"), "{}", found[0]);
}

#[cfg(not(tokio_unstable))]
#[test]
fn a_build_without_tokio_unstable_is_reported_at_install() {
    let (logs, _) = subscriber(LevelFilter::INFO, true);
    let _rt = runtime(true);
    let found = warnings(&logs, "tokio_unstable");
    assert_eq!(found.len(), 1, "{:?}", all_warnings(&logs));
    assert!(found[0].contains("rustflags"), "{}", found[0]);
}

#[cfg(tokio_unstable)]
#[test]
fn a_build_with_tokio_unstable_does_not_warn_at_install() {
    let (logs, _) = subscriber(LevelFilter::INFO, true);
    let _rt = runtime(true);
    assert_eq!(warnings(&logs, "tokio_unstable"), Vec::<String>::new());
}

#[test]
fn a_warning_found_before_the_subscriber_is_logged_once_there_is_one() {
    // Services often build the runtime and start serving before they install their
    // subscriber: the warning waits for it.
    let rt = runtime(false);
    let app = || {
        app().layer(ProfileCorrelationLayer::new()).layer(
            TraceLayer::new_for_http()
                .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO)),
        )
    };
    serve_and_get(&rt, app(), &["/hash"; 5]);
    let (logs, _) = subscriber(LevelFilter::INFO, true);
    // The collector thread logs it as it next wakes (samples keep it waking).
    let labels = spanprof::SpanLabels::builder().span_id(7).build();
    wait_until(|| {
        let _g = labels.enter();
        web::burn_blocking(20, spanprof_workloads::BURNERS[0].1);
        !warnings(&logs, "install_runtime_hooks").is_empty()
    });
    assert_eq!(
        warnings(&logs, "install_runtime_hooks").len(),
        1,
        "{:?}",
        all_warnings(&logs)
    );
}

/// A layer built inside a runtime without spanprof's hooks (what `#[tokio::main]`
/// gives) is reported as the service starts, not at its first request.
#[test]
fn a_runtime_without_spanprof_hooks_is_reported_at_start_up() {
    let (logs, _) = subscriber(LevelFilter::INFO, true);
    let rt = runtime(false);
    let _app = rt.block_on(async {
        app().layer(ProfileCorrelationLayer::new()).layer(
            TraceLayer::new_for_http()
                .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO)),
        )
    });
    let found = warnings(&logs, "install_runtime_hooks");
    assert_eq!(found.len(), 1, "{:?}", all_warnings(&logs));
}

/// The profiler starts before the subscriber is installed (as in most services): its
/// one start-up line (rates, mechanism) is logged once there is one, while the
/// service idles.
#[test]
fn the_profiler_says_how_it_samples_once_a_subscriber_listens() {
    let profiler = spanprof::Profiler::builder()
        .baseline_hz(99)
        .high_hz(1000)
        .start()
        .unwrap();
    let (logs, _) = subscriber(LevelFilter::INFO, true);
    let started = || -> Vec<String> {
        logs.lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("INFO") && l.contains("spanprof: profiler started"))
            .cloned()
            .collect()
    };
    wait_until(|| !started().is_empty());
    let found = started();
    assert_eq!(found.len(), 1, "{found:?}");
    let mechanism = profiler.capabilities().mechanism.as_str();
    assert!(
        found[0].contains("99 Hz") && found[0].contains(mechanism),
        "{}",
        found[0]
    );
    #[cfg(not(tokio_unstable))]
    assert_eq!(warnings(&logs, "tokio_unstable").len(), 1);
}
