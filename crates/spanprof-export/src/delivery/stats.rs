//! What a sink's delivery counts.

use std::sync::atomic::AtomicU64;

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

#[derive(Default)]
pub(super) struct Counters {
    pub(super) queued: AtomicU64,
    pub(super) sent: AtomicU64,
    pub(super) retried: AtomicU64,
    pub(super) dropped_queue_full: AtomicU64,
    pub(super) dropped_rejected: AtomicU64,
    pub(super) dropped_retries_exhausted: AtomicU64,
    pub(super) dropped_shutdown: AtomicU64,
    pub(super) dropped_panicked: AtomicU64,
}
