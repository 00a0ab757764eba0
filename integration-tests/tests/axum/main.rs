//! The axum adapter on a real server over loopback: concurrent requests to two routes
//! whose handlers burn CPU in different functions; each exported span carries its
//! profile id and figures, and its profile shows its own handler's function only.

#[path = "../support/mod.rs"]
mod support;

use axum::Router;
use axum::routing::get;
use spanprof_tower::{ProfileCorrelationLayer, RoutePolicy};
use spanprof_workloads::BURNERS;
use support::web::*;
use tower_http::trace::TraceLayer;

async fn alpha() -> String {
    burn_async(60, BURNERS[0].1).await.to_string()
}

async fn beta() -> String {
    burn_async(60, BURNERS[1].1).await.to_string()
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_spans_carry_profile_ids_and_own_profiles() {
    otel();
    let layer = ProfileCorrelationLayer::builder()
        .default_policy(RoutePolicy::new().sample_rate(1.0))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/alpha", get(alpha))
        .route("/beta/{id}", get(beta))
        .layer(layer)
        .layer(TraceLayer::new_for_http().make_span_with(server_span));
    let base = serve(app).await;
    let mut calls = Vec::new();
    for i in 0..12 {
        let url = if i % 2 == 0 {
            format!("{base}/alpha?secret=hunter2")
        } else {
            format!("{base}/beta/{i}")
        };
        calls.push(tokio::spawn(async move { http_get(&url, &[]).await }));
    }
    for c in calls {
        assert_eq!(c.await.unwrap().0, 200);
    }
    let spans = wait_spans(12, named("GET /"));
    assert_eq!(spans.len(), 12, "{spans:?}");
    let profiler = profiler();
    profiler.flush();
    for span in &spans {
        assert_span_attributes(span);
        let (mine, other) = if span.name == "GET /alpha" {
            ("burn_class_0", "burn_class_1")
        } else {
            assert_eq!(span.name, "GET /beta/{id}");
            ("burn_class_1", "burn_class_0")
        };
        let profile = profiler
            .store()
            .span_tree(span_id(span))
            .unwrap_or_else(|| panic!("no samples for {}", span.name));
        assert_top(&profile, mine, &[other]);
        // Labels name the route template: no ids, no query strings.
        for s in &profile.samples {
            let l = s.labels.as_ref().unwrap();
            assert!(
                l.route.as_ref() == "/alpha" || l.route.as_ref() == "/beta/{id}",
                "{l:?}"
            );
            assert!(!l.span_name.contains("hunter2") && !l.route.contains('?'));
        }
        assert_eq!(
            support::web::attr(span, "spanprof.hot").unwrap().as_str(),
            "sampled"
        );
    }
}

/// `route_layer` works too: the layer then sees only matched routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_route_layer_labels_by_template() {
    otel();
    let app = Router::new()
        .route("/cart/{id}", get(alpha))
        .route_layer(ProfileCorrelationLayer::new())
        .layer(TraceLayer::new_for_http().make_span_with(server_span));
    let base = serve(app).await;
    assert_eq!(http_get(&format!("{base}/cart/12345"), &[]).await.0, 200);
    assert_eq!(http_get(&format!("{base}/nowhere"), &[]).await.0, 404);
    let spans = wait_spans(1, named("GET /cart/{id}"));
    assert_eq!(spans.len(), 1);
    assert_span_attributes(&spans[0]);
    let profiler = profiler();
    profiler.flush();
    let p = profiler
        .store()
        .span_tree(span_id(&spans[0]))
        .expect("samples");
    assert_eq!(&*p.samples[0].labels.as_ref().unwrap().route, "/cart/{id}");
}
