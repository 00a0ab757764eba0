//! The sampling state of one registered thread: its sample ring, its CPU timer,
//! its perf event and the counters the handler keeps.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::Mechanism;
use super::perf;
use super::ring::SampleRing;
use super::timer::CpuTimer;

/// The signal both the CPU timers and the perf events deliver.
pub(crate) const SIGNAL: i32 = libc::SIGPROF;

thread_local! {
    /// The sampler the calling thread's signal handler writes to ([`ThreadSampler::attach_current`]).
    static CURRENT: std::cell::Cell<*const ThreadSampler> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// The calling thread's sampler, null when the thread is not registered. A non-null
/// pointer is the thread's `Arc<ThreadSampler>`, kept alive by the registry until
/// after the thread detaches (which nulls it).
#[inline(always)]
pub(crate) fn current_sampler() -> *const ThreadSampler {
    CURRENT.with(|t| t.get())
}

/// Per-thread sampler state. Shared between the owning thread's signal handler, the
/// registry (arm/disarm under its lock) and the collector (drains the ring).
pub(crate) struct ThreadSampler {
    pub(crate) tid: libc::pid_t,
    pthread: libc::pthread_t,
    pub(crate) stack_lo: usize,
    pub(crate) stack_hi: usize,
    pub(crate) ring: SampleRing,
    /// The armed timer (the handler re-arms it in timer mode). Guarded for arm/disarm.
    timer: Mutex<Option<CpuTimer>>,
    pub(crate) timer_live: AtomicBool,
    pub(crate) timer_raw: AtomicUsize,
    pub(crate) timer_high: AtomicBool,
    /// The perf event's fd: [`PERF_NONE`] until the thread's first hot work opens
    /// it (`open_perf`), [`PERF_OPENING`] while that runs.
    pub(crate) perf_fd: AtomicI32,
    /// Whether the high rate is the perf event's (perf mode): set at arm, cleared at
    /// disarm and when opening the event fails (the thread then falls back to the
    /// timer). The event itself is opened at the first hot push, not at arm: an idle
    /// perf event attached to a thread costs every context switch of it (measured:
    /// 0.17 µs a switch here, 1.9 µs a request on the JSON API).
    pub(crate) perf_wanted: AtomicBool,
    pub(crate) perf_armed: AtomicBool,
    pub(crate) perf_since_tick: AtomicU32,
    pub(crate) baseline_ns: AtomicU64,
    pub(crate) high_ns: AtomicU64,
    /// Timer mode: the period the timer runs at now.
    pub(crate) current_period_ns: AtomicU64,
    /// Perf mode: the mean of the random interval the event is counting now (what
    /// its next sample stands for).
    pub(crate) perf_nominal_ns: AtomicU64,
    /// Perf mode: the mean for which the next interval was already set in the kernel
    /// while the event was off (0: none; the next arm sets one).
    pub(crate) perf_preset_ns: AtomicU64,
    /// Perf mode: the event was turned off by a hot span's end before its interval
    /// ran out (`on_hot_end`): its one-shot budget is unspent, so the next arm
    /// resumes it with ENABLE, not REFRESH (which would add to the budget).
    pub(crate) perf_paused: AtomicBool,
    /// Perf mode: the interval programmed at the last arm (or preset), ns.
    pub(crate) perf_interval_ns: AtomicU64,
    /// Perf mode: the thread's CPU time when the event was last armed, ns.
    pub(crate) perf_armed_at_ns: AtomicU64,
    /// Perf mode: average dead time of a hot sample (overflow to re-arm), ns.
    pub(crate) perf_dead_avg_ns: AtomicU64,
    /// Perf samples that landed in cold work and were dropped (the timer covers it).
    pub(crate) perf_cold: AtomicU64,
    /// xorshift64 state for the random intervals (only this thread uses it).
    pub(crate) rng: AtomicU64,
    pub(crate) samples: AtomicU64,
    pub(crate) superseded: AtomicU64,
    pub(crate) truncated: AtomicU64,
    /// Samples whose stack the DWARF unwinder could not follow to the thread's first
    /// frame.
    pub(crate) unrooted: AtomicU64,
    /// The DWARF unwinder's rule lookups (one per frame) and cache misses so far.
    pub(crate) unwind_lookups: AtomicU64,
    pub(crate) unwind_misses: AtomicU64,
    /// Samples of work whose span had ended (written as detached).
    pub(crate) detached: AtomicU64,
    pub(crate) rearm_failed: AtomicU64,
    pub(crate) retired: AtomicBool,
    /// The thread's wall-clock timer: [`WALL_NONE`] until its first hot poll creates
    /// it (`wall_begin`), [`WALL_OPENING`] while that runs, else its raw id.
    wall_timer: AtomicUsize,
    /// Hot polls under way on the thread (they nest); only the thread writes it.
    wall_depth: AtomicU32,
    /// Wall-clock samples written.
    pub(crate) wall_samples: AtomicU64,
}

// SAFETY: `pthread_t` is an integer handle; every other field is Sync.
unsafe impl Send for ThreadSampler {}
// SAFETY: as above.
unsafe impl Sync for ThreadSampler {}

impl std::fmt::Debug for ThreadSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadSampler")
            .field("tid", &self.tid)
            .finish_non_exhaustive()
    }
}

impl ThreadSampler {
    /// State for the calling thread with a ring of `ring_capacity` samples.
    pub(crate) fn for_current_thread(ring_capacity: usize) -> Arc<Self> {
        // SAFETY: gettid and pthread_self have no preconditions.
        let (tid, pthread) = unsafe { (libc::gettid(), libc::pthread_self()) };
        let (stack_lo, stack_hi) = super::unwind::current_stack_bounds().unwrap_or((0, 0));
        Arc::new(ThreadSampler {
            tid,
            pthread,
            stack_lo,
            stack_hi,
            ring: SampleRing::new(ring_capacity),
            timer: Mutex::new(None),
            timer_live: AtomicBool::new(false),
            timer_raw: AtomicUsize::new(0),
            timer_high: AtomicBool::new(false),
            perf_fd: AtomicI32::new(PERF_NONE),
            perf_wanted: AtomicBool::new(false),
            perf_armed: AtomicBool::new(false),
            perf_since_tick: AtomicU32::new(0),
            baseline_ns: AtomicU64::new(0),
            high_ns: AtomicU64::new(0),
            current_period_ns: AtomicU64::new(0),
            perf_nominal_ns: AtomicU64::new(0),
            perf_preset_ns: AtomicU64::new(0),
            perf_paused: AtomicBool::new(false),
            perf_interval_ns: AtomicU64::new(0),
            perf_armed_at_ns: AtomicU64::new(0),
            perf_dead_avg_ns: AtomicU64::new(0),
            perf_cold: AtomicU64::new(0),
            // Any non-zero seed; the thread id and the clock keep threads apart.
            rng: AtomicU64::new(
                (u64::from(tid as u32) << 32
                    ^ super::monotonic_now_ns().wrapping_mul(0x9e37_79b9_7f4a_7c15))
                    | 1,
            ),
            samples: AtomicU64::new(0),
            superseded: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            unrooted: AtomicU64::new(0),
            unwind_lookups: AtomicU64::new(0),
            unwind_misses: AtomicU64::new(0),
            detached: AtomicU64::new(0),
            rearm_failed: AtomicU64::new(0),
            retired: AtomicBool::new(false),
            wall_timer: AtomicUsize::new(WALL_NONE),
            wall_depth: AtomicU32::new(0),
            wall_samples: AtomicU64::new(0),
        })
    }

    /// Makes this the sampler the calling thread's signal handler writes to. Must be
    /// called on the thread this state was made for.
    pub(crate) fn attach_current(self: &Arc<Self>) {
        CURRENT.with(|t| t.set(Arc::as_ptr(self)));
    }

    /// Stops the calling thread's handler from using any sampler.
    pub(crate) fn detach_current() {
        CURRENT.with(|t| t.set(std::ptr::null()));
    }

    /// Arms the thread: a CPU timer at the baseline period and, when `use_perf`, perf
    /// mode (its perf event is opened at the thread's first hot work, `open_perf`).
    /// Returns the mechanism in force. Callers serialise arm/disarm (the registry
    /// lock).
    pub(crate) fn arm(
        &self,
        baseline_ns: u64,
        high_ns: u64,
        use_perf: bool,
    ) -> io::Result<Mechanism> {
        self.disarm();
        self.baseline_ns.store(baseline_ns, Ordering::Relaxed);
        self.high_ns.store(high_ns, Ordering::Relaxed);
        self.timer_high.store(false, Ordering::Relaxed);
        self.perf_armed.store(false, Ordering::Relaxed);
        let mut mechanism = Mechanism::Timer;
        self.current_period_ns.store(baseline_ns, Ordering::Relaxed);
        self.perf_nominal_ns.store(high_ns, Ordering::Relaxed);
        self.perf_preset_ns.store(0, Ordering::Relaxed);
        self.perf_paused.store(false, Ordering::Relaxed);
        self.perf_interval_ns.store(high_ns, Ordering::Relaxed);
        if use_perf {
            self.perf_wanted.store(true, Ordering::Release);
            mechanism = Mechanism::PerfEvent;
        }
        let timer = CpuTimer::create(self.pthread, self.tid, SIGNAL)?;
        self.timer_raw.store(timer.raw(), Ordering::Relaxed);
        self.timer_live.store(true, Ordering::Release);
        if !timer.set_period(baseline_ns) {
            let err = io::Error::last_os_error();
            self.timer_live.store(false, Ordering::Release);
            timer.delete();
            return Err(err);
        }
        *self.timer.lock().unwrap_or_else(|e| e.into_inner()) = Some(timer);
        Ok(mechanism)
    }

    /// Stops sampling this thread: deletes the timer and closes the perf event (one
    /// being opened on the thread meanwhile is closed by its opener, `open_perf`).
    pub(crate) fn disarm(&self) {
        self.timer_live.store(false, Ordering::Release);
        if let Some(t) = self.timer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.delete();
        }
        self.perf_wanted.store(false, Ordering::Release);
        let fd = self.perf_fd.swap(PERF_NONE, Ordering::AcqRel);
        if fd >= 0 {
            perf::disable(fd);
            perf::close(fd);
        }
        self.perf_armed.store(false, Ordering::Relaxed);
        let wall = self.wall_timer.swap(WALL_NONE, Ordering::AcqRel);
        if wall < WALL_OPENING {
            CpuTimer::from_raw(wall).delete();
        }
    }

    /// Starts wall-clock sampling of the calling thread (this sampler's own) for a
    /// hot poll: its `CLOCK_MONOTONIC` timer, created at the first call, fires every
    /// `period_ns`, the first time after a random part of a period, so polls shorter
    /// than a period are sampled in proportion to their length. Polls nest: only
    /// the outermost arms; each call is matched by one [`ThreadSampler::wall_end`].
    /// A timer that cannot be created is counted as a failed arm and not tried again
    /// until the thread is armed again.
    pub(crate) fn wall_begin(&self, period_ns: u64) {
        let depth = self.wall_depth.load(Ordering::Relaxed);
        self.wall_depth.store(depth + 1, Ordering::Relaxed);
        if depth > 0 {
            return;
        }
        if let Some(timer) = self.wall_timer() {
            let first = 1 + self.next_random() % period_ns.max(1);
            timer.set(first, period_ns);
        }
    }

    /// The next value of the thread's xorshift64 generator (never 0). Signal-safe; a
    /// signal between its load and store costs a repeated value, nothing more.
    #[inline(always)]
    pub(crate) fn next_random(&self) -> u64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        x
    }

    /// Ends a hot poll begun with [`ThreadSampler::wall_begin`]: the outermost one
    /// stops the timer.
    pub(crate) fn wall_end(&self) {
        let depth = self.wall_depth.load(Ordering::Relaxed);
        self.wall_depth
            .store(depth.saturating_sub(1), Ordering::Relaxed);
        if depth == 1 {
            let raw = self.wall_timer.load(Ordering::Acquire);
            if raw < WALL_OPENING {
                CpuTimer::from_raw(raw).set(0, 0);
            }
        }
    }

    /// The thread's wall-clock timer, created now if it has none.
    fn wall_timer(&self) -> Option<CpuTimer> {
        let raw = self.wall_timer.load(Ordering::Acquire);
        if raw < WALL_OPENING {
            return Some(CpuTimer::from_raw(raw));
        }
        if raw == WALL_OPENING
            || self
                .wall_timer
                .compare_exchange(
                    WALL_NONE,
                    WALL_OPENING,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return None;
        }
        match CpuTimer::create_wall(self.tid, SIGNAL, WALL_TAG) {
            Ok(timer) => {
                if self
                    .wall_timer
                    .compare_exchange(
                        WALL_OPENING,
                        timer.raw(),
                        Ordering::Release,
                        Ordering::Relaxed,
                    )
                    .is_err()
                {
                    // Disarmed while creating.
                    timer.delete();
                    return None;
                }
                Some(timer)
            }
            Err(_) => {
                self.rearm_failed.fetch_add(1, Ordering::Relaxed);
                // Left at WALL_OPENING: the thread does not try again.
                None
            }
        }
    }
}

/// [`ThreadSampler::wall_timer`]: no timer yet.
const WALL_NONE: usize = usize::MAX;
/// [`ThreadSampler::wall_timer`]: being created, or could not be.
const WALL_OPENING: usize = usize::MAX - 1;
/// The signal value of wall-clock timer expiries (the CPU timer's is 0).
pub(crate) const WALL_TAG: usize = 0x5741_4c4c; // "WALL"

/// [`ThreadSampler::perf_fd`]: no event open.
pub(crate) const PERF_NONE: i32 = -1;
/// [`ThreadSampler::perf_fd`]: the thread is opening its event.
pub(crate) const PERF_OPENING: i32 = -2;

impl ThreadSampler {
    /// Whether the high rate is the perf event's (opened or to be opened).
    #[inline(always)]
    pub(crate) fn perf_mode(&self) -> bool {
        self.perf_fd.load(Ordering::Relaxed) >= 0 || self.perf_wanted.load(Ordering::Relaxed)
    }

    /// The thread's perf event, opened now if perf mode wants one and none is open:
    /// on the thread itself, at its first hot work (the poll path's hot push, or the
    /// signal handler promoting a slow poll: `perf_event_open` and `fcntl` are
    /// system calls, safe in a signal handler). Returns the fd, or a negative value
    /// when there is none (an open in progress that this call interrupted; a refused
    /// open, after which the thread samples hot work with the timer).
    pub(crate) fn open_perf(&self) -> i32 {
        let fd = self.perf_fd.load(Ordering::Acquire);
        if fd != PERF_NONE || !self.perf_wanted.load(Ordering::Acquire) {
            return fd;
        }
        if self
            .perf_fd
            .compare_exchange(
                PERF_NONE,
                PERF_OPENING,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return self.perf_fd.load(Ordering::Acquire);
        }
        match perf::open(self.tid, self.high_ns.load(Ordering::Relaxed), SIGNAL) {
            Ok(fd) => {
                if self
                    .perf_fd
                    .compare_exchange(PERF_OPENING, fd, Ordering::Release, Ordering::Relaxed)
                    .is_err()
                {
                    // Disarmed while opening.
                    perf::close(fd);
                    return PERF_NONE;
                }
                fd
            }
            Err(_) => {
                // Counted as a failed arm of the high rate; the thread samples hot
                // work with the timer from now on.
                self.rearm_failed.fetch_add(1, Ordering::Relaxed);
                self.perf_wanted.store(false, Ordering::Release);
                let _ = self.perf_fd.compare_exchange(
                    PERF_OPENING,
                    PERF_NONE,
                    Ordering::Release,
                    Ordering::Relaxed,
                );
                PERF_NONE
            }
        }
    }
}

impl Drop for ThreadSampler {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// Whether this process may open per-thread perf events: opens one, never
/// enabled, on the calling thread and returns it. Hold it while the profiler runs.
/// The kernel enables its perf scheduling hooks when the system's first per-thread
/// event opens, waiting for an RCU grace period (milliseconds) to do so, and
/// disables them a second after the last one closes. Holding one keeps the hooks
/// on, so a thread's first hot poll, which opens that thread's event, never waits
/// for a grace period.
pub(crate) fn probe_perf_events() -> Result<OwnedFd, io::Error> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let fd = perf::open(tid, 1_000_000, SIGNAL)?;
    // SAFETY: `fd` was just opened by `perf::open` and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
