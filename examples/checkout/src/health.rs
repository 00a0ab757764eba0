//! What the API's `/health` says: the API answers, and whether its backends do.
//! A background task probes them every second (payments: `GET /health` over a new
//! connection; inventory: a TCP connect; each within 500 ms), so `/health` itself
//! costs nothing.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// How often the backends are probed.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long one probe may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Default)]
struct Status {
    inventory: Option<String>,
    payments: Option<String>,
}

/// The backends' health, as last probed (healthy until a probe says otherwise).
#[derive(Debug, Clone, Default)]
pub struct BackendHealth(Arc<Mutex<Status>>);

impl BackendHealth {
    /// Starts probing `inventory` and `payments` on the current runtime, until the
    /// returned value and its clones are dropped.
    pub fn probe(inventory: SocketAddr, payments: SocketAddr) -> Self {
        let health = BackendHealth::default();
        let weak = Arc::downgrade(&health.0);
        tokio::spawn(probe_loop(weak, inventory, payments));
        health
    }

    /// `None` if every backend answered its last probe, else what failed.
    pub fn problems(&self) -> Option<String> {
        let s = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let failed: Vec<String> = [("inventory", s.inventory), ("payments", s.payments)]
            .into_iter()
            .filter_map(|(name, e)| e.map(|e| format!("{name}: {e}")))
            .collect();
        (!failed.is_empty()).then(|| failed.join("; "))
    }
}

async fn probe_loop(health: Weak<Mutex<Status>>, inventory: SocketAddr, payments: SocketAddr) {
    let mut tick = tokio::time::interval(PROBE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (inv, pay) = tokio::join!(connects(inventory), answers_health(payments));
        let Some(h) = health.upgrade() else { return };
        let mut s = h.lock().unwrap_or_else(|e| e.into_inner());
        s.inventory = inv.err();
        s.payments = pay.err();
    }
}

async fn connects(addr: SocketAddr) -> Result<(), String> {
    match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no connection within {PROBE_TIMEOUT:?}")),
    }
}

async fn answers_health(addr: SocketAddr) -> Result<(), String> {
    let probe = async {
        let io = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = http::Request::get("/health")
            .header(http::header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())
            .expect("a valid request");
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("GET /health answered {status}"))
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, probe)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {PROBE_TIMEOUT:?}")))
}
