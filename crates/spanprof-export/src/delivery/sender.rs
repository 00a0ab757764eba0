//! The sender thread: one payload at a time, retried with backoff, cut by
//! shutdown's deadline, every outcome counted and outages logged.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::config::{OUTAGE_LOG_INTERVAL, OUTAGE_REMINDER};
use super::queue::{InFlight, Item, Shared};
use super::{RejectStatus, SendError, Transport, one_payload};
use crate::retry::Backoff;

/// The sender's clock: real, or (in this crate's tests) tokio's paused clock, which
/// jumps over every wait, so that the default policy can be followed through a long
/// outage in no time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Clock {
    Real,
    #[cfg(test)]
    Paused,
}

pub(super) fn sender_runtime(clock: Clock) -> std::io::Result<tokio::runtime::Runtime> {
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
pub(super) enum Attempt {
    Done(Result<(), SendError>),
    /// Shutdown's deadline came first.
    Cut,
    Panicked(Box<dyn std::any::Any + Send>),
}

/// One send, bounded by the request timeout and by shutdown's deadline (which may
/// be set while it runs), with any panic caught.
pub(super) fn attempt(
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
pub(super) async fn until_deadline(shared: &Shared) {
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
pub(super) fn backoff_wait(rt: &tokio::runtime::Runtime, shared: &Shared, wait: Duration) -> bool {
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

pub(super) fn run(shared: Arc<Shared>, transport: impl Transport, clock: Clock) {
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
pub(super) fn next_payload(shared: &Shared) -> Option<Item> {
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
pub(super) struct Sender<'a, T> {
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
pub(super) struct Outage {
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
