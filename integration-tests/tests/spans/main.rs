//! Inner spans and poll accounting: with the tracing layer an inner span has a
//! profile of its own work only while its local root's profile includes it; busy and
//! idle add up to the span's duration and tell CPU from waiting.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use spanprof_tower::{ProfileCorrelationLayer, ProfileScope, RoutePolicy};
use spanprof_workloads::BURNERS;
use support::web::*;
use tower_http::trace::TraceLayer;
use tracing::Instrument;

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

async fn checkout() -> String {
    let a = burn_async(80, BURNERS[5].1).await;
    let b = burn_async(80, BURNERS[4].1)
        .instrument(tracing::info_span!("calculate_total"))
        .await;
    (a ^ b).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inner_spans_have_their_own_profiles() {
    otel();
    let layer = ProfileCorrelationLayer::builder()
        .default_policy(RoutePolicy::new().sample_rate(1.0))
        .scope(ProfileScope::AllSpans)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/checkout", get(checkout))
        .route(
            "/wait",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                "waited"
            }),
        )
        .layer(layer)
        .layer(TraceLayer::new_for_http().make_span_with(server_span));
    let base = serve(app).await;
    assert_eq!(http_get(&format!("{base}/checkout"), &[]).await.0, 200);
    assert_eq!(http_get(&format!("{base}/wait"), &[]).await.0, 200);

    let root = &wait_spans(1, named("GET /checkout"))[0];
    let inner = &wait_spans(1, named("calculate_total"))[0];
    assert_eq!(inner.parent_span_id, root.span_context.span_id());
    assert_span_attributes(root);
    assert_span_attributes(inner); // AllSpans: the inner span has its own profile id
    let profiler = profiler();
    profiler.flush();
    let store = profiler.store();
    let inner_p = store.span(span_id(inner)).expect("inner span samples");
    assert_top(&inner_p, "burn_class_4", &["burn_class_5"]);
    let root_own = store.span(span_id(root)).expect("root samples");
    assert_top(&root_own, "burn_class_5", &["burn_class_4"]);
    let tree = store.span_tree(span_id(root)).expect("tree");
    assert!(tree.cpu_ns_in("burn_class_4") > 0 && tree.cpu_ns_in("burn_class_5") > 0);
    // The root's CPU figures cover its tree.
    assert!(
        attr_i64(root, "spanprof.cpu_samples") >= attr_i64(inner, "spanprof.cpu_samples") + 40,
        "root {} inner {}",
        attr_i64(root, "spanprof.cpu_samples"),
        attr_i64(inner, "spanprof.cpu_samples")
    );

    // Busy + idle = the span's duration; a 200 ms timer is idle time, not busy.
    let wait = &wait_spans(1, named("GET /wait"))[0];
    let duration = wait
        .end_time
        .duration_since(wait.start_time)
        .unwrap()
        .as_nanos() as i64;
    let busy = attr_i64(wait, "spanprof.busy_ns");
    let idle = attr_i64(wait, "spanprof.idle_ns");
    assert!(
        (busy + idle - duration).abs() <= 1_000_000,
        "{busy} + {idle} vs {duration}"
    );
    assert!(idle >= 190_000_000, "idle {idle} ns");
    assert!(busy < 20_000_000, "busy {busy} ns");
    assert!(attr_i64(wait, "spanprof.polls") >= 2);
}
