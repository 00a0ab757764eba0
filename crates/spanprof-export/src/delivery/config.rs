//! What a sink's delivery can be set to, and its defaults.

use std::time::Duration;

use crate::ExportError;

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
pub(super) const OUTAGE_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// While an outage lasts, it is logged again this often, with what it has dropped.
pub(super) const OUTAGE_REMINDER: Duration = Duration::from_secs(300);

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
