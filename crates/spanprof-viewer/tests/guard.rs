//! The viewer answers only requests addressed to it by a loopback name, the address
//! it is bound to or a name it was told; other `Host`s and `Origin`s (a web page
//! that pointed a name of its own at 127.0.0.1) get 403, and no CORS header is sent.

mod support;

use std::net::SocketAddr;

use spanprof_viewer::{Exposure, ViewerThread, debug_router, debug_router_with_hosts};
use support::{assert_no_cors, assert_status, get, request, serve, viewer};

/// Every kind of route: the page, the JSON API, a flamegraph, the pprof endpoint.
const ROUTES: [&str; 7] = [
    "/debug/spanprof/",
    "/debug/spanprof/api/traces",
    "/debug/spanprof/api/spans?name=apply",
    "/debug/spanprof/api/memory",
    "/debug/spanprof/api/traces/0000000000000000000000000000abcd",
    "/debug/spanprof/flamegraph/00000000deadbeef",
    "/debug/spanprof/profile?span_id=00000000deadbeef",
];

/// Asks every route with `host` (and `headers`); each answer must be `status`
/// (200: allowed, whatever the route answers), without CORS headers.
async fn check_all(addr: SocketAddr, host: &str, headers: &[(&str, &str)], status: u16) {
    for route in ROUTES {
        let answer = get(addr, route, host, headers).await;
        let what = format!("{route} with Host {host:?} {headers:?}");
        if status == 403 {
            assert_status(&answer, 403, &what);
        } else {
            // Allowed: what the route itself answers (200, or 404 for an unknown
            // trace or span), never a refusal.
            assert!(
                matches!(answer.status, 200 | 404),
                "{what}: {} {:?}",
                answer.status,
                answer.body
            );
        }
        assert_no_cors(&answer);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_host_is_refused_on_every_route() {
    let addr = serve(viewer()).await;
    check_all(addr, "evil.example", &[], 403).await;
    let answer = get(addr, "/debug/spanprof/api/traces", "evil.example", &[]).await;
    assert!(answer.body.contains("evil.example"), "{}", answer.body);
    assert!(answer.body.contains("allow_host"), "{}", answer.body);
    assert_eq!(
        answer.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rebinding_name_is_refused() {
    let addr = serve(viewer()).await;
    let port = addr.port();
    check_all(addr, &format!("127.0.0.1.nip.io:{port}"), &[], 403).await;
    check_all(addr, "127.0.0.1.nip.io", &[], 403).await;
    check_all(addr, &format!("localhost.evil.example:{port}"), &[], 403).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_origin_is_refused_even_with_a_good_host() {
    let addr = serve(viewer()).await;
    let host = addr.to_string();
    for origin in [
        "http://evil.example",
        "http://127.0.0.1.nip.io",
        &format!("http://127.0.0.1.nip.io:{}", addr.port()),
        "null",
        "https://evil.example",
    ] {
        check_all(addr, &host, &[("Origin", origin)], 403).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn loopback_names_and_the_bound_address_are_answered() {
    let addr = serve(viewer()).await;
    let port = addr.port();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
    ] {
        check_all(addr, &host, &[], 200).await;
        check_all(addr, &host, &[("Origin", &format!("http://{host}"))], 200).await;
    }
    let answer = get(
        addr,
        "/debug/spanprof/api/traces",
        &format!("localhost:{port}"),
        &[],
    )
    .await;
    assert_status(&answer, 200, "api/traces");
    assert_eq!(answer.body, "[]");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_configured_name_is_answered() {
    let addr = serve(
        viewer()
            .allow_host("Profiler.Internal")
            .allow_host("fd00::5"),
    )
    .await;
    let port = addr.port();
    for host in [
        "profiler.internal".to_owned(),
        format!("profiler.internal:{port}"),
        "PROFILER.internal:8080".to_owned(),
        "[fd00::5]:80".to_owned(),
    ] {
        check_all(addr, &host, &[], 200).await;
        check_all(addr, &host, &[("Origin", &format!("http://{host}"))], 200).await;
    }
    // An Origin of an allowed name with a Host of another allowed name (a proxy).
    check_all(
        addr,
        &addr.to_string(),
        &[("Origin", "http://profiler.internal")],
        200,
    )
    .await;
    // Other names are still refused, and the refusal names what is allowed.
    check_all(addr, "profiler.internal.evil.example", &[], 403).await;
    let answer = get(addr, "/debug/spanprof/", "evil.example", &[]).await;
    assert!(
        answer.body.contains("profiler.internal") && answer.body.contains("127.0.0.1"),
        "{}",
        answer.body
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_without_host_is_answered_only_without_origin() {
    let addr = serve(viewer()).await;
    let http10 = |origin: Option<&str>| {
        let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
        format!("GET /debug/spanprof/api/traces HTTP/1.0\r\n{origin}\r\n")
    };
    let answer = support::exchange(addr, http10(None)).await;
    assert_status(&answer, 200, "HTTP/1.0 without Host");
    assert_no_cors(&answer);
    let answer = support::exchange(addr, http10(Some("http://localhost"))).await;
    assert_status(&answer, 403, "HTTP/1.0 without Host, with an Origin");
    assert_no_cors(&answer);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_cors_headers_even_for_a_preflight() {
    let addr = serve(viewer()).await;
    for origin in ["http://evil.example", &format!("http://{addr}")] {
        let answer = request(
            addr,
            "OPTIONS",
            "/debug/spanprof/api/traces",
            &[
                ("Host", &addr.to_string()),
                ("Origin", origin),
                ("Access-Control-Request-Method", "GET"),
            ],
        )
        .await;
        assert!(answer.status >= 400, "{answer:?}");
        assert_no_cors(&answer);
    }
}

#[test]
fn the_viewer_thread_checks_hosts_too() {
    let viewer = ViewerThread::start(
        viewer(),
        "127.0.0.1:0".parse().unwrap(),
        Exposure::LoopbackOnly,
    )
    .expect("viewer");
    let addr = viewer.local_addr();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let refused = get(addr, "/debug/spanprof/api/traces", "evil.example", &[]).await;
        assert_status(&refused, 403, "foreign Host");
        let answered = get(
            addr,
            "/debug/spanprof/api/traces",
            &format!("localhost:{}", addr.port()),
            &[],
        )
        .await;
        assert_status(&answered, 200, "localhost");
    });
    viewer.stop();
}

/// The router mounted in an app of one's own: the address is unknown, so loopback
/// names on any port are answered (a proxy or a tunnel may use another port).
#[tokio::test(flavor = "multi_thread")]
async fn a_router_mounted_by_the_user_answers_loopback_names_only() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = viewer().router();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    check_all(addr, "localhost:1234", &[], 200).await;
    check_all(addr, &addr.to_string(), &[], 200).await;
    check_all(addr, "evil.example", &[], 403).await;
    check_all(
        addr,
        "localhost",
        &[("Origin", "http://127.0.0.1.nip.io")],
        403,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_profile_endpoint_alone_checks_hosts() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, debug_router(support::profiler()))
            .await
            .unwrap()
    });
    let path = "/debug/spanprof/profile?span_id=00000000deadbeef";
    let answer = get(addr, path, "evil.example", &[]).await;
    assert_status(&answer, 403, "foreign Host");
    assert!(answer.body.contains("evil.example"), "{}", answer.body);
    assert_no_cors(&answer);
    let answer = get(
        addr,
        path,
        &addr.to_string(),
        &[("Origin", "http://evil.example")],
    )
    .await;
    assert_status(&answer, 403, "foreign Origin");
    let answer = get(addr, path, &addr.to_string(), &[]).await;
    assert_status(&answer, 404, "no samples of that span");
    assert_no_cors(&answer);
    let answer = get(addr, path, "profiler.internal", &[]).await;
    assert_status(&answer, 403, "a name not allowed");
    assert!(
        answer.body.contains("debug_router_with_hosts"),
        "{}",
        answer.body
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_profile_endpoint_alone_answers_configured_names() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = debug_router_with_hosts(support::profiler(), ["profiler.internal"]);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let path = "/debug/spanprof/profile?span_id=00000000deadbeef";
    for host in ["profiler.internal", "profiler.internal:6060", "localhost:9"] {
        let answer = get(addr, path, host, &[]).await;
        assert_status(&answer, 404, host);
    }
    let answer = get(addr, path, "evil.example", &[]).await;
    assert_status(&answer, 403, "foreign Host");
}
