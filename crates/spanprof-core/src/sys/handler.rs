//! The `SIGPROF` handler: reads the label slot, unwinds, writes one sample.
//!
//! Async-signal-safe by construction: it touches only thread-locals initialised at
//! compile time, atomics, the preallocated ring of its own thread, and the
//! async-signal-safe calls `clock_gettime`, `timer_settime`, `ioctl` and `futex`
//! (waking the drain thread when the ring is half full, `sys/wake.rs`). No
//! allocation, no lock, no panic (every index is bounds-checked by construction and
//! the arithmetic saturates), and errno is saved and restored.

#[cfg(feature = "testing")]
use std::cell::Cell;
use std::io;
use std::ptr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::record::{ENDED, HOT_BITS, LabelIds, LabelRecord, SAMPLED};
use super::ring::{FLAG_LABELLED, FLAG_PERF, FLAG_TRUNCATED, FLAG_WALL};
use super::thread::{SIGNAL, ThreadSampler, WALL_TAG, current_sampler};
use super::timer::CpuTimer;
use super::{perf, slot, unwind};

#[cfg(feature = "testing")]
thread_local! {
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
}

static ENABLED: AtomicBool = AtomicBool::new(false);
/// The period of wall-clock samples of hot polls, ns (0: off).
static WALL_PERIOD_NS: AtomicU64 = AtomicU64::new(0);
static INSTALLED: Mutex<Option<libc::sigaction>> = Mutex::new(None);

/// Whether the calling thread is inside the profiling signal handler right now (for
/// tests that prove the handler never allocates).
#[cfg(feature = "testing")]
pub(crate) fn in_signal_handler() -> bool {
    IN_HANDLER.with(|c| c.get())
}

/// Sets the period of wall-clock samples of hot polls (0 turns them off).
pub(crate) fn set_wall_period(ns: u64) {
    WALL_PERIOD_NS.store(ns, Ordering::Relaxed);
}

/// The period of wall-clock samples of hot polls, ns (0: off).
#[inline(always)]
pub(crate) fn wall_period() -> u64 {
    WALL_PERIOD_NS.load(Ordering::Relaxed)
}

/// Turns sample recording on or off process-wide.
pub(crate) fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Release);
}

/// Installs the handler (idempotent), remembering the previous action.
pub(crate) fn install_handler() -> io::Result<()> {
    let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if installed.is_some() {
        return Ok(());
    }
    // SAFETY: we build a valid sigaction (handler with the SA_SIGINFO signature, an
    // empty mask) and pass valid pointers; `old` receives the previous action.
    unsafe {
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = on_signal as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut new.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(SIGNAL, &new, &mut old) != 0 {
            return Err(io::Error::last_os_error());
        }
        *installed = Some(old);
    }
    Ok(())
}

/// Restores the action that was in place before [`install_handler`]. Signals still
/// pending from disarmed timers are discarded first (by passing through `SIG_IGN`),
/// so restoring a default action cannot kill the process.
pub(crate) fn uninstall_handler() {
    let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(old) = installed.take() {
        // SAFETY: valid sigaction values and pointers. Setting SIG_IGN discards any
        // pending SIGPROF (POSIX), then the saved action goes back.
        unsafe {
            let mut ign: libc::sigaction = std::mem::zeroed();
            ign.sa_sigaction = libc::SIG_IGN;
            libc::sigaction(SIGNAL, &ign, ptr::null_mut());
            libc::sigaction(SIGNAL, &old, ptr::null_mut());
        }
    }
}

/// Called on the poll path when hot labels are pushed: brings the calling thread to
/// the high rate now rather than at its next baseline sample. One `ioctl` (or
/// `timer_settime`) per transition into hot work, nothing when already high.
#[cold]
pub(crate) fn on_hot_push(label_high_ns: u64) {
    let ts = current_sampler();
    if ts.is_null() || !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: a non-null `current_sampler()` pointer is the `Arc<ThreadSampler>` of this thread,
    // kept alive by the registry until after the thread detaches (nulls THREAD).
    let ts = unsafe { &*ts };
    go_high(ts, label_high_ns);
}

/// Called when hot work's span ends on this thread: stops the thread's perf event
/// unless the work in its slot is still hot. Left armed, the event fires once more in
/// whatever cold work the thread runs next, a signal and a re-arm (about 30 µs on a
/// KVM guest) that the handler can only drop: the overhead benchmark's `hot10` server
/// took 0.7 of them per hot request. Costs one `ioctl` and one thread CPU clock
/// read, only when the event is armed.
///
/// The event is *paused*: the kernel keeps what is left of its interval, and the
/// next hot push resumes it with `ENABLE` (`go_high`), so the CPU of successive hot
/// spans adds up toward one random interval however short each span is (drawing
/// afresh at each arm would never sample work shorter than
/// [`MIN_PERF_INTERVAL_NS`]), and the sample that ends it keeps the mean it was drawn
/// with. The one-shot budget is unspent while paused, which is why the resume must
/// not `REFRESH`: that would add to it, and the event would stop turning itself off
/// at its overflows. If an overflow came first, its signal has been handled as cold
/// by the time the `ioctl` returns (the kernel delivers it then at the latest): the
/// event is off with its budget spent and the next interval drawn, and nothing is
/// paused. A slow promotion by a tick in between (the handler arming the event just
/// before it is stopped here) leaves it off while marked armed, until the next tick
/// finds no perf sample and re-arms it.
#[cold]
pub(crate) fn on_hot_end() {
    let ts = current_sampler();
    if ts.is_null() {
        return;
    }
    // SAFETY: as in `on_hot_push`.
    let ts = unsafe { &*ts };
    let fd = ts.perf_fd.load(Ordering::Acquire);
    if fd < 0 || !ts.perf_armed.load(Ordering::Relaxed) {
        return;
    }
    let current = slot::current_ptr();
    // SAFETY: a non-null slot value on this thread is a record its pusher keeps a
    // strong reference to until it restores the slot, later on this thread (see
    // `slot::current`).
    if !current.is_null() && unsafe { &*current }.is_hot() {
        return;
    }
    let cold_before = ts.perf_cold.load(Ordering::Relaxed);
    ts.perf_armed.store(false, Ordering::Relaxed);
    perf::disable(fd);
    if ts.perf_cold.load(Ordering::Relaxed) != cold_before {
        return;
    }
    // Paused. What is left of the interval, for the next sample's dead-time
    // estimate: the event has counted this thread's CPU since it was armed.
    let counted =
        super::thread_cpu_ns().saturating_sub(ts.perf_armed_at_ns.load(Ordering::Relaxed));
    let left = ts
        .perf_interval_ns
        .load(Ordering::Relaxed)
        .saturating_sub(counted);
    ts.perf_interval_ns.store(left, Ordering::Relaxed);
    ts.perf_paused.store(true, Ordering::Relaxed);
}

/// The high period for work whose labels ask for `label_high_ns` (0: the profiler's).
#[inline(always)]
fn high_period(ts: &ThreadSampler, label_high_ns: u64) -> u64 {
    if label_high_ns != 0 {
        label_high_ns
    } else {
        ts.high_ns.load(Ordering::Relaxed)
    }
}

/// Brings the thread to the high rate of the hot work in its slot: arms the perf event
/// or, in timer mode, re-arms the timer at the high period.
///
/// The perf event samples hot work as a Poisson process: every interval is drawn
/// from an exponential distribution whose mean is the high period, and each sample
/// stands for that mean. Memorylessness is what makes the estimate right whatever
/// the poll lengths: the event may be armed at any hot push and dropped at any sample
/// that lands in cold work (which the baseline timer covers) without biasing the
/// hot work's estimate. A fixed period re-armed at each hot push instead lands at
/// the same offset into every hot poll, and locks onto cold work when polls are
/// shorter than the period.
#[inline(always)]
fn go_high(ts: &ThreadSampler, label_high_ns: u64) {
    let period = high_period(ts, label_high_ns);
    let fd = ts.open_perf();
    if fd >= 0 {
        if ts
            .perf_armed
            .compare_exchange(false, true, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            // Grace: the next timer tick must not take the fresh event for a lost one.
            ts.perf_since_tick.store(1, Ordering::Relaxed);
            // A paused event resumes the interval it was counting, with the mean it
            // was drawn with (`on_hot_end`). Otherwise the handler that disarmed the
            // event drew the next interval already (for the profiler's high period);
            // draw one here only for another rate.
            let paused = ts.perf_paused.swap(false, Ordering::Relaxed);
            if ts.perf_preset_ns.swap(0, Ordering::Relaxed) != period && !paused {
                let interval = exp_interval(ts, period).max(MIN_PERF_INTERVAL_NS);
                perf::set_period(fd, interval);
                ts.perf_interval_ns.store(interval, Ordering::Relaxed);
                ts.perf_nominal_ns.store(period, Ordering::Relaxed);
            }
            // ENABLE keeps the one-shot budget a pause left unspent; REFRESH gives a
            // spent one back. Either way the event turns itself off at its overflow.
            let armed = if paused {
                perf::enable(fd)
            } else {
                perf::refresh(fd)
            };
            if armed {
                ts.perf_armed_at_ns
                    .store(super::thread_cpu_ns(), Ordering::Relaxed);
            } else {
                ts.perf_armed.store(false, Ordering::Relaxed);
                ts.rearm_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    } else if !ts.perf_mode()
        && ts.timer_live.load(Ordering::Acquire)
        && (!ts.timer_high.swap(true, Ordering::Relaxed)
            || ts.current_period_ns.load(Ordering::Relaxed) != period)
    {
        ts.current_period_ns.store(period, Ordering::Relaxed);
        CpuTimer::from_raw(ts.timer_raw.load(Ordering::Relaxed)).set_period(period);
    }
}

/// An exponentially distributed interval with mean `mean_ns` (clamped to
/// `[mean/64, 8 mean]`, which moves the mean by less than 0.05 %), from the
/// thread's own xorshift generator. Signal-safe: integer and float arithmetic only.
#[inline(always)]
fn exp_interval(ts: &ThreadSampler, mean_ns: u64) -> u64 {
    let x = ts.next_random();
    // A uniform in (0, 1] from the top 53 bits of xorshift64*.
    let u = ((x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) + 1) as f64 / (1u64 << 53) as f64;
    let v = -ln_unit(u) * mean_ns as f64;
    (v as u64).clamp((mean_ns / 64).max(1), mean_ns.saturating_mul(8))
}

/// `ln(u)` for `u` in (0, 1], without libm: `u = m * 2^e` with `m` in [1, 2), and
/// `ln(m) = 2 atanh((m - 1) / (m + 1))` by its series (error below 1e-6).
#[inline(always)]
fn ln_unit(u: f64) -> f64 {
    let bits = u.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
    let z = (m - 1.0) / (m + 1.0);
    let z2 = z * z;
    let series = z
        * (2.0
            + z2 * (2.0 / 3.0
                + z2 * (2.0 / 5.0 + z2 * (2.0 / 7.0 + z2 * (2.0 / 9.0 + z2 * (2.0 / 11.0))))));
    e as f64 * std::f64::consts::LN_2 + series
}

/// Rate control for a perf event sample. Returns the sample's weight, or `None` when
/// it landed in cold work: the baseline timer covers that, so the sample is dropped
/// and the event stays off until the next hot push, with its next random interval
/// set now (an `ioctl` here rather than on the poll path).
///
/// A hot sample stands for the mean interval, plus the *dead time* measured since the
/// last arm: from the overflow to the re-arm below the event is off (the kernel
/// delivers the signal, this handler runs, about 30 µs on a KVM guest) while the
/// sampled work is charged for that CPU. Thread CPU time since the last arm, less the
/// interval programmed then, is that dead time; an overflow the kernel skipped because
/// it came in kernel mode shows up there too and is made up the same way.
#[inline(always)]
fn perf_sample(ts: &ThreadSampler, hot: bool, label_high_ns: u64) -> Option<u64> {
    ts.perf_since_tick.fetch_add(1, Ordering::Relaxed);
    let fd = ts.perf_fd.load(Ordering::Acquire);
    let nominal_ns = ts.perf_nominal_ns.load(Ordering::Relaxed);
    if fd < 0 {
        return Some(nominal_ns);
    }
    if !hot {
        ts.perf_armed.store(false, Ordering::Relaxed);
        let period = ts.high_ns.load(Ordering::Relaxed);
        let interval = exp_interval(ts, period).max(MIN_PERF_INTERVAL_NS);
        if perf::set_period(fd, interval) {
            ts.perf_interval_ns.store(interval, Ordering::Relaxed);
            ts.perf_nominal_ns.store(period, Ordering::Relaxed);
            ts.perf_preset_ns.store(period, Ordering::Relaxed);
        }
        ts.perf_cold.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    let period = high_period(ts, label_high_ns);
    let last_interval = ts.perf_interval_ns.load(Ordering::Relaxed);
    // The next overflow is at least MIN_PERF_INTERVAL_NS away. The Poisson process
    // runs from here at a mean of the period less that floor and less this thread's
    // usual dead time (so that samples still come at the rate asked for), and its
    // points that fall inside the floor are folded into this sample: the work right
    // after the re-arm is the work sampled now.
    let dead_avg = ts.perf_dead_avg_ns.load(Ordering::Relaxed);
    let mean = period
        .saturating_sub(MIN_PERF_INTERVAL_NS + dead_avg)
        .max(MIN_PERF_INTERVAL_NS);
    let mut interval = exp_interval(ts, mean);
    let mut folded = 0u64;
    while interval < MIN_PERF_INTERVAL_NS && folded < 64 {
        folded += 1;
        interval += exp_interval(ts, mean);
    }
    if perf::set_period(fd, interval) {
        ts.perf_interval_ns.store(interval, Ordering::Relaxed);
    }
    ts.perf_nominal_ns.store(mean, Ordering::Relaxed);
    if !perf::refresh(fd) {
        ts.perf_armed.store(false, Ordering::Relaxed);
        ts.rearm_failed.fetch_add(1, Ordering::Relaxed);
        return Some(nominal_ns);
    }
    let now = super::thread_cpu_ns();
    let armed_at = ts.perf_armed_at_ns.swap(now, Ordering::Relaxed);
    let dead_ns = now
        .saturating_sub(armed_at)
        .saturating_sub(last_interval)
        .min(nominal_ns.saturating_mul(8));
    // Exponentially weighted (1/8) average, for the next interval's mean.
    ts.perf_dead_avg_ns.store(
        (dead_avg * 7 + dead_ns.min(period / 2)) / 8,
        Ordering::Relaxed,
    );
    Some(nominal_ns.saturating_mul(1 + folded) + dead_ns)
}

/// The shortest interval programmed. Shorter ones can expire before the re-arm's
/// system call has returned to user space; the kernel skips an overflow in kernel
/// mode and re-fires one interval later, so a 10 µs interval on a guest whose timer
/// interrupt costs more than that stormed (a measured 2.7 ms of CPU in one re-arm
/// under load). At arm (from idle, on the poll path) a shorter draw is delayed to it.
const MIN_PERF_INTERVAL_NS: u64 = 50_000;

/// Rate control for a CPU timer tick covering `periods` periods. Returns the
/// sample's weight, or `None` when the perf event covers this (hot) time.
#[inline(always)]
fn timer_sample(ts: &ThreadSampler, hot: bool, label_high_ns: u64, periods: u64) -> Option<u64> {
    if ts.perf_mode() {
        // Perf mode: the timer runs at the baseline all the time and covers cold work;
        // hot work is the perf event's while it is armed.
        if hot && ts.perf_armed.load(Ordering::Relaxed) {
            ts.superseded.fetch_add(1, Ordering::Relaxed);
            if ts.perf_since_tick.swap(0, Ordering::Relaxed) == 0 {
                // No perf sample since the last tick: its signal may have been lost
                // (coalesced with a pending tick). Re-arm with a fresh interval: if it
                // was not lost, that only restarts a memoryless interval.
                ts.perf_armed.store(false, Ordering::Relaxed);
                ts.perf_preset_ns.store(0, Ordering::Relaxed);
                go_high(ts, label_high_ns);
            }
            return None;
        }
        if hot {
            go_high(ts, label_high_ns);
        }
        Some(
            ts.baseline_ns
                .load(Ordering::Relaxed)
                .saturating_mul(periods),
        )
    } else {
        // Timer mode: the timer itself runs at the baseline or the high period.
        let period = ts.current_period_ns.load(Ordering::Relaxed);
        if hot {
            go_high(ts, label_high_ns);
        } else if ts.timer_high.load(Ordering::Relaxed) && ts.timer_live.load(Ordering::Acquire) {
            ts.timer_high.store(false, Ordering::Relaxed);
            let base = ts.baseline_ns.load(Ordering::Relaxed);
            ts.current_period_ns.store(base, Ordering::Relaxed);
            CpuTimer::from_raw(ts.timer_raw.load(Ordering::Relaxed)).set_period(base);
        }
        Some(period.saturating_mul(periods))
    }
}

/// The Linux `siginfo_t` prefix for timer signals: `si_overrun` follows the timer id.
#[repr(C)]
struct SigInfoTimer {
    signo: i32,
    errno: i32,
    code: i32,
    _pad: i32,
    timer_id: i32,
    overrun: i32,
    /// The timer's `sigev_value` ([`WALL_TAG`] for the wall-clock timer, 0 for the
    /// CPU timer).
    value: usize,
}

extern "C" fn on_signal(_sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno slot; always valid.
    let errno = unsafe { *libc::__errno_location() };
    #[cfg(feature = "testing")]
    IN_HANDLER.with(|c| c.set(true));
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler.
    unsafe { handle(info as *const SigInfoTimer, uctx) };
    #[cfg(feature = "testing")]
    IN_HANDLER.with(|c| c.set(false));
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// # Safety
/// Only from `on_signal`, with the kernel's `info` and `uctx`.
#[inline(always)]
unsafe fn handle(info: *const SigInfoTimer, uctx: *mut libc::c_void) {
    let ts = current_sampler();
    if ts.is_null() || !ENABLED.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: see `on_hot_push`: THREAD is non-null only while the registry keeps the
    // sampler alive, and only this thread reads it.
    let ts = unsafe { &*ts };
    // SAFETY: `info` is the kernel's siginfo (caller's guarantee).
    let Some(from_perf) = (unsafe { from_perf(info) }) else {
        return; // kill(), sigqueue(): not ours.
    };
    // SAFETY: SI_TIMER: the timer member of the union is the live one.
    if !from_perf && unsafe { (*info).value } == WALL_TAG {
        // SAFETY: the caller's guarantees, passed on.
        unsafe { wall_sample(ts, info, uctx) };
        return;
    }
    // clock_gettime is async-signal-safe.
    let time_ns = super::monotonic_now_ns();
    let rec = slot::current_ptr();
    // SAFETY: a non-null slot pointer is a live `LabelRecord`: its pusher holds a
    // strong reference until it restores the slot, which cannot happen while we
    // interrupt it (the hooks defer a release at terminate to after the poll).
    let rec = unsafe { rec.as_ref() };
    let (ended, hot) = rec.map_or((false, 0), |r| hotness_at(r, time_ns));

    // Rate control: whether this signal makes a sample, and its weight.
    let label_high_ns = rec.map_or(0, |r| r.high_ns);
    let mut flags = 0;
    let weight_ns = if from_perf {
        flags |= FLAG_PERF;
        perf_sample(ts, hot != 0, label_high_ns)
    } else {
        // SAFETY: SI_TIMER: the timer member of the union is the live one.
        let overrun = unsafe { (*info).overrun }.max(0) as u64;
        timer_sample(ts, hot != 0, label_high_ns, 1 + overrun)
    };
    let Some(weight_ns) = weight_ns else { return };

    // Recording: the stack and the labels into the ring, the counts onto the labels.
    let labels = rec.map(|r| (r, ended, hot));
    // SAFETY: the caller's guarantees, passed on.
    if unsafe { record(ts, uctx, labels, weight_ns, time_ns, flags) } {
        count_sample(ts, rec, ended, weight_ns);
    }
}

/// Writes one sample into the thread's ring: the interrupted stack, the labels of
/// `labels` (the record, whether it has ended: written as detached then, and its
/// hotness), the weight, the time and `flags`. Wakes the drain thread when the ring
/// is half full (the one system call here, once per half ring). Returns whether the
/// sample was written (the ring had room).
///
/// # Safety
/// Only from the signal handler, on the thread `ts` was made for, with the kernel's
/// `uctx` for this signal.
#[inline(always)]
unsafe fn record(
    ts: &ThreadSampler,
    uctx: *mut libc::c_void,
    labels: Option<(&LabelRecord, bool, u8)>,
    weight_ns: u64,
    time_ns: u64,
    mut flags: u32,
) -> bool {
    // SAFETY: `uctx` is the kernel's ucontext for this signal (caller's guarantee).
    let regs = unsafe { unwind::regs(uctx) };
    let written = ts.ring.write(|s| {
        // SAFETY: `ts` is this thread's sampler and we run in its signal handler.
        let (depth, truncated) = unsafe { unwind_stack(ts, &regs, &mut s.frames) };
        s.depth = depth as u32;
        if truncated {
            flags |= FLAG_TRUNCATED;
            ts.truncated.fetch_add(1, Ordering::Relaxed);
        }
        if let Some((r, ended, hot)) = labels {
            flags |= FLAG_LABELLED;
            if ended {
                s.ids = LabelIds::detached(r.ids.route);
            } else {
                s.ids = r.ids;
                s.hot = hot;
            }
        }
        s.weight_ns = weight_ns;
        s.time_ns = time_ns;
        s.flags = flags;
        s.outer_span = slot::outer_span();
    });
    let Some(waiting) = written else {
        return false;
    };
    // Half full: wake the drain thread rather than wait for its interval.
    if waiting == ts.ring.half() {
        super::wake::request_drain();
    }
    true
}

/// A wall-clock sample of a hot poll: the stack wherever the thread is, on CPU or
/// blocked in a system call, weighted by the wall-clock period; it counts as no CPU
/// (the span's CPU figures come from CPU samples only).
///
/// # Safety
/// Only from `handle`, with the kernel's `info` (an SI_TIMER siginfo) and `uctx`.
#[inline(never)]
unsafe fn wall_sample(ts: &ThreadSampler, info: *const SigInfoTimer, uctx: *mut libc::c_void) {
    let period = wall_period();
    if period == 0 {
        return;
    }
    let time_ns = super::monotonic_now_ns();
    // SAFETY: as in `handle`: a non-null slot pointer is a live `LabelRecord`.
    let Some(rec) = (unsafe { slot::current_ptr().as_ref() }) else {
        return; // Between polls: the timer is being stopped.
    };
    let (ended, hot) = hotness_at(rec, time_ns);
    if ended {
        return;
    }
    // SAFETY: SI_TIMER: the timer member of the union is the live one.
    let overrun = unsafe { (*info).overrun }.max(0) as u64;
    let weight_ns = period.saturating_mul(1 + overrun);
    // SAFETY: the caller's guarantees, passed on.
    if unsafe {
        record(
            ts,
            uctx,
            Some((rec, false, hot)),
            weight_ns,
            time_ns,
            FLAG_WALL,
        )
    } {
        ts.wall_samples.fetch_add(1, Ordering::Relaxed);
        for r in std::iter::once(rec).chain(rec.root.as_deref()) {
            mark_sampled(r);
        }
    }
}

/// Unwinds the interrupted context into `out`: with the DWARF call-frame information
/// of the loaded modules once it is published (x86_64) and a cache of the pool is
/// free, else by frame pointers.
/// Returns the depth and whether the stack was cut at [`super::MAX_FRAMES`].
///
/// # Safety
/// Only from the signal handler, on the thread `ts` was made for.
#[inline(always)]
unsafe fn unwind_stack(
    ts: &ThreadSampler,
    regs: &unwind::Regs,
    out: &mut [u64; super::MAX_FRAMES],
) -> (usize, bool) {
    #[cfg(target_arch = "x86_64")]
    if let Some(map) = super::dwarf::in_use()
        && let Some(mut held) = super::dwarf::HeldCache::take(ts.tid as usize)
    {
        // SAFETY: [stack_lo, stack_hi) are this thread's stack bounds, read at
        // registration on this thread, and we run on this thread.
        let walk =
            unsafe { super::dwarf::walk(map, regs, ts.stack_lo, ts.stack_hi, held.cache(), out) };
        drop(held);
        ts.unwind_lookups.fetch_add(walk.lookups, Ordering::Relaxed);
        ts.unwind_misses.fetch_add(walk.misses, Ordering::Relaxed);
        if !walk.rooted && !walk.truncated {
            ts.unrooted.fetch_add(1, Ordering::Relaxed);
        }
        return (walk.depth, walk.truncated);
    }
    // SAFETY: as for the DWARF walk above.
    unsafe { unwind::walk(regs, ts.stack_lo, ts.stack_hi, out) }
}

/// Which timer sent the signal: `Some(true)` for a perf_event overflow, `Some(false)`
/// for the POSIX CPU-time timer, `None` for a signal sent by a process.
///
/// # Safety
///
/// `info` is the kernel's siginfo for this signal.
#[inline(always)]
unsafe fn from_perf(info: *const SigInfoTimer) -> Option<bool> {
    // SAFETY: `si_code` is in the common prefix of every siginfo (caller's guarantee).
    let code = unsafe { (*info).code };
    if code == libc::SI_TIMER {
        Some(false)
    } else if code > 0 {
        Some(true)
    } else {
        None
    }
}

/// Whether the record's span has ended, and its hotness byte at `time_ns` (0 when
/// ended: work that outlived its span is sampled as detached, at the baseline rate).
/// A cold record past its slow deadline is promoted here, from inside a long poll:
/// from this sample on, high rate.
#[inline(always)]
fn hotness_at(r: &LabelRecord, time_ns: u64) -> (bool, u8) {
    let mut state = r.state.load(Ordering::Relaxed);
    if state == 0 && r.slow_deadline_ns != 0 && time_ns >= r.slow_deadline_ns {
        state = r.promote_to(super::record::HOT_SLOW);
    }
    if state & ENDED != 0 {
        (true, 0)
    } else {
        (false, state & HOT_BITS)
    }
}

/// Counts a written sample: on the thread, and on its live labels (and their local
/// root), marking them sampled, or as detached.
#[inline(always)]
fn count_sample(ts: &ThreadSampler, rec: Option<&LabelRecord>, ended: bool, weight_ns: u64) {
    ts.samples.fetch_add(1, Ordering::Relaxed);
    if ended {
        ts.detached.fetch_add(1, Ordering::Relaxed);
    } else if let Some(r) = rec {
        for r in std::iter::once(r).chain(r.root.as_deref()) {
            r.cpu_samples.fetch_add(1, Ordering::Relaxed);
            r.cpu_ns.fetch_add(weight_ns, Ordering::Relaxed);
            mark_sampled(r);
        }
    }
}

/// Marks the record sampled, once: the first pop that sees it hands the span over
/// (`crate::registration`).
#[inline(always)]
fn mark_sampled(r: &LabelRecord) {
    if r.flags.load(Ordering::Relaxed) & SAMPLED == 0 {
        r.flags.fetch_or(SAMPLED, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_unit_matches_libm() {
        for i in 1..=10_000u32 {
            let u = f64::from(i) / 10_000.0;
            assert!((ln_unit(u) - u.ln()).abs() < 1e-6, "ln({u})");
        }
        assert!((ln_unit(1e-15) - 1e-15f64.ln()).abs() < 1e-5);
        assert_eq!(ln_unit(1.0), 0.0);
    }

    #[test]
    fn exponential_intervals_have_the_asked_mean() {
        let ts = ThreadSampler::for_current_thread(8);
        let mean = 1_000_000u64;
        let n = 200_000u64;
        let draws: Vec<u64> = (0..n).map(|_| exp_interval(&ts, mean)).collect();
        let avg = draws.iter().sum::<u64>() as f64 / n as f64;
        assert!((avg / mean as f64 - 1.0).abs() < 0.01, "mean {avg}");
        // Memoryless: the share above the mean is e^-1.
        let above = draws.iter().filter(|&&d| d > mean).count() as f64 / n as f64;
        assert!(
            (above - (-1f64).exp()).abs() < 0.01,
            "above the mean: {above}"
        );
        assert!(draws.iter().all(|&d| (mean / 64..=mean * 8).contains(&d)));
    }
}
