//! Delivery that survives outages, the same for every network sink: a bounded
//! queue filled without blocking; one sender thread (its own small tokio runtime, so
//! a sink never runs on — or slows — the application's runtime); retries with
//! exponential backoff and jitter on connection errors, timeouts and 5xx (and 429),
//! none on other 4xx (logged once per status with the server's message); a flush
//! with a deadline at shutdown; counters of everything.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Default number of payloads the queue holds.
pub const DEFAULT_QUEUE_CAPACITY: usize = 64;
/// Default attempts per payload (the first send and its retries).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 6;
/// Default first retry delay (doubling, with jitter).
pub const DEFAULT_BASE_BACKOFF: Duration = Duration::from_millis(500);
/// Default longest retry delay.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Default timeout of one send.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How a sink delivers. Every setter's default is the `DEFAULT_*` constant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryConfig {
    /// Payloads held while the server is slow or down; past it new payloads are
    /// dropped and counted (`dropped_queue_full`).
    pub queue_capacity: usize,
    /// Attempts per payload before it is dropped (`dropped_retries_exhausted`).
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt, ±50 % jitter.
    pub base_backoff: Duration,
    /// Cap of the retry delay.
    pub max_backoff: Duration,
    /// Timeout of one send.
    pub request_timeout: Duration,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            base_backoff: DEFAULT_BASE_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

/// Counters of one sink's delivery.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryStats {
    /// Payloads accepted into the queue.
    pub queued: u64,
    /// Payloads the server accepted.
    pub sent: u64,
    /// Retries made (attempts after the first).
    pub retried: u64,
    /// Payloads dropped because the queue was full.
    pub dropped_queue_full: u64,
    /// Payloads the server rejected with a 4xx (not retried).
    pub dropped_rejected: u64,
    /// Payloads dropped after `max_attempts` failed attempts.
    pub dropped_retries_exhausted: u64,
    /// Payloads still queued when the shutdown deadline passed.
    pub dropped_shutdown: u64,
    /// Payloads waiting now.
    pub pending: u64,
}

impl DeliveryStats {
    /// All payloads dropped, for whatever reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full
            + self.dropped_rejected
            + self.dropped_retries_exhausted
            + self.dropped_shutdown
    }
}

/// Why one send failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// Worth retrying: connection refused or reset, timeout, 5xx, 429.
    Retryable(String),
    /// The server refused the payload (4xx): retrying would not help.
    Rejected {
        /// HTTP status.
        status: u16,
        /// What the server said (truncated).
        message: String,
    },
}

/// A boxed send future.
pub type SendFuture<'a> = Pin<Box<dyn Future<Output = Result<(), SendError>> + Send + 'a>>;

/// Sends one payload. Implemented by each network sink.
pub trait Transport: Send + Sync + 'static {
    /// Sends `payload` once.
    fn send<'a>(&'a self, payload: &'a [u8]) -> SendFuture<'a>;
}

#[derive(Default)]
struct Counters {
    queued: AtomicU64,
    sent: AtomicU64,
    retried: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_rejected: AtomicU64,
    dropped_retries_exhausted: AtomicU64,
    dropped_shutdown: AtomicU64,
}

struct Queue {
    items: VecDeque<Vec<u8>>,
    /// The payload being sent (taken from `items`), so `flush` can wait for it.
    in_flight: bool,
    closing: Option<Instant>,
}

struct Shared {
    name: &'static str,
    queue: Mutex<Queue>,
    cv: Condvar,
    counters: Counters,
    cfg: DeliveryConfig,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A sink's delivery: a bounded queue and its sender thread.
pub struct Delivery {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("sink", &self.shared.name)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Delivery {
    /// Starts the sender thread of sink `name`.
    pub fn start(name: &'static str, cfg: DeliveryConfig, transport: impl Transport) -> Delivery {
        let shared = Arc::new(Shared {
            name,
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                in_flight: false,
                closing: None,
            }),
            cv: Condvar::new(),
            counters: Counters::default(),
            cfg,
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("spanprof-{name}"))
                .spawn(move || run(shared, transport))
                .expect("spawn a sink thread")
        };
        Delivery {
            shared,
            thread: Some(thread),
        }
    }

    /// Queues a payload without blocking. Returns false (and counts it) when the queue
    /// is full or closing.
    pub fn enqueue(&self, payload: Vec<u8>) -> bool {
        let mut q = self.shared.lock();
        if q.closing.is_some() || q.items.len() >= self.shared.cfg.queue_capacity {
            self.shared
                .counters
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            return false;
        }
        q.items.push_back(payload);
        self.shared.counters.queued.fetch_add(1, Ordering::Relaxed);
        drop(q);
        self.shared.cv.notify_all();
        true
    }

    /// The counters.
    pub fn stats(&self) -> DeliveryStats {
        let c = &self.shared.counters;
        let q = self.shared.lock();
        DeliveryStats {
            queued: c.queued.load(Ordering::Relaxed),
            sent: c.sent.load(Ordering::Relaxed),
            retried: c.retried.load(Ordering::Relaxed),
            dropped_queue_full: c.dropped_queue_full.load(Ordering::Relaxed),
            dropped_rejected: c.dropped_rejected.load(Ordering::Relaxed),
            dropped_retries_exhausted: c.dropped_retries_exhausted.load(Ordering::Relaxed),
            dropped_shutdown: c.dropped_shutdown.load(Ordering::Relaxed),
            pending: q.items.len() as u64 + u64::from(q.in_flight),
        }
    }

    /// Stops accepting payloads, keeps sending what is queued until it is all sent or
    /// `deadline` has passed, drops (and counts) the rest, and returns the counters.
    pub fn shutdown(mut self, deadline: Duration) -> DeliveryStats {
        self.close(deadline);
        let stats = self.stats();
        tracing::info!(sink = self.shared.name, ?stats, "spanprof: sink stopped");
        stats
    }

    fn close(&mut self, deadline: Duration) {
        self.shared.lock().closing = Some(Instant::now() + deadline);
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.close(Duration::ZERO);
        }
    }
}

/// A small xorshift for jitter (no need for a cryptographic source here).
fn jitter_factor(seed: &mut u64) -> f64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    0.5 + (*seed >> 11) as f64 / (1u64 << 53) as f64
}

fn run(shared: Arc<Shared>, transport: impl Transport) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a sink runtime");
    let mut seed = (Instant::now().elapsed().as_nanos() as u64)
        ^ 0x9e37_79b9_7f4a_7c15
        ^ (std::process::id() as u64);
    let mut logged_status: HashSet<u16> = HashSet::new();
    loop {
        // Next payload, or exit when closing and empty (or past the deadline).
        let (payload, deadline) = {
            let mut q = shared.lock();
            loop {
                if let Some(d) = q.closing
                    && (q.items.is_empty() || Instant::now() >= d)
                {
                    let left = q.items.len() as u64;
                    q.items.clear();
                    shared
                        .counters
                        .dropped_shutdown
                        .fetch_add(left, Ordering::Relaxed);
                    return;
                }
                if let Some(p) = q.items.pop_front() {
                    q.in_flight = true;
                    break (p, q.closing);
                }
                q = shared.cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let mut attempt = 0;
        let mut backoff = shared.cfg.base_backoff;
        loop {
            attempt += 1;
            let timeout = shared.cfg.request_timeout;
            let result = rt.block_on(async {
                tokio::time::timeout(timeout, transport.send(&payload))
                    .await
                    .unwrap_or_else(|_| Err(SendError::Retryable("request timed out".into())))
            });
            match result {
                Ok(()) => {
                    shared.counters.sent.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(SendError::Rejected { status, message }) => {
                    shared
                        .counters
                        .dropped_rejected
                        .fetch_add(1, Ordering::Relaxed);
                    if logged_status.insert(status) {
                        tracing::warn!(
                            sink = shared.name,
                            status,
                            message = %message,
                            "spanprof: the server rejected a profile; not retrying (logged once per status)"
                        );
                    }
                    break;
                }
                Err(SendError::Retryable(why)) => {
                    let closing = shared.lock().closing.or(deadline);
                    let wait = backoff.mul_f64(jitter_factor(&mut seed));
                    let past_deadline = closing.is_some_and(|d| Instant::now() + wait >= d);
                    if attempt >= shared.cfg.max_attempts || past_deadline {
                        if past_deadline {
                            shared
                                .counters
                                .dropped_shutdown
                                .fetch_add(1, Ordering::Relaxed);
                        } else {
                            shared
                                .counters
                                .dropped_retries_exhausted
                                .fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(sink = shared.name, error = %why, attempts = attempt, "spanprof: dropping a profile after retries");
                        }
                        break;
                    }
                    tracing::debug!(sink = shared.name, error = %why, attempt, ?wait, "spanprof: send failed; retrying");
                    shared.counters.retried.fetch_add(1, Ordering::Relaxed);
                    if closing.is_some() {
                        // Flushing at shutdown: the deadline check above bounds this.
                        std::thread::sleep(wait);
                    } else {
                        // Sleep, but wake early when shutdown starts.
                        let q = shared.lock();
                        let _ = shared
                            .cv
                            .wait_timeout_while(q, wait, |q| q.closing.is_none())
                            .unwrap_or_else(|e| e.into_inner());
                    }
                    backoff = (backoff * 2).min(shared.cfg.max_backoff);
                }
            }
        }
        shared.lock().in_flight = false;
    }
}
