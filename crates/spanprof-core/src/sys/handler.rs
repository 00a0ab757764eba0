//! The `SIGPROF` handler: reads the label slot, unwinds, writes one sample.
//!
//! Async-signal-safe by construction: it touches only thread-locals initialised at
//! compile time, atomics, the preallocated ring of its own thread, and the
//! async-signal-safe calls `clock_gettime`, `timer_settime` and `ioctl`. No
//! allocation, no lock, no panic (every index is bounds-checked by construction and
//! the arithmetic saturates), and errno is saved and restored.

use std::cell::Cell;
use std::io;
use std::ptr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::ring::{FLAG_LABELLED, FLAG_PERF, FLAG_TRUNCATED};
use super::thread::ThreadSampler;
use super::timer::CpuTimer;
use super::{perf, slot, unwind};

/// The signal both the CPU timers and the perf events deliver.
pub(crate) const SIGNAL: i32 = libc::SIGPROF;

thread_local! {
    static THREAD: Cell<*const ThreadSampler> = const { Cell::new(ptr::null()) };
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static INSTALLED: Mutex<Option<libc::sigaction>> = Mutex::new(None);

pub(crate) fn set_current_thread(ts: *const ThreadSampler) {
    THREAD.with(|t| t.set(ts));
}

/// Whether the calling thread is inside the profiling signal handler right now (for
/// tests that prove the handler never allocates).
pub(crate) fn in_signal_handler() -> bool {
    IN_HANDLER.with(|c| c.get())
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
    let ts = THREAD.with(|t| t.get());
    if ts.is_null() || !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: a non-null THREAD pointer is the `Arc<ThreadSampler>` of this thread,
    // kept alive by the registry until after the thread detaches (nulls THREAD).
    let ts = unsafe { &*ts };
    go_high(ts, label_high_ns);
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
/// (at the work's period) or, in timer mode, re-arms the timer at the high period.
#[inline(always)]
fn go_high(ts: &ThreadSampler, label_high_ns: u64) {
    let period = high_period(ts, label_high_ns);
    let fd = ts.perf_fd.load(Ordering::Acquire);
    if fd >= 0 {
        if ts
            .perf_armed
            .compare_exchange(false, true, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            // Grace: the next timer tick must not take the fresh event for a lost one.
            ts.perf_since_tick.store(1, Ordering::Relaxed);
            if ts.current_period_ns.load(Ordering::Relaxed) != period
                && perf::set_period(fd, period)
            {
                ts.current_period_ns.store(period, Ordering::Relaxed);
            }
            if !perf::refresh(fd) {
                ts.perf_armed.store(false, Ordering::Relaxed);
                ts.rearm_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    } else if ts.timer_live.load(Ordering::Acquire)
        && (!ts.timer_high.swap(true, Ordering::Relaxed)
            || ts.current_period_ns.load(Ordering::Relaxed) != period)
    {
        ts.current_period_ns.store(period, Ordering::Relaxed);
        CpuTimer::from_raw(ts.timer_raw.load(Ordering::Relaxed)).set_period(period);
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
}

extern "C" fn on_signal(_sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno slot; always valid.
    let errno = unsafe { *libc::__errno_location() };
    IN_HANDLER.with(|c| c.set(true));
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler.
    unsafe { handle(info as *const SigInfoTimer, uctx) };
    IN_HANDLER.with(|c| c.set(false));
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// # Safety
/// Only from `on_signal`, with the kernel's `info` and `uctx`.
#[inline(always)]
unsafe fn handle(info: *const SigInfoTimer, uctx: *mut libc::c_void) {
    let ts = THREAD.with(|t| t.get());
    if ts.is_null() || !ENABLED.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: see `on_hot_push`: THREAD is non-null only while the registry keeps the
    // sampler alive, and only this thread reads it.
    let ts = unsafe { &*ts };
    // SAFETY: `info` is the kernel's siginfo (caller's guarantee); the fields read
    // are in the common prefix (`si_code`) or in the timer union member, which we only
    // read for SI_TIMER.
    let code = unsafe { (*info).code };
    let from_perf = if code == libc::SI_TIMER {
        false
    } else if code > 0 {
        true
    } else {
        return; // kill(), sigqueue(): not ours.
    };

    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe; `now` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let time_ns = (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64);

    let rec = slot::current_ptr();
    // SAFETY: a non-null slot pointer is a live `LabelRecord` (its pusher keeps it alive
    // until it restores the slot, which cannot happen while we interrupt it).
    let rec = unsafe { rec.as_ref() };
    let mut hot = rec.map_or(0, |r| r.hot.load(Ordering::Relaxed));
    if let Some(r) = rec
        && hot == 0
        && r.slow_deadline_ns != 0
        && time_ns >= r.slow_deadline_ns
    {
        // Slow promotion from inside a long poll: from this sample on, high rate.
        r.hot
            .fetch_max(crate::profile::Hotness::Slow as u8, Ordering::Relaxed);
        hot = crate::profile::Hotness::Slow as u8;
    }
    let label_high_ns = rec.map_or(0, |r| r.high_ns);
    let weight_ns;
    let mut flags = 0;
    if from_perf {
        flags |= FLAG_PERF;
        ts.perf_since_tick.fetch_add(1, Ordering::Relaxed);
        // This sample stands for the period the event ran at until now.
        weight_ns = ts.current_period_ns.load(Ordering::Relaxed);
        let fd = ts.perf_fd.load(Ordering::Acquire);
        if hot != 0 && fd >= 0 {
            let period = high_period(ts, label_high_ns);
            if period != weight_ns && perf::set_period(fd, period) {
                ts.current_period_ns.store(period, Ordering::Relaxed);
            }
            if !perf::refresh(fd) {
                ts.perf_armed.store(false, Ordering::Relaxed);
                ts.rearm_failed.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            ts.perf_armed.store(false, Ordering::Relaxed);
        }
    } else {
        // SAFETY: SI_TIMER: the timer member of the union is the live one.
        let overrun = unsafe { (*info).overrun }.max(0) as u64;
        let periods = 1 + overrun;
        if ts.perf_fd.load(Ordering::Relaxed) >= 0 {
            if ts.perf_armed.load(Ordering::Relaxed) {
                if ts.perf_since_tick.swap(0, Ordering::Relaxed) > 0 {
                    // The perf event is sampling this thread: it covers this time.
                    ts.superseded.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                // No perf sample since the last tick: its signal was lost; re-arm below.
                ts.perf_armed.store(false, Ordering::Relaxed);
            }
            weight_ns = ts
                .baseline_ns
                .load(Ordering::Relaxed)
                .saturating_mul(periods);
            if hot != 0 {
                go_high(ts, label_high_ns);
            }
        } else {
            // Timer mode: the timer itself runs at the baseline or the high period.
            let period = ts.current_period_ns.load(Ordering::Relaxed);
            weight_ns = period.saturating_mul(periods);
            if hot != 0 {
                go_high(ts, label_high_ns);
            } else if ts.timer_high.load(Ordering::Relaxed) && ts.timer_live.load(Ordering::Acquire)
            {
                ts.timer_high.store(false, Ordering::Relaxed);
                let base = ts.baseline_ns.load(Ordering::Relaxed);
                ts.current_period_ns.store(base, Ordering::Relaxed);
                CpuTimer::from_raw(ts.timer_raw.load(Ordering::Relaxed)).set_period(base);
            }
        }
    }

    // SAFETY: `uctx` is the kernel's ucontext for this signal.
    let regs = unsafe { unwind::regs(uctx) };
    let written = ts.ring.write(|s| {
        // SAFETY: [stack_lo, stack_hi) are this thread's stack bounds, read at
        // registration on this thread, and we run on this thread.
        let (depth, truncated) =
            unsafe { unwind::walk(&regs, ts.stack_lo, ts.stack_hi, &mut s.frames) };
        s.depth = depth as u32;
        if truncated {
            flags |= FLAG_TRUNCATED;
            ts.truncated.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(r) = rec {
            flags |= FLAG_LABELLED;
            s.trace_id = r.trace_id;
            s.span_id = r.span_id;
            s.parent_span_id = r.parent_span_id;
            s.root_span_id = r.root_span_id;
            s.span_name = r.span_name.0;
            s.route = r.route.0;
            s.hot = hot;
        }
        s.weight_ns = weight_ns;
        s.time_ns = time_ns;
        s.flags = flags;
    });
    if written {
        ts.samples.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = rec {
            r.cpu_samples.fetch_add(1, Ordering::Relaxed);
            r.cpu_ns.fetch_add(weight_ns, Ordering::Relaxed);
            if let Some(root) = r.root.as_deref() {
                root.cpu_samples.fetch_add(1, Ordering::Relaxed);
                root.cpu_ns.fetch_add(weight_ns, Ordering::Relaxed);
            }
        }
    }
}
