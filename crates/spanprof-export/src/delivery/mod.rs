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

mod config;
mod error;
mod queue;
mod sender;
mod stats;
mod transport;

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use config::{
    DEFAULT_BASE_BACKOFF, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_BACKOFF, DEFAULT_MAX_QUEUE_BYTES,
    DEFAULT_QUEUE_CAPACITY, DEFAULT_REQUEST_TIMEOUT, DEFAULT_SHUTDOWN_DEADLINE, DeliveryConfig,
};
pub use error::{RejectStatus, SendError};
pub(crate) use queue::Shared;
use queue::{InFlight, Queue};
use sender::{Clock, run};
use stats::Counters;
pub use stats::DeliveryStats;
pub use transport::{SendFuture, Transport};

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

#[cfg(test)]
mod tests;
