//! The interval thread each network sink runs: take the interval's profile, encode
//! it, hand it to its delivery.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use spanprof_core::Profile;

use crate::delivery::Stopped;
use crate::{Delivery, DeliveryStats, ProfileSource};

/// The state of an interval thread.
#[derive(Default)]
struct IntervalState {
    /// Shutdown asked for the last interval.
    stop: bool,
    /// The thread has queued its last interval and ended.
    done: bool,
    /// No last interval is queued: shutdown gave up waiting for it, or the handle
    /// was dropped (then none is taken).
    abandoned: bool,
}

/// The interval loop shared by the network sinks: every interval, take a profile,
/// encode it and queue it for delivery (never blocking on the network).
pub(crate) struct Exporter {
    pub(crate) name: &'static str,
    state: Arc<(Mutex<IntervalState>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    pub(crate) delivery: Delivery,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("sink", &self.name)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Exporter {
    /// Starts the interval thread of the sink `name` (`pyroscope`, `otlp-profiles`:
    /// what its stats and logs are reported as; the thread is
    /// `spanprof-{name}-interval`).
    pub(crate) fn start(
        name: &'static str,
        interval: Duration,
        mut source: ProfileSource,
        delivery: Delivery,
        mut encode: impl FnMut(&Profile) -> Option<Vec<u8>> + Send + 'static,
    ) -> Exporter {
        let state: Arc<(Mutex<IntervalState>, Condvar)> = Arc::default();
        let thread = {
            let state = state.clone();
            let queue = delivery.shared();
            std::thread::Builder::new()
                .name(format!("spanprof-{name}-interval"))
                .spawn(move || {
                    let (lock, cv) = &*state;
                    loop {
                        let stopped = {
                            let g = lock.lock().unwrap_or_else(|e| e.into_inner());
                            let (mut g, _) = cv
                                .wait_timeout_while(g, interval, |s| !s.stop)
                                .unwrap_or_else(|e| e.into_inner());
                            if g.abandoned {
                                // A dropped handle: no last interval.
                                g.done = true;
                                return;
                            }
                            g.stop
                        };
                        // The last interval is taken at shutdown too. A panic in the
                        // source or the encoder costs this interval, not the sink.
                        let payload =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                encode(&source.next(stopped))
                            }));
                        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
                        match payload {
                            Ok(Some(p)) if !g.abandoned => {
                                queue.enqueue(p, 1);
                            }
                            Ok(_) => {}
                            Err(panic) => queue.lost_to_panic("taking a profile", &*panic, 1),
                        }
                        if stopped {
                            g.done = true;
                            cv.notify_all();
                            return;
                        }
                    }
                })
                .expect("spawn an exporter thread")
        };
        Exporter {
            name,
            state,
            thread: Some(thread),
            delivery,
        }
    }

    pub(crate) fn stats(&self) -> DeliveryStats {
        self.delivery.stats()
    }

    /// Stops this sink alone: its last interval, then its queue flushed until empty
    /// or `deadline` (what [`crate::Sinks::shutdown`] does for several at once).
    pub(crate) fn shutdown(mut self, deadline: Duration) -> DeliveryStats {
        let end = Instant::now() + deadline;
        self.stop_interval();
        self.wait_interval(end);
        self.delivery.begin_close(end);
        self.delivery.finish_close()
    }

    /// Asks the interval thread for its last interval.
    pub(crate) fn stop_interval(&self) {
        let (lock, cv) = &*self.state;
        lock.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        cv.notify_all();
    }

    /// Stops the interval thread without a last interval, counting that interval
    /// as dropped at shutdown, and leaves the thread to end by itself.
    fn abandon_interval(&mut self) {
        let (lock, cv) = &*self.state;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        if !g.done {
            give_up(&mut g, &self.delivery);
        }
        drop(g);
        cv.notify_all();
        self.thread = None;
    }

    /// Waits for the last interval until `end`; past it, that interval is dropped
    /// and counted (`dropped_shutdown`) and the thread is left to end by itself.
    pub(crate) fn wait_interval(&mut self, end: Instant) {
        let (lock, cv) = &*self.state;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        while !g.done {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                give_up(&mut g, &self.delivery);
                self.thread = None;
                return;
            }
            g = cv
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Gives up on the last interval: the interval thread takes none and ends by
/// itself, and that interval counts as one profile dropped at shutdown.
fn give_up(state: &mut IntervalState, delivery: &Delivery) {
    state.stop = true;
    state.abandoned = true;
    delivery.shared().count_dropped_shutdown();
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if self.thread.is_some() {
            // Stop at once, taking no last interval (the interval's samples are
            // counted as one profile dropped at shutdown), and drop what is queued
            // (counted too). The stop is logged, saying that the handle was
            // dropped. The interval thread ends by itself.
            self.abandon_interval();
            self.delivery.begin_close(Instant::now());
            self.delivery.finish_close_as(Stopped::Dropped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::{SendFuture, Transport};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A transport that accepts everything and counts it.
    struct Accepting(Arc<AtomicUsize>);

    impl Transport for Accepting {
        fn send<'a>(&'a self, _: &'a [u8]) -> SendFuture<'a> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Box::pin(async { Ok(()) })
        }
    }

    /// A dropped handle stops the sink at once, whatever the threads' timing: it
    /// takes no last interval, so nothing is sent after the drop, and the log
    /// line of a sink that sent nothing always says the handle was dropped. Taking
    /// one (as shutdown does) let a quick interval thread queue and send it.
    #[test]
    fn a_dropped_handle_takes_no_last_interval() {
        let taken = Arc::new(AtomicUsize::new(0));
        let sent = Arc::new(AtomicUsize::new(0));
        let source = {
            let taken = taken.clone();
            ProfileSource::from_fn(move || {
                taken.fetch_add(1, Ordering::Relaxed);
                Profile::empty(10_000_000)
            })
        };
        let delivery = Delivery::start(
            "test",
            crate::DeliveryConfig::default(),
            Accepting(sent.clone()),
        );
        let exporter = Exporter::start("test", Duration::from_secs(3600), source, delivery, |_| {
            Some(vec![1])
        });
        drop(exporter);
        // The interval thread is left to end by itself: give it time to.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(taken.load(Ordering::Relaxed), 0, "a profile was taken");
        assert_eq!(sent.load(Ordering::Relaxed), 0, "a payload was sent");
    }
}
