//! What hot work's polls read besides the wall clock, to tell where a span's time
//! went when it was not on CPU: the polling thread's CPU time and run delay
//! ([`ThreadTimes`]), and a waker that stamps when the work was woken
//! ([`WakeStamp`]). Cold work reads none of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};

use crate::clock::CLOCK;
use crate::sys;

/// Makes this thread's state for hot polls now (its schedstat file, its spare wake
/// stamps), as the thread is registered, rather than in a request.
pub(crate) fn prepare_thread() {
    let _ = SCHEDSTAT.try_with(|_| ());
    let _ = WAKE_STAMPS.try_with(|s| {
        let mut s = s.borrow_mut();
        while s.len() < 2 {
            s.push(new_stamp());
        }
    });
}

/// The calling thread's CPU time and run delay, in nanoseconds.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ThreadTimes {
    pub(crate) cpu_ns: u64,
    pub(crate) run_delay_ns: u64,
}

impl ThreadTimes {
    /// Now: the CPU clock (`CLOCK_THREAD_CPUTIME_ID`, about 0.2 µs) and the run
    /// delay from `/proc/thread-self/schedstat` (its second field: time spent
    /// runnable on a run queue, final for a running thread reading its own; about
    /// 1 µs, through a file the thread keeps open). 0 where there is no such file.
    ///
    /// The run delay grows only while the thread is off CPU. When the thread's CPU
    /// clock has advanced as far as the wall clock since its last read, less than a
    /// millisecond ago, it was on CPU throughout and the run delay is the one read
    /// then: back-to-back hot polls of one task read the file once, not twice a poll.
    pub(crate) fn now() -> ThreadTimes {
        let cpu_ns = sys::thread_cpu_ns();
        let wall_ns = sys::monotonic_now_ns();
        let last = LAST_READ.get();
        let run_delay_ns = if last.still_holds(wall_ns, cpu_ns) {
            last.run_delay_ns
        } else {
            read_run_delay()
        };
        LAST_READ.set(LastRead {
            wall_ns,
            cpu_ns,
            run_delay_ns,
        });
        ThreadTimes {
            cpu_ns,
            run_delay_ns,
        }
    }

    pub(crate) fn since(self, before: ThreadTimes) -> ThreadTimes {
        ThreadTimes {
            cpu_ns: self.cpu_ns.saturating_sub(before.cpu_ns),
            run_delay_ns: self.run_delay_ns.saturating_sub(before.run_delay_ns),
        }
    }
}

thread_local! {
    /// This thread's `/proc/thread-self/schedstat`, opened at its first hot poll.
    static SCHEDSTAT: Option<std::fs::File> = std::fs::File::open("/proc/thread-self/schedstat").ok();
    /// This thread's clocks and run delay at its last [`ThreadTimes::now`].
    static LAST_READ: std::cell::Cell<LastRead> = const {
        std::cell::Cell::new(LastRead { wall_ns: 0, cpu_ns: 0, run_delay_ns: 0 })
    };
    /// Reads of this thread's schedstat file so far.
    static SCHEDSTAT_READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A thread's last [`ThreadTimes::now`]: the wall clock, its CPU clock and its run
/// delay then.
#[derive(Clone, Copy)]
struct LastRead {
    wall_ns: u64,
    cpu_ns: u64,
    run_delay_ns: u64,
}

impl LastRead {
    /// Whether the run delay read then still holds at `wall_ns`, `cpu_ns`: read less
    /// than [`REUSE_WITHIN_NS`] ago, and the thread on CPU since (its CPU clock kept
    /// pace with the wall clock).
    fn still_holds(self, wall_ns: u64, cpu_ns: u64) -> bool {
        if self.wall_ns == 0 {
            return false;
        }
        let wall = wall_ns.saturating_sub(self.wall_ns);
        let cpu = cpu_ns.saturating_sub(self.cpu_ns);
        // The two clocks are read one after the other: off CPU for less than the
        // slack is within their noise. Only a recent read is reused, so the slack
        // bounds what a reuse can miss.
        wall <= REUSE_WITHIN_NS && wall <= cpu + ON_CPU_SLACK_NS
    }
}

/// Time off CPU below which a thread counts as having stayed on it between two reads
/// of its clocks (the two `clock_gettime` calls apart; a preemption is milliseconds).
const ON_CPU_SLACK_NS: u64 = 2_000;

/// The run delay read last is reused only this soon after: back-to-back polls of one
/// task reuse it; a poll after other work, or a long one, reads the file (1 µs
/// against what the poll took).
const REUSE_WITHIN_NS: u64 = 1_000_000;

/// The calling thread's run delay, read from its schedstat file (0 without one).
fn read_run_delay() -> u64 {
    SCHEDSTAT_READS.with(|n| n.set(n.get() + 1));
    SCHEDSTAT.with(|f| {
        use std::os::unix::fs::FileExt;
        let Some(f) = f else { return 0 };
        let mut buf = [0u8; 96];
        let n = f.read_at(&mut buf, 0).unwrap_or(0);
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.split_ascii_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

/// The waker of a hot span's poll: records when the work was first woken after a
/// poll (runnable from then on), then wakes the poller's own waker.
#[derive(Debug)]
pub(crate) struct WakeStamp {
    /// Clock ticks of the first wake since the last poll began (0: none).
    pub(crate) at: AtomicU64,
    pub(crate) inner: Mutex<Option<Waker>>,
}

thread_local! {
    /// Wake stamps of finished hot work, for the next: a hot request allocates
    /// nothing once its thread has served a few.
    static WAKE_STAMPS: std::cell::RefCell<Vec<Arc<WakeStamp>>> =
        std::cell::RefCell::new(Vec::with_capacity(WAKE_STAMPS_KEPT));
}

fn new_stamp() -> Arc<WakeStamp> {
    Arc::new(WakeStamp {
        at: AtomicU64::new(0),
        inner: Mutex::new(None),
    })
}

/// Wake stamps a thread keeps for reuse.
const WAKE_STAMPS_KEPT: usize = 16;

impl WakeStamp {
    /// A stamp from this thread's spares, or a new one.
    pub(crate) fn take() -> Arc<WakeStamp> {
        WAKE_STAMPS
            .try_with(|s| s.borrow_mut().pop())
            .ok()
            .flatten()
            .unwrap_or_else(new_stamp)
    }

    /// Keeps `stamp` for this thread's next hot work if no waker made from it is
    /// still held (by a timer or a channel the work registered with).
    pub(crate) fn give_back(stamp: Arc<WakeStamp>) {
        if Arc::strong_count(&stamp) != 1 {
            return;
        }
        stamp.at.store(0, Ordering::Relaxed);
        // Its poller's waker goes now, not when the stamp is next used.
        let waker = stamp.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(waker);
        let _ = WAKE_STAMPS.try_with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < WAKE_STAMPS_KEPT {
                s.push(stamp);
            }
        });
    }

    fn stamp(&self) {
        let _ =
            self.at
                .compare_exchange(0, CLOCK.raw().max(1), Ordering::Relaxed, Ordering::Relaxed);
        if let Some(w) = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            w.wake_by_ref();
        }
    }
}

impl Wake for WakeStamp {
    fn wake(self: Arc<Self>) {
        self.stamp();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.stamp();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn reads() -> u64 {
        SCHEDSTAT_READS.with(std::cell::Cell::get)
    }

    /// Burns about `us` microseconds of this thread's CPU.
    fn burn(us: u64) {
        let end = sys::thread_cpu_ns() + us * 1000;
        let mut x = 0u64;
        while sys::thread_cpu_ns() < end {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
    }

    #[test]
    fn reads_on_a_thread_that_stayed_on_cpu_reuse_its_run_delay() {
        let _ = ThreadTimes::now();
        let before = reads();
        for _ in 0..20 {
            burn(50);
            let _ = ThreadTimes::now();
        }
        // 20 reads in about 1 ms of CPU: the OS may preempt the thread a few times,
        // each time costing one read of the file more.
        let n = reads() - before;
        assert!(
            n <= 5,
            "{n} schedstat reads for 20 reads of the thread's times"
        );
    }

    #[test]
    fn the_last_run_delay_holds_only_soon_after_and_with_the_thread_on_cpu() {
        let last = LastRead {
            wall_ns: 1_000_000_000,
            cpu_ns: 5_000_000,
            run_delay_ns: 7,
        };
        let at = |wall_us: u64, cpu_us: u64| {
            last.still_holds(last.wall_ns + wall_us * 1000, last.cpu_ns + cpu_us * 1000)
        };
        assert!(at(100, 100));
        assert!(at(100, 99));
        // Off CPU for 50 µs: the run delay may have grown.
        assert!(!at(100, 50));
        // On CPU throughout, but long after the read.
        assert!(!at(1_500, 1_500));
        assert!(!at(60_000_000, 60_000_000));
        // Nothing read yet.
        assert!(
            !LastRead {
                wall_ns: 0,
                cpu_ns: 0,
                run_delay_ns: 0
            }
            .still_holds(1, 1)
        );
    }

    #[test]
    fn a_thread_that_was_off_cpu_reads_its_run_delay_again() {
        let _ = ThreadTimes::now();
        let before = reads();
        std::thread::sleep(Duration::from_millis(2));
        let _ = ThreadTimes::now();
        assert_eq!(reads() - before, 1);
    }
}
