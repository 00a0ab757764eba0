//! The bounded queue a sink's payloads wait in, shared by the exporter's side and
//! the sender thread.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Counters, DeliveryConfig, DeliveryStats};

/// What the sender does with the payload it took from the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum InFlight {
    None,
    /// An attempt is under way.
    Sending,
    /// Between attempts: the oldest payload, which a full queue may drop.
    Waiting,
}

/// A queued payload, how many items (profiles, spans) it carries, and its number in
/// the order of queueing.
pub(super) struct Item {
    pub(super) payload: Vec<u8>,
    pub(super) weight: u64,
    pub(super) seq: u64,
}

pub(super) struct Queue {
    pub(super) items: VecDeque<Item>,
    /// Bytes of `items`.
    pub(super) bytes: usize,
    /// The number the next payload gets.
    pub(super) next_seq: u64,
    pub(super) in_flight: InFlight,
    /// The items and bytes of the payload in flight.
    pub(super) in_flight_weight: u64,
    pub(super) in_flight_bytes: usize,
    /// The waiting payload was dropped (and counted) to make room.
    pub(super) abandon_in_flight: bool,
    /// When shutdown began: its deadline.
    pub(super) closing: Option<Instant>,
    /// The sender thread could not run (no runtime): everything is dropped.
    pub(super) dead: bool,
}

impl Queue {
    /// Whether a payload in flight is still held (not dropped to make room).
    pub(super) fn in_flight_held(&self) -> bool {
        self.in_flight != InFlight::None && !self.abandon_in_flight
    }

    /// Payloads held: waiting, plus the one in flight unless dropped already.
    pub(super) fn held(&self) -> usize {
        self.items.len() + usize::from(self.in_flight_held())
    }

    /// Items held (as [`Queue::held`]).
    pub(super) fn held_weight(&self) -> u64 {
        self.items.iter().map(|i| i.weight).sum::<u64>()
            + if self.in_flight_held() {
                self.in_flight_weight
            } else {
                0
            }
    }

    /// Bytes held (as [`Queue::held`]).
    pub(super) fn held_bytes(&self) -> usize {
        self.bytes
            + if self.in_flight_held() {
                self.in_flight_bytes
            } else {
                0
            }
    }

    pub(super) fn pop_front(&mut self) -> Option<Item> {
        let item = self.items.pop_front()?;
        self.bytes -= item.payload.len();
        Some(item)
    }
}

pub(crate) struct Shared {
    pub(super) name: &'static str,
    /// What the payloads' items are, in the log (`profiles`, `spans`).
    pub(super) items: &'static str,
    pub(super) queue: Mutex<Queue>,
    /// Wakes the sender thread when a payload arrives or shutdown begins.
    pub(super) cv: Condvar,
    /// Wakes the sender's runtime (a backoff or a send in flight) when shutdown
    /// begins or the waiting payload is dropped.
    pub(super) wake: tokio::sync::Notify,
    pub(super) counters: Counters,
    pub(super) cfg: DeliveryConfig,
    pub(super) panic_logged: AtomicBool,
    pub(super) started: Instant,
    /// The payloads whose first attempt is over (all up to this number), with a
    /// condition variable for [`Shared::wait_first_try`].
    pub(super) tried: Mutex<u64>,
    pub(super) tried_cv: Condvar,
    /// The last attempt failed in a way worth retrying (an outage is under way).
    pub(super) failing: AtomicBool,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn count(&self, counter: impl Fn(&Counters) -> &AtomicU64, n: u64) {
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
    pub(super) fn first_try_done(&self, seq: u64) {
        let mut tried = self.tried.lock().unwrap_or_else(|e| e.into_inner());
        *tried = (*tried).max(seq);
        drop(tried);
        self.tried_cv.notify_all();
    }

    /// The sender thread ended early: drops (and counts) what it held, and every
    /// later payload.
    pub(super) fn sender_ended(&self) {
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
