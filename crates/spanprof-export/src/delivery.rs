//! Delivery that survives outages, the same for every network sink: a bounded
//! queue filled without blocking (when full, the oldest payload makes room); one
//! sender thread (its own small tokio runtime, so a sink never runs on — or slows —
//! the application's runtime); retries with exponential backoff and jitter on
//! connection errors, timeouts and 5xx (and 408, 429) for as long as the queue has
//! room, none on other 4xx (logged once per status with the server's message); a
//! flush bounded by one deadline at shutdown, which also cuts a send in flight; a
//! panic in a send is caught, logged once and counted; counters of everything.
//!
//! What it logs: an outage once as it begins (the error) and once as it ends (how
//! long, what was dropped), at warn, at most one outage a minute (a reminder every
//! five minutes while one lasts); a refusal once per status; and one line when the
//! sink stops (warn when it dropped profiles or sent nothing).

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::ExportError;
use crate::retry::Backoff;

/// Default number of payloads the queue holds (with the default 10 s interval of
/// the network sinks: 640 s, about 10 minutes, of profiles).
pub const DEFAULT_QUEUE_CAPACITY: usize = 64;
/// Default attempts per payload: no limit. A payload is retried until it is sent,
/// the server rejects it, it is the oldest of a full queue when a new one arrives,
/// or shutdown's deadline passes: the retry horizon is the queue's.
pub const DEFAULT_MAX_ATTEMPTS: Option<u32> = None;
/// Default first retry delay (doubling, ±50 % jitter).
pub const DEFAULT_BASE_BACKOFF: Duration = Duration::from_millis(500);
/// Default longest retry delay (before jitter).
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Default timeout of one send.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound of the bytes queued (64 MiB).
pub const DEFAULT_MAX_QUEUE_BYTES: usize = 64 << 20;
/// The shutdown deadline spanprof's documentation and examples use.
pub const DEFAULT_SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);

/// At most one outage is logged (as it begins and ends) in this time; a sink that
/// fails and recovers more often is logged at debug in between.
const OUTAGE_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// While an outage lasts, it is logged again this often, with what it has dropped.
const OUTAGE_REMINDER: Duration = Duration::from_secs(300);

/// How a sink delivers. Every field's default is the `DEFAULT_*` constant.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryConfig {
    /// Payloads held (waiting or being sent) while the server is slow or down. When
    /// a new payload finds the queue full, the oldest one is dropped and counted
    /// (`dropped_queue_full`). Defaults to [`DEFAULT_QUEUE_CAPACITY`]; at least 1.
    pub queue_capacity: usize,
    /// Attempts per payload before it is dropped (`dropped_retries_exhausted`);
    /// `None`, the default ([`DEFAULT_MAX_ATTEMPTS`]), retries while the queue has
    /// room.
    pub max_attempts: Option<u32>,
    /// First retry delay; doubles after every failure (the next payload carries on
    /// from there: the delay is about the server, not the payload) up to
    /// `max_backoff`, ±50 % jitter; back to this after any answer. Defaults to
    /// [`DEFAULT_BASE_BACKOFF`].
    pub base_backoff: Duration,
    /// Cap of the retry delay. Defaults to [`DEFAULT_MAX_BACKOFF`].
    pub max_backoff: Duration,
    /// Timeout of one send. Defaults to [`DEFAULT_REQUEST_TIMEOUT`].
    pub request_timeout: Duration,
    /// Bytes of payloads held (waiting or being sent): past it, the oldest make room
    /// as past `queue_capacity`. Defaults to [`DEFAULT_MAX_QUEUE_BYTES`].
    pub max_queue_bytes: usize,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            base_backoff: DEFAULT_BASE_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_queue_bytes: DEFAULT_MAX_QUEUE_BYTES,
        }
    }
}

impl DeliveryConfig {
    /// Checks the values; errors name the field (`delivery.queue_capacity`, …).
    pub fn validate(&self) -> Result<(), ExportError> {
        if self.queue_capacity == 0 {
            return Err(ExportError::config(
                "delivery.queue_capacity",
                "must be at least 1",
            ));
        }
        if self.max_attempts == Some(0) {
            return Err(ExportError::config(
                "delivery.max_attempts",
                "must be at least 1 (None: retry while the queue has room)",
            ));
        }
        if self.base_backoff.is_zero() {
            return Err(ExportError::config(
                "delivery.base_backoff",
                "must be more than zero",
            ));
        }
        if self.max_backoff < self.base_backoff {
            return Err(ExportError::config(
                "delivery.max_backoff",
                "must be at least delivery.base_backoff",
            ));
        }
        if self.request_timeout.is_zero() {
            return Err(ExportError::config(
                "delivery.request_timeout",
                "must be more than zero",
            ));
        }
        if self.max_queue_bytes == 0 {
            return Err(ExportError::config(
                "delivery.max_queue_bytes",
                "must be more than zero",
            ));
        }
        Ok(())
    }
}

/// Counters of one sink's delivery. Every payload queued ends in exactly one of
/// `sent` and the `dropped_*` counters, or is still `pending`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryStats {
    /// Payloads accepted into the queue.
    pub queued: u64,
    /// Payloads the server accepted.
    pub sent: u64,
    /// Retries made (attempts after the first).
    pub retried: u64,
    /// Payloads dropped to make room: the oldest of a full queue when a new one came.
    pub dropped_queue_full: u64,
    /// Payloads the server rejected with a 4xx (not retried).
    pub dropped_rejected: u64,
    /// Payloads dropped after `max_attempts` failed attempts (only when set).
    pub dropped_retries_exhausted: u64,
    /// Payloads still queued, or being sent, when the shutdown deadline passed, or
    /// made after shutdown began (the last interval when it came too late).
    pub dropped_shutdown: u64,
    /// Payloads lost to a panic in the sink (in a send, in taking or encoding an
    /// interval's profile, or in the sender thread itself) or to a sender thread
    /// that could not start; the first is logged.
    pub dropped_panicked: u64,
    /// Payloads waiting or being sent now.
    pub pending: u64,
}

impl DeliveryStats {
    /// All payloads dropped, for whatever reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full
            + self.dropped_rejected
            + self.dropped_retries_exhausted
            + self.dropped_shutdown
            + self.dropped_panicked
    }
}

/// Why one send failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// Worth retrying: connection refused or reset, timeout, HTTP 5xx, 408, 429, and
    /// the gRPC codes `Unavailable`, `Cancelled`, `DeadlineExceeded`,
    /// `ResourceExhausted`, `Aborted`, `Internal` and `Unknown`.
    Retryable(String),
    /// The server refused the payload: retrying would not help.
    Rejected {
        /// What the server answered.
        status: RejectStatus,
        /// What the server said (truncated).
        message: String,
    },
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Retryable(why) => write!(f, "send failed, worth retrying: {why}"),
            SendError::Rejected { status, message } => {
                write!(f, "payload rejected with {status}: {message}")
            }
        }
    }
}

impl std::error::Error for SendError {}

/// The status a server refused a payload with: the transport's own kind, never
/// mixed up (an HTTP 404 and the gRPC code 5, `NotFound`, are different values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectStatus {
    /// An HTTP status, 4xx but 408 and 429 (Pyroscope, OTLP over HTTP).
    Http(u16),
    /// A gRPC status code (OTLP over gRPC), such as 3 (`InvalidArgument`) or 16
    /// (`Unauthenticated`).
    Grpc(i32),
}

impl std::fmt::Display for RejectStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RejectStatus::Http(status) => write!(f, "HTTP {status}"),
            RejectStatus::Grpc(code) => write!(f, "gRPC code {code}"),
        }
    }
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
    dropped_panicked: AtomicU64,
}

/// What the sender does with the payload it took from the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InFlight {
    None,
    /// An attempt is under way.
    Sending,
    /// Between attempts: the oldest payload, which a full queue may drop.
    Waiting,
}

/// A queued payload, how many items (profiles, spans) it carries, and its number in
/// the order of queueing.
struct Item {
    payload: Vec<u8>,
    weight: u64,
    seq: u64,
}

struct Queue {
    items: VecDeque<Item>,
    /// Bytes of `items`.
    bytes: usize,
    /// The number the next payload gets.
    next_seq: u64,
    in_flight: InFlight,
    /// The items and bytes of the payload in flight.
    in_flight_weight: u64,
    in_flight_bytes: usize,
    /// The waiting payload was dropped (and counted) to make room.
    abandon_in_flight: bool,
    /// When shutdown began: its deadline.
    closing: Option<Instant>,
    /// The sender thread could not run (no runtime): everything is dropped.
    dead: bool,
}

impl Queue {
    /// Whether a payload in flight is still held (not dropped to make room).
    fn in_flight_held(&self) -> bool {
        self.in_flight != InFlight::None && !self.abandon_in_flight
    }

    /// Payloads held: waiting, plus the one in flight unless dropped already.
    fn held(&self) -> usize {
        self.items.len() + usize::from(self.in_flight_held())
    }

    /// Items held (as [`Queue::held`]).
    fn held_weight(&self) -> u64 {
        self.items.iter().map(|i| i.weight).sum::<u64>()
            + if self.in_flight_held() {
                self.in_flight_weight
            } else {
                0
            }
    }

    /// Bytes held (as [`Queue::held`]).
    fn held_bytes(&self) -> usize {
        self.bytes
            + if self.in_flight_held() {
                self.in_flight_bytes
            } else {
                0
            }
    }

    fn pop_front(&mut self) -> Option<Item> {
        let item = self.items.pop_front()?;
        self.bytes -= item.payload.len();
        Some(item)
    }
}

pub(crate) struct Shared {
    name: &'static str,
    /// What the payloads' items are, in the log (`profiles`, `spans`).
    items: &'static str,
    queue: Mutex<Queue>,
    /// Wakes the sender thread when a payload arrives or shutdown begins.
    cv: Condvar,
    /// Wakes the sender's runtime (a backoff or a send in flight) when shutdown
    /// begins or the waiting payload is dropped.
    wake: tokio::sync::Notify,
    counters: Counters,
    cfg: DeliveryConfig,
    panic_logged: AtomicBool,
    started: Instant,
    /// The payloads whose first attempt is over (all up to this number), with a
    /// condition variable for [`Shared::wait_first_try`].
    tried: Mutex<u64>,
    tried_cv: Condvar,
    /// The last attempt failed in a way worth retrying (an outage is under way).
    failing: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, counter: impl Fn(&Counters) -> &AtomicU64, n: u64) {
        counter(&self.counters).fetch_add(n, Ordering::Relaxed);
    }

    /// Queues a payload without blocking (see [`Delivery::enqueue`]).
    pub(crate) fn enqueue(&self, payload: Vec<u8>, weight: u64) -> bool {
        self.enqueue_seq(payload, weight).is_some()
    }

    /// [`Shared::enqueue`], returning the payload's number if it was kept.
    pub(crate) fn enqueue_seq(&self, payload: Vec<u8>, weight: u64) -> Option<u64> {
        let mut q = self.lock();
        if q.dead {
            self.count(|c| &c.dropped_panicked, weight);
            return None;
        }
        if q.closing.is_some() {
            self.count(|c| &c.dropped_shutdown, weight);
            return None;
        }
        while q.held() >= self.cfg.queue_capacity.max(1)
            || (q.held() > 0 && q.held_bytes() + payload.len() > self.cfg.max_queue_bytes)
        {
            // Full: the oldest payload makes room. That is the one between retries
            // if there is one, else the first waiting; one being sent right now is
            // left to its attempt.
            if q.in_flight == InFlight::Waiting && !q.abandon_in_flight {
                q.abandon_in_flight = true;
                self.count(|c| &c.dropped_queue_full, q.in_flight_weight);
                self.wake.notify_one();
            } else if let Some(old) = q.pop_front() {
                self.count(|c| &c.dropped_queue_full, old.weight);
            } else {
                // Only a payload being sent is held: this one cannot wait.
                self.count(|c| &c.dropped_queue_full, weight);
                return None;
            }
        }
        q.bytes += payload.len();
        q.next_seq += 1;
        let seq = q.next_seq;
        q.items.push_back(Item {
            payload,
            weight,
            seq,
        });
        self.count(|c| &c.queued, weight);
        drop(q);
        self.cv.notify_all();
        Some(seq)
    }

    /// Whether the last attempt failed in a way worth retrying.
    #[cfg_attr(not(feature = "otlp"), allow(dead_code))]
    pub(crate) fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    /// Waits, at most `max`, until payload `seq` has had its first attempt (sent,
    /// refused, or failed and queued for a retry), the sink is failing, or it
    /// stopped. What a caller that wants `export` to mean "sent" while the server
    /// answers, and "kept" while it does not, waits for.
    #[cfg_attr(not(feature = "otlp"), allow(dead_code))]
    pub(crate) fn wait_first_try(&self, seq: u64, max: Duration) {
        let end = Instant::now() + max;
        let mut tried = self.tried.lock().unwrap_or_else(|e| e.into_inner());
        while *tried < seq && !self.failing() && {
            let q = self.lock();
            !q.dead && q.closing.is_none()
        } {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            tried = self
                .tried_cv
                .wait_timeout(tried, left.min(Duration::from_millis(100)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Payload `seq` had its first attempt.
    fn first_try_done(&self, seq: u64) {
        let mut tried = self.tried.lock().unwrap_or_else(|e| e.into_inner());
        *tried = (*tried).max(seq);
        drop(tried);
        self.tried_cv.notify_all();
    }

    /// The sender thread ended early: drops (and counts) what it held, and every
    /// later payload.
    fn sender_ended(&self) {
        let mut q = self.lock();
        q.dead = true;
        let held = q.held_weight();
        q.items.clear();
        q.bytes = 0;
        q.in_flight = InFlight::None;
        self.count(|c| &c.dropped_panicked, held);
    }

    /// Counts a payload lost at shutdown.
    pub(crate) fn count_dropped_shutdown(&self) {
        self.count(|c| &c.dropped_shutdown, 1);
    }

    /// Counts a payload lost to a panic and logs the first panic of this sink.
    pub(crate) fn lost_to_panic(
        &self,
        what: &str,
        panic: &(dyn std::any::Any + Send),
        weight: u64,
    ) {
        self.count(|c| &c.dropped_panicked, weight);
        if !self.panic_logged.swap(true, Ordering::Relaxed) {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            tracing::error!(
                sink = self.name,
                panic = %message,
                "spanprof: a panic in {what} was caught; the payload is dropped and counted \
                 (dropped_panicked), the sink goes on (logged once)"
            );
        }
    }

    pub(crate) fn stats(&self) -> DeliveryStats {
        let c = &self.counters;
        let q = self.lock();
        DeliveryStats {
            queued: c.queued.load(Ordering::Relaxed),
            sent: c.sent.load(Ordering::Relaxed),
            retried: c.retried.load(Ordering::Relaxed),
            dropped_queue_full: c.dropped_queue_full.load(Ordering::Relaxed),
            dropped_rejected: c.dropped_rejected.load(Ordering::Relaxed),
            dropped_retries_exhausted: c.dropped_retries_exhausted.load(Ordering::Relaxed),
            dropped_shutdown: c.dropped_shutdown.load(Ordering::Relaxed),
            dropped_panicked: c.dropped_panicked.load(Ordering::Relaxed),
            pending: q.held_weight(),
        }
    }
}

/// A sink's delivery: a bounded queue and its sender thread. Dropping it stops it at
/// once (what is queued is dropped, counted and logged); [`Delivery::shutdown`]
/// flushes first.
#[must_use = "a Delivery stops when dropped: keep it as long as payloads are to be sent"]
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
    /// Starts the sender thread of sink `name`. `cfg` should pass
    /// [`DeliveryConfig::validate`] (the exporters check it); a zero queue capacity
    /// holds one payload.
    pub fn start(name: &'static str, cfg: DeliveryConfig, transport: impl Transport) -> Delivery {
        Delivery::start_on(name, "profiles", cfg, transport, Clock::Real)
    }

    /// [`Delivery::start`] for payloads that each carry a number of `items` (the
    /// log's word for them: `spans`), queued with [`Delivery::enqueue_items`]; the
    /// counters count items.
    pub fn start_for(
        name: &'static str,
        items: &'static str,
        cfg: DeliveryConfig,
        transport: impl Transport,
    ) -> Delivery {
        Delivery::start_on(name, items, cfg, transport, Clock::Real)
    }

    fn start_on(
        name: &'static str,
        items: &'static str,
        cfg: DeliveryConfig,
        transport: impl Transport,
        clock: Clock,
    ) -> Delivery {
        let shared = Arc::new(Shared {
            name,
            items,
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                bytes: 0,
                next_seq: 0,
                in_flight: InFlight::None,
                in_flight_weight: 0,
                in_flight_bytes: 0,
                abandon_in_flight: false,
                closing: None,
                dead: false,
            }),
            cv: Condvar::new(),
            wake: tokio::sync::Notify::new(),
            counters: Counters::default(),
            cfg,
            panic_logged: AtomicBool::new(false),
            started: Instant::now(),
            tried: Mutex::new(0),
            tried_cv: Condvar::new(),
            failing: AtomicBool::new(false),
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("spanprof-{name}"))
                .spawn(move || {
                    let guarded = shared.clone();
                    // The last line of defence: whatever happens, what is left is
                    // counted, and later payloads too.
                    if let Err(panic) =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            run(shared, transport, clock)
                        }))
                    {
                        guarded.lost_to_panic("the sender thread", &*panic, 0);
                        guarded.sender_ended();
                    }
                })
                .expect("spawn a sink thread")
        };
        Delivery {
            shared,
            thread: Some(thread),
        }
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Queues a payload without blocking. When the queue is full the oldest payload
    /// is dropped to make room (counted in `dropped_queue_full`). Returns false (and
    /// counts it) when the payload itself is not kept: after shutdown began.
    pub fn enqueue(&self, payload: Vec<u8>) -> bool {
        self.shared.enqueue(payload, 1)
    }

    /// [`Delivery::enqueue`] of a payload carrying `items` items (spans of a batch).
    pub fn enqueue_items(&self, payload: Vec<u8>, items: u64) -> bool {
        self.shared.enqueue(payload, items)
    }

    /// The counters.
    pub fn stats(&self) -> DeliveryStats {
        self.shared.stats()
    }

    /// Stops accepting payloads, keeps sending what is queued until it is all sent or
    /// `deadline` has passed — a send still under way then is cut — drops (and
    /// counts) the rest, and returns the counters. Returns within `deadline` (plus
    /// the time to stop a thread).
    pub fn shutdown(mut self, deadline: Duration) -> DeliveryStats {
        self.begin_close(Instant::now() + deadline);
        self.finish_close()
    }

    /// Starts the flush: no new payloads, sends cut at `end`.
    pub(crate) fn begin_close(&self, end: Instant) {
        self.shared.lock().closing = Some(end);
        self.shared.cv.notify_all();
        self.shared.wake.notify_one();
    }

    /// Waits for the sender thread (it ends by the deadline of
    /// [`Delivery::begin_close`]), logs and returns the counters.
    pub(crate) fn finish_close(&mut self) -> DeliveryStats {
        self.finish_close_as(Stopped::Shutdown)
    }

    /// [`Delivery::finish_close`], saying how the sink was stopped.
    pub(crate) fn finish_close_as(&mut self, how: Stopped) -> DeliveryStats {
        let Some(t) = self.thread.take() else {
            return self.stats();
        };
        let _ = t.join();
        let stats = self.stats();
        log_stop(&self.shared, &stats, how);
        stats
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.begin_close(Instant::now());
            self.finish_close_as(Stopped::Dropped);
        }
    }
}

/// One payload, in the log: `a profile` (one item each), or `a batch of spans`.
fn one_payload(items: &str) -> String {
    match items.strip_suffix('s') {
        Some(one) if items == "profiles" => format!("a {one}"),
        _ => format!("a batch of {items}"),
    }
}

/// How a sink was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// By `shutdown` (the service's end).
    Shutdown,
    /// Its handle was dropped.
    Dropped,
}

/// The one line of a sink's stop: info when all went, warn when it dropped
/// profiles or sent none, with what a dropped handle means.
fn log_stop(shared: &Shared, stats: &DeliveryStats, how: Stopped) {
    let name = shared.name;
    let after = shared.started.elapsed().as_secs_f64();
    let dropped = stats.dropped();
    let detail = format!(
        "{} queued, {} sent, {dropped} dropped (queue full {}, rejected {}, retries exhausted {}, at shutdown {}, panics {})",
        stats.queued,
        stats.sent,
        stats.dropped_queue_full,
        stats.dropped_rejected,
        stats.dropped_retries_exhausted,
        stats.dropped_shutdown,
        stats.dropped_panicked
    );
    match (how, stats.sent) {
        (Stopped::Dropped, 0) => tracing::warn!(
            sink = name,
            "spanprof: the {name} sink stopped {after:.1} s after it started, having sent nothing, because its \
             handle was dropped: a sink runs only while its handle lives. Keep the exporter (or the Sinks \
             holding it) alive as long as the service runs, and stop it with shutdown() at the end. {detail}"
        ),
        (Stopped::Shutdown, 0) if stats.queued == 0 && dropped == 0 => tracing::info!(
            sink = name,
            "spanprof: the {name} sink stopped after {after:.1} s, having sent nothing: no profile had samples"
        ),
        (_, 0) => tracing::warn!(
            sink = name,
            "spanprof: the {name} sink stopped after {after:.1} s having sent nothing: {detail}"
        ),
        _ if dropped > 0 => tracing::warn!(
            sink = name,
            "spanprof: the {name} sink stopped after {after:.1} s: {detail}"
        ),
        _ => tracing::info!(
            sink = name,
            "spanprof: the {name} sink stopped after {after:.1} s: {detail}"
        ),
    }
}

/// The sender's clock: real, or (in this crate's tests) tokio's paused clock, which
/// jumps over every wait, so that the default policy can be followed through a long
/// outage in no time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Clock {
    Real,
    #[cfg(test)]
    Paused,
}

fn sender_runtime(clock: Clock) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all();
    #[cfg(test)]
    if clock == Clock::Paused {
        builder.start_paused(true);
    }
    let _ = clock;
    builder.build()
}

/// How one attempt ended.
enum Attempt {
    Done(Result<(), SendError>),
    /// Shutdown's deadline came first.
    Cut,
    Panicked(Box<dyn std::any::Any + Send>),
}

/// One send, bounded by the request timeout and by shutdown's deadline (which may
/// be set while it runs), with any panic caught.
fn attempt(
    rt: &tokio::runtime::Runtime,
    shared: &Shared,
    transport: &impl Transport,
    payload: &[u8],
) -> Attempt {
    let timeout = shared.cfg.request_timeout;
    let send = async {
        tokio::select! {
            r = tokio::time::timeout(timeout, transport.send(payload)) => Attempt::Done(
                r.unwrap_or_else(|_| {
                    Err(SendError::Retryable(format!("request timed out after {timeout:?}")))
                }),
            ),
            () = until_deadline(shared) => Attempt::Cut,
        }
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(send))) {
        Ok(a) => a,
        Err(panic) => Attempt::Panicked(panic),
    }
}

/// Completes at shutdown's deadline (never before shutdown begins).
async fn until_deadline(shared: &Shared) {
    loop {
        let woken = shared.wake.notified();
        let closing = shared.lock().closing;
        if let Some(end) = closing {
            tokio::time::sleep_until(end.into()).await;
            return;
        }
        woken.await;
    }
}

/// Waits `wait` between attempts; returns early (false) when the payload is dropped
/// to make room or the retry would come after shutdown's deadline. Returns whether
/// to try again.
fn backoff_wait(rt: &tokio::runtime::Runtime, shared: &Shared, wait: Duration) -> bool {
    rt.block_on(async {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let woken = shared.wake.notified();
            {
                let q = shared.lock();
                if q.abandon_in_flight {
                    return false;
                }
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                if q.closing.is_some_and(|d| Instant::now() + left >= d) {
                    return false;
                }
            }
            tokio::select! {
                () = tokio::time::sleep_until(until) => return true,
                () = woken => {}
            }
        }
    })
}

fn run(shared: Arc<Shared>, transport: impl Transport, clock: Clock) {
    let rt = match sender_runtime(clock) {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(sink = shared.name, error = %e, "spanprof: cannot start a sink's runtime; its profiles are dropped and counted (dropped_panicked)");
            shared.sender_ended();
            return;
        }
    };
    let mut sender = Sender {
        rt: &rt,
        shared: &shared,
        transport: &transport,
        backoff: Backoff::new(shared.cfg.base_backoff, shared.cfg.max_backoff),
        logged_status: HashSet::new(),
        outage: None,
        last_outage_logged: None,
    };
    while let Some(item) = next_payload(&shared) {
        sender.deliver(&item.payload, item.weight, item.seq);
        let mut q = shared.lock();
        q.in_flight = InFlight::None;
        q.in_flight_weight = 0;
        q.in_flight_bytes = 0;
        q.abandon_in_flight = false;
    }
    // Neither wait for nor drop-block on the transport's leftovers (a DNS lookup on a
    // blocking thread, a half-open connection).
    rt.shutdown_background();
}

/// The next payload to send (marked in flight), or `None` when the sink is closing
/// and its queue is empty or its deadline has passed (what is left is counted as
/// dropped at shutdown).
fn next_payload(shared: &Shared) -> Option<Item> {
    let mut q = shared.lock();
    loop {
        if let Some(d) = q.closing
            && (q.items.is_empty() || Instant::now() >= d)
        {
            let left = q.items.iter().map(|i| i.weight).sum();
            q.items.clear();
            q.bytes = 0;
            shared.count(|c| &c.dropped_shutdown, left);
            return None;
        }
        if let Some(item) = q.pop_front() {
            q.in_flight = InFlight::Sending;
            q.in_flight_weight = item.weight;
            q.in_flight_bytes = item.payload.len();
            return Some(item);
        }
        q = shared.cv.wait(q).unwrap_or_else(|e| e.into_inner());
    }
}

/// The sender thread's state across payloads.
struct Sender<'a, T> {
    rt: &'a tokio::runtime::Runtime,
    shared: &'a Shared,
    transport: &'a T,
    backoff: Backoff,
    /// Refusal statuses already logged (each is logged once).
    logged_status: HashSet<RejectStatus>,
    /// The server has failed since its last success.
    outage: Option<Outage>,
    /// When an outage was last logged (at most one per [`OUTAGE_LOG_INTERVAL`]).
    last_outage_logged: Option<Instant>,
}

/// A run of failed sends.
struct Outage {
    since: Instant,
    /// Profiles dropped before it began.
    dropped_before: u64,
    /// Whether its beginning was logged (then its end is too).
    logged: bool,
    last_logged: Instant,
}

impl<T: Transport> Sender<'_, T> {
    /// Sends one payload, retrying with backoff while that can help; every way it
    /// can end is counted.
    fn deliver(&mut self, payload: &[u8], weight: u64, seq: u64) {
        let shared = self.shared;
        let items = shared.items;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let result = attempt(self.rt, shared, self.transport, payload);
            shared.failing.store(
                matches!(result, Attempt::Done(Err(SendError::Retryable(_)))),
                Ordering::Relaxed,
            );
            if attempts == 1 {
                shared.first_try_done(seq);
            }
            match result {
                Attempt::Done(Ok(())) => {
                    shared.count(|c| &c.sent, weight);
                    self.backoff.reset();
                    self.recovered();
                    return;
                }
                Attempt::Done(Err(SendError::Rejected { status, message })) => {
                    shared.count(|c| &c.dropped_rejected, weight);
                    self.backoff.reset();
                    if self.logged_status.insert(status) {
                        tracing::warn!(
                            sink = shared.name,
                            status = %status,
                            message = %message,
                            "spanprof: the server rejected {}; not retrying (logged once per status)",
                            one_payload(items)
                        );
                    }
                    return;
                }
                Attempt::Cut => {
                    shared.count(|c| &c.dropped_shutdown, weight);
                    return;
                }
                Attempt::Panicked(panic) => {
                    shared.lost_to_panic("a send", &*panic, weight);
                    return;
                }
                Attempt::Done(Err(SendError::Retryable(why))) => {
                    self.failed(&why);
                    if shared.cfg.max_attempts.is_some_and(|max| attempts >= max) {
                        shared.count(|c| &c.dropped_retries_exhausted, weight);
                        tracing::warn!(sink = shared.name, error = %why, attempts, "spanprof: dropping {} after retries", one_payload(items));
                        return;
                    }
                    if !self.wait_to_retry(&why, attempts, weight) {
                        return;
                    }
                }
            }
        }
    }

    /// A send failed in a way worth retrying: an outage begins (logged once, unless
    /// one was logged in the last minute) or goes on (a reminder every five minutes).
    fn failed(&mut self, why: &str) {
        let shared = self.shared;
        let name = shared.name;
        let now = Instant::now();
        match &mut self.outage {
            None => {
                let logged = self
                    .last_outage_logged
                    .is_none_or(|t| now.duration_since(t) >= OUTAGE_LOG_INTERVAL);
                if logged {
                    self.last_outage_logged = Some(now);
                    tracing::warn!(
                        sink = name,
                        error = %why,
                        "spanprof: the {name} sink is failing ({why}); retrying with backoff (up to {:?}) while \
                         its queue holds {} payloads ({} MiB), dropping the oldest past that (counted); logged again \
                         when it recovers",
                        shared.cfg.max_backoff,
                        shared.cfg.queue_capacity,
                        shared.cfg.max_queue_bytes >> 20
                    );
                } else {
                    tracing::debug!(sink = name, error = %why, "spanprof: the {name} sink is failing again");
                }
                self.outage = Some(Outage {
                    since: now,
                    dropped_before: shared.stats().dropped(),
                    logged,
                    last_logged: now,
                });
            }
            Some(o) if o.logged && now.duration_since(o.last_logged) >= OUTAGE_REMINDER => {
                o.last_logged = now;
                tracing::warn!(
                    sink = name,
                    error = %why,
                    "spanprof: the {name} sink is still failing after {:.0} s ({why}): {} {} dropped so far",
                    now.duration_since(o.since).as_secs_f64(),
                    shared.stats().dropped() - o.dropped_before,
                    shared.items
                );
            }
            Some(_) => {}
        }
    }

    /// A send went through: an outage, if there was one, ends.
    fn recovered(&mut self) {
        let Some(o) = self.outage.take() else {
            return;
        };
        let name = self.shared.name;
        let lasted = o.since.elapsed().as_secs_f64();
        let dropped = self.shared.stats().dropped() - o.dropped_before;
        if o.logged {
            tracing::warn!(
                sink = name,
                dropped,
                "spanprof: the {name} sink recovered after {lasted:.1} s; {dropped} {} dropped meanwhile",
                self.shared.items
            );
        } else {
            tracing::debug!(
                sink = name,
                dropped,
                "spanprof: the {name} sink recovered after {lasted:.1} s"
            );
        }
    }

    /// Waits out the backoff before another attempt. False (the payload counted as
    /// dropped, or already counted when it was dropped to make room) when the retry
    /// would come after shutdown's deadline or the payload was abandoned meanwhile.
    fn wait_to_retry(&mut self, why: &str, attempts: u32, weight: u64) -> bool {
        let shared = self.shared;
        let wait = self.backoff.next_wait();
        {
            let mut q = shared.lock();
            if q.closing.is_some_and(|d| Instant::now() + wait >= d) {
                // The retry would come after shutdown's deadline.
                shared.count(|c| &c.dropped_shutdown, weight);
                return false;
            }
            q.in_flight = InFlight::Waiting;
        }
        tracing::debug!(sink = shared.name, error = %why, attempt = attempts, ?wait, "spanprof: send failed; retrying");
        let again = backoff_wait(self.rt, shared, wait);
        let mut q = shared.lock();
        if q.abandon_in_flight {
            // Dropped to make room (counted then).
            return false;
        }
        if !again {
            shared.count(|c| &c.dropped_shutdown, weight);
            return false;
        }
        q.in_flight = InFlight::Sending;
        shared.count(|c| &c.retried, 1);
        true
    }
}

#[cfg(test)]
mod tests {
    //! The default policy followed through long outages with tokio's paused clock:
    //! the sender's waits (backoff, timeouts) are the real code's, but each one is
    //! skipped over, so half an hour of outage takes milliseconds.

    use super::*;
    use std::sync::atomic::AtomicBool;

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
}
