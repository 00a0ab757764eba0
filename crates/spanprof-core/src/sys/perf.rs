//! Per-thread `perf_event_open` software `cpu-clock` events whose overflow sends a
//! signal to the thread, for sampling rates above the kernel tick.
//!
//! The event counts user-space CPU time of one thread only (`exclude_kernel`, which
//! `perf_event_paranoid = 2` permits). With no ring buffer mapped, the kernel signals
//! when the event's refresh budget runs out and then disables it; re-arming with
//! `PERF_EVENT_IOC_REFRESH 1` after each sample keeps it going while work is hot.

use std::io;
use std::mem;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const FLAG_DISABLED: u64 = 1 << 0;
const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
const FLAG_EXCLUDE_HV: u64 = 1 << 6;
/// `read_format` bit: a read returns the time the event was enabled after its count.
#[cfg(feature = "testing")]
pub(super) const PERF_FORMAT_TOTAL_TIME_ENABLED: u64 = 1 << 0;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;
const PERF_EVENT_IOC_REFRESH: libc::c_ulong = 0x2402;
const PERF_EVENT_IOC_PERIOD: libc::c_ulong = 0x4008_2404;
const F_SETSIG: libc::c_int = 10;
const F_SETOWN_EX: libc::c_int = 15;
const F_OWNER_TID: libc::c_int = 0;

/// `struct perf_event_attr` up to `PERF_ATTR_SIZE_VER5` (112 bytes); the bit fields
/// after `read_format` are one `u64` of flags.
#[repr(C)]
#[derive(Default)]
pub(super) struct PerfEventAttr {
    pub(super) kind: u32,
    pub(super) size: u32,
    pub(super) config: u64,
    pub(super) sample_period: u64,
    pub(super) sample_type: u64,
    pub(super) read_format: u64,
    pub(super) flags: u64,
    pub(super) wakeup_events: u32,
    pub(super) bp_type: u32,
    pub(super) config1: u64,
    pub(super) config2: u64,
    pub(super) branch_sample_type: u64,
    pub(super) sample_regs_user: u64,
    pub(super) sample_stack_user: u32,
    pub(super) clockid: i32,
    pub(super) sample_regs_intr: u64,
    pub(super) aux_watermark: u32,
    pub(super) sample_max_stack: u16,
    pub(super) reserved: u16,
}

#[repr(C)]
struct FOwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}

/// Opens a disabled user-space `cpu-clock` event on thread `tid` that signals that
/// thread with `signo` every `period_ns` of its CPU time once armed.
pub(crate) fn open(tid: libc::pid_t, period_ns: u64, signo: i32) -> io::Result<i32> {
    let fd = open_attr(&cpu_clock_attr(period_ns), tid)?;
    let owner = FOwnerEx {
        kind: F_OWNER_TID,
        pid: tid,
    };
    // SAFETY: `fd` is the perf fd we just opened and own; the fcntl commands take an
    // int or a pointer to a valid `f_owner_ex`.
    let ok = unsafe {
        libc::fcntl(fd, libc::F_SETFL, libc::O_ASYNC) == 0
            && libc::fcntl(fd, F_SETSIG, signo) == 0
            && libc::fcntl(fd, F_SETOWN_EX, &owner as *const FOwnerEx) == 0
    };
    if !ok {
        let err = io::Error::last_os_error();
        close(fd);
        return Err(err);
    }
    Ok(fd)
}

/// A disabled user-space `cpu-clock` event overflowing every `period_ns` of the
/// thread's CPU time: spanprof's sampling event, and the probes' starting point.
pub(super) fn cpu_clock_attr(period_ns: u64) -> PerfEventAttr {
    PerfEventAttr {
        kind: PERF_TYPE_SOFTWARE,
        size: mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_CPU_CLOCK,
        sample_period: period_ns.max(1),
        flags: FLAG_DISABLED | FLAG_EXCLUDE_KERNEL | FLAG_EXCLUDE_HV,
        ..Default::default()
    }
}

/// Opens the event `attr` describes on thread `tid` (any CPU, no group, close on exec).
pub(super) fn open_attr(attr: &PerfEventAttr, tid: libc::pid_t) -> io::Result<i32> {
    // SAFETY: `attr` is a valid, fully initialised perf_event_attr whose `size` field
    // matches its layout; the other arguments are plain integers.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const PerfEventAttr,
            tid,
            -1 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd as i32)
}

/// Arms the event for one more overflow signal. Async-signal-safe (one ioctl).
#[inline]
pub(crate) fn refresh(fd: i32) -> bool {
    // SAFETY: `fd` is an open perf event fd owned by the thread's sampler; the ioctl
    // takes an integer argument.
    unsafe { libc::ioctl(fd, PERF_EVENT_IOC_REFRESH as _, 1 as libc::c_int) == 0 }
}

/// Changes the sampling period (takes effect from the next overflow).
/// Async-signal-safe (one ioctl).
#[inline]
pub(crate) fn set_period(fd: i32, period_ns: u64) -> bool {
    let period: u64 = period_ns.max(1);
    // SAFETY: `fd` is an open perf event fd; PERF_EVENT_IOC_PERIOD reads a u64 through
    // the pointer, which points at a live local.
    unsafe { libc::ioctl(fd, PERF_EVENT_IOC_PERIOD as _, &period as *const u64) == 0 }
}

/// Restarts an event stopped by [`disable`], leaving its overflow budget (what
/// [`refresh`] adds to) as it was. Async-signal-safe (one ioctl).
#[inline]
pub(crate) fn enable(fd: i32) -> bool {
    // SAFETY: as in `refresh`.
    unsafe { libc::ioctl(fd, PERF_EVENT_IOC_ENABLE as _, 0 as libc::c_int) == 0 }
}

/// Stops the event (no more signals until refreshed).
pub(crate) fn disable(fd: i32) {
    // SAFETY: as in `refresh`.
    unsafe {
        libc::ioctl(fd, PERF_EVENT_IOC_DISABLE as _, 0 as libc::c_int);
    }
}

/// Closes the event.
pub(crate) fn close(fd: i32) {
    // SAFETY: `fd` is owned by the caller and closed once.
    unsafe {
        libc::close(fd);
    }
}
