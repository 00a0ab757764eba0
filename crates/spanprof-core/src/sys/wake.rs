//! Waking the drain thread from the signal handler: a futex word bumped by
//! [`request_drain`] (one atomic add and one `futex` wake, both async-signal-safe),
//! and slept on by the drain thread between its timed passes.
//!
//! The handler calls it only when a ring reaches half its capacity, so at steady
//! rates the drain thread wakes on its interval alone, and a burst (work promoted to
//! the high rate) is drained before its ring fills.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Bumped by every drain request; the drain thread sleeps while it is unchanged.
static DRAIN_REQUESTS: AtomicU32 = AtomicU32::new(0);

/// Drain requests so far: read before a pass, handed to [`wait_for_drain_request`]
/// after it, so a request made during the pass is not slept through.
pub(crate) fn drain_requests() -> u32 {
    DRAIN_REQUESTS.load(Ordering::Acquire)
}

/// Asks the drain thread to drain now. Async-signal-safe: no lock, no allocation,
/// one system call.
pub(crate) fn request_drain() {
    DRAIN_REQUESTS.fetch_add(1, Ordering::Release);
    // SAFETY: FUTEX_WAKE on a valid, aligned, 'static u32; it reads nothing else
    // and is async-signal-safe (a plain system call).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            DRAIN_REQUESTS.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

/// Sleeps up to `timeout`, or less if a drain is requested after `seen` was read
/// (at once if one already was). May return early (a signal); the caller's loop
/// simply drains again.
pub(crate) fn wait_for_drain_request(seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned, 'static u32 with a valid relative
    // timeout; the kernel sleeps only while the word still equals `seen`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            DRAIN_REQUESTS.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            seen,
            &ts as *const libc::timespec,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_request_wakes_the_sleeper_and_a_past_one_is_not_slept_through() {
        let seen = drain_requests();
        request_drain();
        let start = Instant::now();
        // The word moved since `seen`: the kernel returns at once.
        wait_for_drain_request(seen, Duration::from_secs(30));
        assert!(start.elapsed() < Duration::from_secs(20));

        let seen = drain_requests();
        let sleeper = std::thread::spawn(move || {
            let start = Instant::now();
            wait_for_drain_request(seen, Duration::from_secs(30));
            start.elapsed()
        });
        // Keep requesting until the sleeper is out: each request after it started
        // sleeping wakes it; one before finds the word changed.
        while !sleeper.is_finished() {
            request_drain();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(sleeper.join().unwrap() < Duration::from_secs(20));
    }
}
