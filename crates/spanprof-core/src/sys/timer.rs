//! Per-thread timers: `timer_create` on the thread's CPU clock (CPU samples) or on
//! `CLOCK_MONOTONIC` (wall-clock samples of hot polls), with the expiry signal sent
//! to that thread (`SIGEV_THREAD_ID`).

use std::io;
use std::mem;

/// An armed POSIX timer id.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuTimer(libc::timer_t);

// SAFETY: a `timer_t` is a process-wide kernel handle (an integer in a pointer on
// glibc); any thread may arm or delete it.
unsafe impl Send for CpuTimer {}
// SAFETY: as above.
unsafe impl Sync for CpuTimer {}

impl CpuTimer {
    /// Creates a timer on the CPU-time clock of `thread` whose expiries signal the
    /// kernel thread `tid` with `signo`. Not armed yet.
    pub(crate) fn create(
        thread: libc::pthread_t,
        tid: libc::pid_t,
        signo: i32,
    ) -> io::Result<Self> {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: `thread` is a live thread of this process (the caller holds the
        // registry entry of a thread that has not deregistered), and `clock` is a
        // valid out-pointer.
        let rc = unsafe { libc::pthread_getcpuclockid(thread, &mut clock) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        // SAFETY: `sigevent` is plain data; all-zero is a valid value we then fill.
        let mut sev: libc::sigevent = unsafe { mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = signo;
        sev.sigev_notify_thread_id = tid;
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: valid clock id, initialised sigevent and out-pointer.
        let rc = unsafe { libc::timer_create(clock, &mut sev, &mut id) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(CpuTimer(id))
    }

    /// Creates a timer on `CLOCK_MONOTONIC` whose expiries signal the kernel thread
    /// `tid` with `signo`, carrying `tag` as the signal's value (so the handler tells
    /// it from the CPU timer, whose value is 0). Not armed yet.
    pub(crate) fn create_wall(tid: libc::pid_t, signo: i32, tag: usize) -> io::Result<Self> {
        // SAFETY: `sigevent` is plain data; all-zero is a valid value we then fill.
        let mut sev: libc::sigevent = unsafe { mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = signo;
        sev.sigev_notify_thread_id = tid;
        sev.sigev_value = libc::sigval {
            sival_ptr: tag as *mut libc::c_void,
        };
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: CLOCK_MONOTONIC always exists; initialised sigevent and out-pointer.
        let rc = unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut id) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(CpuTimer(id))
    }

    /// Arms the timer: first expiry after `first_ns` (at least 1), then every
    /// `period_ns`; `period_ns` 0 with `first_ns` 0 disarms it.
    #[inline]
    pub(crate) fn set(&self, first_ns: u64, period_ns: u64) -> bool {
        let spec = libc::itimerspec {
            it_interval: timespec(period_ns),
            it_value: timespec(first_ns),
        };
        // SAFETY: `self.0` is a timer created by `create_wall` and not yet deleted;
        // `spec` is a valid itimerspec.
        unsafe { libc::timer_settime(self.0, 0, &spec, std::ptr::null_mut()) == 0 }
    }

    /// Sets the period (first expiry after one period). Async-signal-safe.
    #[inline]
    pub(crate) fn set_period(&self, period_ns: u64) -> bool {
        let ts = libc::timespec {
            tv_sec: (period_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (period_ns % 1_000_000_000) as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: ts,
            it_value: ts,
        };
        // SAFETY: `self.0` is a timer created by `create` and not yet deleted (deletion
        // consumes the timer); `spec` is a valid itimerspec. timer_settime is
        // async-signal-safe (POSIX).
        unsafe { libc::timer_settime(self.0, 0, &spec, std::ptr::null_mut()) == 0 }
    }

    /// Deletes the timer. Pending expiry signals may still arrive afterwards.
    pub(crate) fn delete(self) {
        // SAFETY: the timer exists and, taking `self` by value, is deleted once.
        unsafe {
            libc::timer_delete(self.0);
        }
    }
}

impl CpuTimer {
    /// The raw id, so the signal handler can re-arm the timer without a lock.
    pub(crate) fn raw(&self) -> usize {
        self.0 as usize
    }

    /// Rebuilds a handle from [`CpuTimer::raw`] (for `set_period` only; never delete it).
    pub(crate) fn from_raw(raw: usize) -> Self {
        CpuTimer(raw as libc::timer_t)
    }
}

fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}
