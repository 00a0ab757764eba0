//! The default policy followed through long outages with tokio's paused clock:
//! the sender's waits (backoff, timeouts) are the real code's, but each one is
//! skipped over, so half an hour of outage takes milliseconds.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// A server that is down (connection refused) while `down` holds, or for the
/// first `outage` of the sender's clock; it records what it accepts, and the
/// sender-clock time of its first success.
#[derive(Clone, Default)]
struct Server {
    outage: Duration,
    down: Arc<AtomicBool>,
    start: Arc<Mutex<Option<tokio::time::Instant>>>,
    first_success_after: Arc<Mutex<Option<Duration>>>,
    got: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Transport for Server {
    fn send<'a>(&'a self, payload: &'a [u8]) -> SendFuture<'a> {
        Box::pin(async move {
            let now = tokio::time::Instant::now();
            let since = now - *self.start.lock().unwrap().get_or_insert(now);
            if since < self.outage || self.down.load(Ordering::Relaxed) {
                return Err(SendError::Retryable("connection refused".into()));
            }
            self.first_success_after
                .lock()
                .unwrap()
                .get_or_insert(since);
            self.got.lock().unwrap().push(payload.to_vec());
            Ok(())
        })
    }
}

/// A delivery with the default configuration on the paused clock, `payloads`
/// one-byte payloads (0, 1, …) queued, each accepted.
fn start_with(transport: impl Transport, payloads: u8) -> Delivery {
    let d = Delivery::start_on(
        "virtual",
        "profiles",
        DeliveryConfig::default(),
        transport,
        Clock::Paused,
    );
    for n in 0..payloads {
        assert!(d.enqueue(vec![n]), "a new payload is always kept");
    }
    d
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// With the defaults, a payload queued at the start of a 30-minute outage is
/// retried through it (no attempt limit) and sent within one capped backoff
/// (30 s, +50 % jitter) of the server's return; nothing is dropped. The old
/// default of 6 attempts gave up after at most 23.25 s.
#[test]
fn the_default_policy_retries_through_a_long_outage() {
    let cfg = DeliveryConfig::default();
    assert_eq!(cfg.max_attempts, None);
    let outage = Duration::from_secs(30 * 60);
    let server = Server {
        outage,
        ..Server::default()
    };
    let d = start_with(server.clone(), 10);
    wait_until("the queue to drain", || d.stats().sent == 10);
    let stats = d.shutdown(Duration::from_secs(1));
    assert_eq!(stats.dropped(), 0, "{stats:?}");
    assert!(stats.retried > 30, "{stats:?}");
    let got = server.got.lock().unwrap().clone();
    assert_eq!(got, (0..10u8).map(|n| vec![n]).collect::<Vec<_>>());
    let after = server.first_success_after.lock().unwrap().unwrap();
    assert!(
        after >= outage && after <= outage + cfg.max_backoff.mul_f64(1.5),
        "first success {after:?} after the start of a {outage:?} outage"
    );
}

/// With the default capacity, a full queue makes room by dropping its oldest
/// payloads, counted, and keeps the newest, which all arrive once the server
/// is back.
#[test]
fn a_full_queue_drops_its_oldest() {
    let server = Server::default();
    server.down.store(true, Ordering::Relaxed);
    let made = DEFAULT_QUEUE_CAPACITY as u8 + 6;
    let d = start_with(server.clone(), made);
    let during = d.stats();
    assert_eq!(during.dropped_queue_full, 6, "{during:?}");
    assert_eq!(during.pending, DEFAULT_QUEUE_CAPACITY as u64, "{during:?}");
    server.down.store(false, Ordering::Relaxed);
    wait_until("the queue to drain", || d.stats().pending == 0);
    let stats = d.shutdown(Duration::from_secs(1));
    assert_eq!(stats.sent, DEFAULT_QUEUE_CAPACITY as u64, "{stats:?}");
    assert_eq!(stats.queued, stats.sent + stats.dropped(), "{stats:?}");
    let got: Vec<u8> = server.got.lock().unwrap().iter().map(|p| p[0]).collect();
    assert!(got.windows(2).all(|w| w[1] > w[0]), "in order: {got:?}");
    assert!(
        got.ends_with(&(made - 57..made).collect::<Vec<_>>()),
        "{got:?}"
    );
}

/// Past `max_queue_bytes`, the oldest payloads make room, and the counters count
/// the items the payloads carry (spans of a batch), not payloads.
#[test]
fn the_queue_is_bounded_by_bytes_and_counts_items() {
    let server = Server::default();
    server.down.store(true, Ordering::Relaxed);
    let cfg = DeliveryConfig {
        max_queue_bytes: 10,
        ..DeliveryConfig::default()
    };
    let d = Delivery::start_on("virtual", "spans", cfg, server.clone(), Clock::Paused);
    for n in 0..5u8 {
        assert!(d.enqueue_items(vec![n; 4], 3));
    }
    let during = d.stats();
    // 4-byte payloads under 10 bytes: two held (one may be in flight).
    assert_eq!(during.pending, 6, "{during:?}");
    assert_eq!(during.dropped_queue_full, 9, "{during:?}");
    assert_eq!(during.queued, 15, "{during:?}");
    server.down.store(false, Ordering::Relaxed);
    wait_until("the queue to drain", || d.stats().pending == 0);
    let stats = d.shutdown(Duration::from_secs(1));
    assert_eq!((stats.sent, stats.dropped()), (6, 9), "{stats:?}");
    let got: Vec<u8> = server.got.lock().unwrap().iter().map(|p| p[0]).collect();
    assert_eq!(got, [3, 4], "the newest kept");
}

/// A refusal is final: counted once per payload, never retried, and the next
/// payload is sent at once (the backoff is reset).
#[test]
fn a_refused_payload_is_counted_not_retried_and_the_next_one_goes() {
    #[derive(Clone, Default)]
    struct Refuses {
        tries: Arc<Mutex<Vec<u8>>>,
    }
    impl Transport for Refuses {
        fn send<'a>(&'a self, payload: &'a [u8]) -> SendFuture<'a> {
            Box::pin(async move {
                self.tries.lock().unwrap().push(payload[0]);
                match payload[0] {
                    0 | 1 => Err(SendError::Rejected {
                        status: RejectStatus::Http(400),
                        message: "bad profile".into(),
                    }),
                    _ => Ok(()),
                }
            })
        }
    }
    let server = Refuses::default();
    let d = start_with(server.clone(), 3);
    wait_until("every payload to be settled", || {
        let s = d.stats();
        s.sent + s.dropped_rejected == 3
    });
    let stats = d.shutdown(Duration::from_secs(1));
    assert_eq!(
        (stats.sent, stats.dropped_rejected, stats.retried),
        (1, 2, 0),
        "{stats:?}"
    );
    assert_eq!(*server.tries.lock().unwrap(), [0, 1, 2], "one try each");
}

/// At shutdown, what is still queued when the deadline passes is counted as
/// dropped at shutdown, and the sender thread ends.
#[test]
fn shutdown_counts_what_the_deadline_leaves_queued() {
    let server = Server::default();
    server.down.store(true, Ordering::Relaxed);
    let d = start_with(server.clone(), 5);
    let stats = d.shutdown(Duration::from_millis(200));
    assert_eq!(stats.sent, 0, "{stats:?}");
    assert_eq!(stats.dropped_shutdown, 5, "{stats:?}");
    assert_eq!(stats.queued, stats.dropped(), "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
}

#[test]
fn bad_delivery_settings_name_their_field() {
    for (cfg, field) in [
        (
            DeliveryConfig {
                queue_capacity: 0,
                ..DeliveryConfig::default()
            },
            "delivery.queue_capacity",
        ),
        (
            DeliveryConfig {
                max_attempts: Some(0),
                ..DeliveryConfig::default()
            },
            "delivery.max_attempts",
        ),
        (
            DeliveryConfig {
                max_backoff: Duration::from_millis(1),
                ..DeliveryConfig::default()
            },
            "delivery.max_backoff",
        ),
    ] {
        let e = cfg.validate().unwrap_err().to_string();
        assert!(e.contains(field), "{e}");
    }
}

#[test]
fn a_send_error_says_what_failed_and_is_a_std_error() {
    let retry: Box<dyn std::error::Error> =
        Box::new(SendError::Retryable("connection refused".into()));
    assert_eq!(
        retry.to_string(),
        "send failed, worth retrying: connection refused"
    );
    let rejected = SendError::Rejected {
        status: RejectStatus::Http(400),
        message: "bad profile".into(),
    };
    assert_eq!(
        rejected.to_string(),
        "payload rejected with HTTP 400: bad profile"
    );
}
