//! The retry delay of a sink's delivery: exponential backoff with jitter.

use std::time::Duration;

/// The retry delay, kept across payloads (it is about the server, not the payload):
/// during an outage the next payload's retries go on from the current delay; any
/// answer from the server resets it. Each delay is the current one times a factor
/// drawn uniformly from [0.5, 1.5) (±50 % jitter, so sinks of many processes that
/// lost the same server do not retry in step); the current one doubles after each
/// wait, up to `max`.
#[derive(Debug)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
    next: Duration,
    seed: u64,
}

impl Backoff {
    /// Starts at `base`; `max` bounds the delay before jitter.
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        use std::hash::{BuildHasher, RandomState};
        // RandomState's keys are random per process and differ between instances, so
        // two sinks (or two processes) draw different jitter.
        Backoff {
            base,
            max,
            next: base,
            seed: RandomState::new().hash_one(std::process::id()) | 1,
        }
    }

    /// The next delay, and doubles the one after.
    pub(crate) fn next_wait(&mut self) -> Duration {
        // xorshift: jitter needs no cryptographic source.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let factor = 0.5 + (self.seed >> 11) as f64 / (1u64 << 53) as f64;
        let wait = self.next.mul_f64(factor);
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// Back to the first delay (the server answered).
    pub(crate) fn reset(&mut self) {
        self.next = self.base;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(30);

    #[test]
    fn delays_double_up_to_the_bound_within_the_jitter() {
        let mut b = Backoff::new(BASE, MAX);
        let mut nominal = BASE;
        for _ in 0..12 {
            let w = b.next_wait();
            assert!(
                w >= nominal.mul_f64(0.5) && w < nominal.mul_f64(1.5),
                "{w:?} for {nominal:?}"
            );
            nominal = (nominal * 2).min(MAX);
        }
        assert_eq!(nominal, MAX);
    }

    #[test]
    fn an_answer_resets_the_delay() {
        let mut b = Backoff::new(BASE, MAX);
        for _ in 0..8 {
            b.next_wait();
        }
        b.reset();
        assert!(b.next_wait() < BASE.mul_f64(1.5));
    }

    #[test]
    fn jitter_spreads_and_differs_between_sinks() {
        let draws = |b: &mut Backoff| -> Vec<Duration> {
            (0..32)
                .map(|_| {
                    let w = b.next_wait();
                    b.reset();
                    w
                })
                .collect()
        };
        let (mut a, mut b) = (Backoff::new(BASE, MAX), Backoff::new(BASE, MAX));
        let (da, db) = (draws(&mut a), draws(&mut b));
        assert_ne!(da, db, "two sinks drew the same jitter");
        // Uniform over [250 ms, 750 ms): 32 draws cover both halves.
        assert!(
            da.iter().any(|w| *w < BASE) && da.iter().any(|w| *w > BASE),
            "{da:?}"
        );
    }
}
