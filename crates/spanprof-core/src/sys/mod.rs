//! All of spanprof's `unsafe` code lives in this module and its children: the
//! per-thread label slot, the per-thread sample ring, the CPU timers, the perf
//! events, the signal handler and the unwinders (DWARF call-frame information, frame
//! pointers).
//!
//! The rest of the crate is safe code and talks to this module through the safe
//! functions re-exported here. Every `unsafe` block states the invariants it relies
//! on in a `// SAFETY:` comment.
#![allow(unsafe_code)]

#[cfg(spanprof_otel_ctx)]
pub(crate) mod process_ctx;
pub(crate) mod record;
#[cfg(spanprof_otel_ctx)]
pub(crate) mod thread_ctx;
pub(crate) use slot::outer_span_metadata;
#[cfg(feature = "testing")]
mod quarantine;
pub(crate) mod ring;
pub(crate) mod slot;

#[cfg(all(spanprof_sampler, feature = "testing"))]
mod alloc_counter;
#[cfg(all(spanprof_sampler, target_arch = "x86_64"))]
mod dwarf;
#[cfg(spanprof_sampler)]
mod handler;
#[cfg(spanprof_sampler)]
mod perf;
#[cfg(all(spanprof_sampler, feature = "testing"))]
pub mod probe;
#[cfg(spanprof_sampler)]
mod thread;
#[cfg(spanprof_sampler)]
mod timer;
#[cfg(spanprof_sampler)]
mod unwind;
#[cfg(spanprof_sampler)]
mod wake;

#[cfg(all(spanprof_sampler, feature = "testing"))]
pub use alloc_counter::HandlerAllocCounter;
#[cfg(all(spanprof_sampler, feature = "testing"))]
pub(crate) use handler::in_signal_handler;
#[cfg(spanprof_sampler)]
pub(crate) use handler::{
    install_handler, on_hot_end, on_hot_push, set_enabled, set_wall_period, uninstall_handler,
    wall_period,
};
#[cfg(feature = "testing")]
pub use quarantine::{POISON_BYTE, QuarantineAlloc};
#[cfg(spanprof_sampler)]
pub(crate) use thread::{ThreadSampler, probe_perf_events};
#[cfg(spanprof_sampler)]
pub(crate) use unwind::{frame_pointers_present, set_frame_pointer_text};
#[cfg(spanprof_sampler)]
pub(crate) use wake::{drain_requests, request_drain, wait_for_drain_request};

/// Starts wall-clock sampling of the calling thread for a hot poll, when wall-clock
/// samples are on and the thread is sampled. Returns whether it did: then
/// [`wall_end`] must follow, on this thread, when the poll ends.
#[cfg(spanprof_sampler)]
#[inline]
pub(crate) fn wall_begin() -> bool {
    let period = handler::wall_period();
    if period == 0 {
        return false;
    }
    // SAFETY: a non-null pointer is this thread's sampler, kept alive by the registry
    // until the thread detaches, which nulls it; only this thread reads it here.
    match unsafe { thread::current_sampler().as_ref() } {
        Some(ts) => {
            ts.wall_begin(period);
            true
        }
        None => false,
    }
}

/// Ends what [`wall_begin`] started (the outermost hot poll stops the timer).
#[cfg(spanprof_sampler)]
#[inline]
pub(crate) fn wall_end() {
    // SAFETY: as in `wall_begin`.
    if let Some(ts) = unsafe { thread::current_sampler().as_ref() } {
        ts.wall_end();
    }
}

/// Reads the loaded modules' unwind information for the signal handler: at profiler
/// start (`only_if_asked` false), and from the drain thread, where it does so only
/// when the handler met code no module covered (a library loaded since). Elsewhere
/// than x86_64 the handler walks frame pointers only.
#[cfg(spanprof_sampler)]
pub(crate) fn refresh_unwind_modules(only_if_asked: bool) {
    #[cfg(target_arch = "x86_64")]
    dwarf::refresh(only_if_asked);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = only_if_asked;
}

#[cfg(not(spanprof_sampler))]
mod unsupported;
#[cfg(not(spanprof_sampler))]
pub(crate) use unsupported::*;

/// How a thread reaches its high sampling rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// A per-thread `perf_event_open` software `cpu-clock` event (rates well above
    /// the kernel tick).
    PerfEvent,
    /// The per-thread CPU timer re-armed at the high period (capped by the kernel tick).
    Timer,
    /// No profiling on this platform or configuration.
    Unavailable,
}

impl Mechanism {
    /// `"perf_event"`, `"timer"` or `"unavailable"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::PerfEvent => "perf_event",
            Mechanism::Timer => "timer",
            Mechanism::Unavailable => "unavailable",
        }
    }
}

/// How the signal handler unwinds a sample's stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unwinding {
    /// By the DWARF call-frame information (`.eh_frame`) of every loaded module:
    /// whole stacks through glibc, C libraries and code built without frame pointers
    /// (x86_64 Linux; elsewhere the profiler walks frame pointers). The default.
    #[default]
    DwarfCfi,
    /// By walking frame pointers: cheaper per frame, but a stack stops (or skips its
    /// caller) in code built without them, glibc's allocator among it.
    FramePointers,
}

impl Unwinding {
    /// `"dwarf"` or `"frame_pointers"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Unwinding::DwarfCfi => "dwarf",
            Unwinding::FramePointers => "frame_pointers",
        }
    }
}

/// Makes the signal handler unwind as asked where it can, and returns how it will:
/// DWARF on x86_64 once the loaded modules have been read, else frame pointers.
#[cfg(spanprof_sampler)]
pub(crate) fn set_unwinding(asked: Unwinding) -> Unwinding {
    #[cfg(target_arch = "x86_64")]
    {
        dwarf::set_enabled(asked == Unwinding::DwarfCfi);
        if dwarf::in_use().is_some() {
            return Unwinding::DwarfCfi;
        }
    }
    let _ = asked;
    Unwinding::FramePointers
}

/// Most frames one sample keeps; deeper stacks are truncated and marked.
pub const MAX_FRAMES: usize = 128;

/// CLOCK_MONOTONIC in nanoseconds: the clock the signal handler stamps samples with.
#[inline]
pub(crate) fn monotonic_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time consumed so far by the calling thread.
pub(crate) fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_THREAD_CPUTIME_ID always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// [`thread_cpu_time`] in nanoseconds. Async-signal-safe (one `clock_gettime`).
#[inline]
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_THREAD_CPUTIME_ID always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// CPU time consumed so far by the whole process.
pub(crate) fn process_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_PROCESS_CPUTIME_ID always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The calling thread's kernel thread id (0 where there is none to give).
pub(crate) fn current_tid() -> i32 {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid has no preconditions.
    return unsafe { libc::gettid() };
    #[cfg(not(target_os = "linux"))]
    0
}

/// Sends the profiling signal to thread `tid` of this process (as `kill` would: the
/// handler ignores it, `SI_TKILL`), for tests of how system calls fare when the
/// signal interrupts them.
#[cfg(all(spanprof_sampler, feature = "testing"))]
pub(crate) fn signal_thread(tid: i32) -> bool {
    // SAFETY: tgkill only sends a signal; a wrong tid yields ESRCH, nothing unsafe.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGPROF) == 0 }
}

/// Maps the shared library `lib` into this process (`dlopen`, never closed) and
/// returns the address of its symbol `sym`, for tests of code mapped after the
/// symbolizer first read the process's mappings.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn dlopen_symbol(lib: &std::ffi::CStr, sym: &std::ffi::CStr) -> Option<u64> {
    // SAFETY: both names are NUL-terminated C strings; the handle is never closed,
    // so the returned address stays mapped for the rest of the process.
    let handle = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: `handle` is a live handle from dlopen; `sym` is NUL-terminated.
    let addr = unsafe { libc::dlsym(handle, sym.as_ptr()) } as u64;
    (addr != 0).then_some(addr)
}

/// Forks this process; the child only sleeps `secs` seconds and exits (nothing but
/// async-signal-safe calls, as a child of a threaded process must), the parent gets
/// its pid (-1 on failure). For tests of what a child inherits.
#[cfg(all(target_os = "linux", feature = "testing"))]
pub fn fork_sleeping_child(secs: u32) -> i32 {
    // SAFETY: in the child only `sleep` and `_exit` run, both async-signal-safe; no
    // lock, allocation or destructor of the parent's state is touched there.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            libc::sleep(secs);
            libc::_exit(0);
        }
        pid
    }
}
