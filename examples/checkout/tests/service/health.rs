//! The API's `/health` says whether its backends answer, not just that the API does.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use checkout::api::{AppState, router};
use checkout::cpu::CpuPool;

use crate::support::{InProcess, get};

/// A loopback port nobody listens on any more.
fn dead_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Asks `url` until it answers `want` (or 10 s pass); the last answer.
async fn poll(url: &str, want: u16) -> (u16, String) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = get(url).await.unwrap();
        if status == want || Instant::now() > end {
            return (status.as_u16(), body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn health_fails_while_the_backends_do_not_answer() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let app = router(AppState::new(dead_port(), dead_port(), CpuPool::new(1)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/health", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let (status, body) = poll(&url, 503).await;
        assert_eq!(status, 503, "{body}");
        assert!(
            body.contains("inventory: ") && body.contains("payments: "),
            "names the backends at fault: {body}"
        );
    });
}

#[test]
fn health_is_ok_while_the_backends_answer() {
    let shop = InProcess::start();
    let url = format!("http://{}/health", shop.shop.api);
    shop.rt.block_on(async {
        // Two probe rounds.
        tokio::time::sleep(checkout::health::PROBE_INTERVAL * 2).await;
        let (status, body) = poll(&url, 200).await;
        assert_eq!((status, body.as_str()), (200, "ok\n"));
    });
}
