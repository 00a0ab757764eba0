//! The machine's floor for one CPU sample, for benchmarks: what a sample costs a
//! thread before any profiler does any work in it. Not used by the profiler.
//!
//! - [`SignalProbe`]: the same per-thread `cpu-clock` perf event spanprof uses
//!   (user-space CPU time, overflow signals the thread with `SIGPROF`), delivered to an
//!   empty handler that only counts and re-arms with one `ioctl` (what spanprof's
//!   handler does besides reading its slot, unwinding and writing the sample).
//! - [`RingProbe`]: the same event with no signal at all: the kernel writes each
//!   sample (its instruction pointer) into a mapped ring buffer, as `perf record`
//!   does. What remains is the timer interrupt and the kernel's own sample write.
//!
//! The cost per sample is then measured from outside, as the CPU a busy thread loses
//! per sample (`rate_sweep --floor`).
//!
//! - [`pause_resume_cost`]: what a hot request's resume and pause of its thread's
//!   event cost (`PERF_EVENT_IOC_ENABLE` then `_DISABLE`, through the same functions
//!   the signal handler module calls), beside a read of the thread's CPU clock and the
//!   cheapest system call. Timed from inside, per call.

use std::cell::Cell;
use std::io;
use std::mem;
use std::ptr;
use std::sync::Mutex;
use std::sync::atomic::{Ordering, fence};
use std::time::Instant;

use super::perf::{self, PerfEventAttr};

/// The signal the empty handler receives (the one spanprof uses).
const SIGNAL: i32 = libc::SIGPROF;
const PERF_SAMPLE_IP: u64 = 1 << 0;
const PERF_RECORD_SAMPLE: u32 = 9;
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
/// Offset of `data_head` in `struct perf_event_mmap_page`.
const DATA_HEAD_OFFSET: usize = 1024;
/// Data pages of the ring: 64 pages of 16-byte records hold 16 384 samples, 16 s of
/// one thread's CPU at 1 kHz; the ring is never consumed, so a probe is meant for
/// runs shorter than that.
const RING_DATA_PAGES: usize = 64;

thread_local! {
    static PROBE_FD: Cell<i32> = const { Cell::new(-1) };
    static PROBE_SIGNALS: Cell<u64> = const { Cell::new(0) };
}

static PREVIOUS: Mutex<Option<libc::sigaction>> = Mutex::new(None);

/// The empty handler: count, re-arm, nothing else. Async-signal-safe: two
/// const-initialised thread-locals and one `ioctl`; errno is saved and restored.
extern "C" fn on_probe_signal(
    _sig: libc::c_int,
    _info: *mut libc::siginfo_t,
    _uctx: *mut libc::c_void,
) {
    // SAFETY: `__errno_location` returns this thread's errno, valid for the thread's
    // whole life; reading and writing it is what every handler that makes a system
    // call must do.
    let errno = unsafe { *libc::__errno_location() };
    PROBE_SIGNALS.with(|c| c.set(c.get() + 1));
    let fd = PROBE_FD.with(|c| c.get());
    if fd >= 0 {
        perf::refresh(fd);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Installs the empty handler for `SIGPROF` process-wide, remembering the previous
/// action. Fails if it is already installed. Do not run spanprof's profiler while it
/// is: both use `SIGPROF`.
pub fn install_empty_handler() -> io::Result<()> {
    let mut previous = PREVIOUS.lock().unwrap_or_else(|e| e.into_inner());
    if previous.is_some() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "probe handler installed",
        ));
    }
    // SAFETY: a valid sigaction (handler with the SA_SIGINFO signature, an empty
    // mask) and valid pointers; `old` receives the previous action.
    unsafe {
        let mut new: libc::sigaction = mem::zeroed();
        new.sa_sigaction = on_probe_signal as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut new.sa_mask);
        let mut old: libc::sigaction = mem::zeroed();
        if libc::sigaction(SIGNAL, &new, &mut old) != 0 {
            return Err(io::Error::last_os_error());
        }
        *previous = Some(old);
    }
    Ok(())
}

/// Restores the action [`install_empty_handler`] replaced, discarding pending
/// `SIGPROF`s first (through `SIG_IGN`).
pub fn uninstall_empty_handler() {
    let mut previous = PREVIOUS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(old) = previous.take() {
        // SAFETY: valid sigaction values and pointers; SIG_IGN discards any pending
        // SIGPROF (POSIX), then the saved action goes back.
        unsafe {
            let mut ign: libc::sigaction = mem::zeroed();
            ign.sa_sigaction = libc::SIG_IGN;
            libc::sigaction(SIGNAL, &ign, ptr::null_mut());
            libc::sigaction(SIGNAL, &old, ptr::null_mut());
        }
    }
}

/// A perf `cpu-clock` event on the calling thread signalling the empty handler every
/// `period_ns` of the thread's user CPU time (install the handler first). One per
/// thread at a time; closed on drop.
#[derive(Debug)]
pub struct SignalProbe {
    fd: i32,
    signals_at_start: u64,
}

impl SignalProbe {
    /// Opens and arms the event on the calling thread.
    pub fn start(period_ns: u64) -> io::Result<SignalProbe> {
        let fd = perf::open(super::current_tid(), period_ns, SIGNAL)?;
        PROBE_FD.with(|c| c.set(fd));
        if !perf::refresh(fd) {
            let err = io::Error::last_os_error();
            PROBE_FD.with(|c| c.set(-1));
            perf::close(fd);
            return Err(err);
        }
        Ok(SignalProbe {
            fd,
            signals_at_start: PROBE_SIGNALS.with(|c| c.get()),
        })
    }

    /// Signals the calling thread's handler has counted since [`SignalProbe::start`]
    /// (call it on the thread that started the probe).
    pub fn samples(&self) -> u64 {
        PROBE_SIGNALS.with(|c| c.get()) - self.signals_at_start
    }
}

impl Drop for SignalProbe {
    fn drop(&mut self) {
        perf::disable(self.fd);
        PROBE_FD.with(|c| {
            if c.get() == self.fd {
                c.set(-1);
            }
        });
        perf::close(self.fd);
    }
}

/// A perf `cpu-clock` event on the calling thread that records every `period_ns` of
/// the thread's user CPU time into a mapped ring buffer: no signal, no re-arm.
#[derive(Debug)]
pub struct RingProbe {
    fd: i32,
    base: *mut libc::c_void,
    len: usize,
    page: usize,
}

// SAFETY: the mapping is owned by the probe and only read through `&self`; the
// kernel writes it concurrently whichever thread holds the probe.
unsafe impl Send for RingProbe {}

impl RingProbe {
    /// Opens the event on the calling thread, maps its ring and enables it.
    pub fn start(period_ns: u64) -> io::Result<RingProbe> {
        let attr = PerfEventAttr {
            sample_type: PERF_SAMPLE_IP,
            ..perf::cpu_clock_attr(period_ns)
        };
        let fd = perf::open_attr(&attr, super::current_tid())?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = page * (1 + RING_DATA_PAGES);
        // SAFETY: maps `len` bytes of the perf fd we own (1 + 2^n pages, as perf
        // requires); the result is checked against MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let err = io::Error::last_os_error();
            perf::close(fd);
            return Err(err);
        }
        let probe = RingProbe {
            fd,
            base,
            len,
            page,
        };
        // SAFETY: `fd` is our perf fd; the ioctl takes an integer argument.
        if unsafe { libc::ioctl(fd, PERF_EVENT_IOC_ENABLE as _, 0 as libc::c_int) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(probe)
    }

    /// Samples the kernel has written so far (records of type `PERF_RECORD_SAMPLE`;
    /// lost-sample and throttle records are skipped).
    pub fn samples(&self) -> u64 {
        // SAFETY: `base` maps at least one page, and `data_head` is an aligned u64 at
        // offset 1024 of the first page (`struct perf_event_mmap_page`), written by
        // the kernel: read it volatile.
        let head = unsafe {
            ptr::read_volatile(self.base.cast::<u8>().add(DATA_HEAD_OFFSET).cast::<u64>())
        };
        // The kernel's records up to `head` are visible after this fence (perf's
        // documented protocol: read data_head, then an acquire barrier).
        fence(Ordering::Acquire);
        let size = (self.len - self.page) as u64;
        let head = head.min(size); // never consumed: the ring stops when full
        let data = self.base.cast::<u8>().wrapping_add(self.page);
        let (mut at, mut samples) = (0u64, 0u64);
        while at + 8 <= head {
            // SAFETY: `at + 8 <= head <= size`, so the 8-byte record header lies inside
            // the data area of our mapping; it is read unaligned-safe and volatile.
            let header = unsafe { ptr::read_volatile(data.add(at as usize).cast::<[u8; 8]>()) };
            let kind = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]);
            let len = u16::from_ne_bytes([header[6], header[7]]);
            if len == 0 {
                break;
            }
            if kind == PERF_RECORD_SAMPLE {
                samples += 1;
            }
            at += u64::from(len);
        }
        samples
    }
}

impl Drop for RingProbe {
    fn drop(&mut self) {
        perf::disable(self.fd);
        // SAFETY: unmaps exactly the mapping made in `start`, once.
        unsafe { libc::munmap(self.base, self.len) };
        perf::close(self.fd);
    }
}

/// What [`pause_resume_cost`] measured, in microseconds per call (means).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PauseResumeCost {
    /// `PERF_EVENT_IOC_ENABLE` then `PERF_EVENT_IOC_DISABLE` on a per-thread
    /// `cpu-clock` event: what a hot request pays to resume its thread's event at its
    /// first push and pause it at its end.
    pub enable_disable_pair_us: f64,
    /// One read of the thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`); a hot request
    /// takes one beside each of the two calls above.
    pub thread_cpu_clock_us: f64,
    /// `getppid`, the cheapest system call: the machine's price of entering the kernel.
    pub plain_syscall_us: f64,
}

/// Times `iterations` resume/pause pairs of a per-thread `cpu-clock` event at 1 kHz
/// (spanprof's high rate), then as many thread CPU clock reads and `getppid` calls.
///
/// The event is opened without a signal (no overflow can reach a handler, so no
/// handler need be installed); the two `ioctl`s go through spanprof's own
/// `sys::perf::enable` and `disable`, the ones its hot path makes. Fails if the event
/// cannot be opened (`perf_event_paranoid` above 2), if an `ENABLE` fails, or if the
/// kernel reports the event never counted a nanosecond enabled (the `ioctl`s did
/// nothing).
pub fn pause_resume_cost(iterations: u32) -> io::Result<PauseResumeCost> {
    let n = iterations.max(1);
    let attr = PerfEventAttr {
        read_format: perf::PERF_FORMAT_TOTAL_TIME_ENABLED,
        ..perf::cpu_clock_attr(1_000_000)
    };
    let fd = perf::open_attr(&attr, super::current_tid())?;
    let start = Instant::now();
    for _ in 0..n {
        if !perf::enable(fd) {
            let err = io::Error::last_os_error();
            perf::close(fd);
            return Err(err);
        }
        perf::disable(fd);
    }
    let pair = start.elapsed();
    // { value, time_enabled }: read_format asks for the enabled time after the count.
    let mut counts = [0u64; 2];
    // SAFETY: `fd` is our perf fd; `counts` is a live buffer of exactly the length
    // passed, and a perf read writes at most that many bytes.
    let read = unsafe {
        libc::read(
            fd,
            counts.as_mut_ptr().cast::<libc::c_void>(),
            mem::size_of_val(&counts),
        )
    };
    let read_err = io::Error::last_os_error();
    perf::close(fd);
    if read != mem::size_of_val(&counts) as isize {
        return Err(read_err);
    }
    if counts[1] == 0 {
        return Err(io::Error::other(
            "the perf event was never enabled: PERF_EVENT_IOC_ENABLE had no effect",
        ));
    }
    let start = Instant::now();
    for _ in 0..n {
        std::hint::black_box(super::thread_cpu_ns());
    }
    let clock = start.elapsed();
    let start = Instant::now();
    for _ in 0..n {
        // SAFETY: getppid has no preconditions and cannot fail.
        std::hint::black_box(unsafe { libc::getppid() });
    }
    let plain = start.elapsed();
    let per_call_us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / f64::from(n);
    Ok(PauseResumeCost {
        enable_disable_pair_us: per_call_us(pair),
        thread_cpu_clock_us: per_call_us(clock),
        plain_syscall_us: per_call_us(plain),
    })
}

/// What [`unwind_cost`] measured: nanoseconds per walk of one stack, and the frames
/// each walk found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnwindCost {
    /// The frame-pointer walk (what the handler does where there is no DWARF unwinder).
    pub frame_pointer_ns: f64,
    /// Frames the frame-pointer walk found.
    pub frame_pointer_frames: usize,
    /// The DWARF walk with the thread's rule cache warm (every sample after the first
    /// at the same addresses).
    pub dwarf_ns: f64,
    /// Frames the DWARF walk found.
    pub dwarf_frames: usize,
    /// The DWARF walk with a cache that has never seen these addresses (each frame
    /// parses its call-frame program).
    pub dwarf_cold_ns: f64,
}

/// Times both unwinders of the signal handler on the calling thread's own stack,
/// `depth` frames of recursion below this call, `iterations` walks each. Needs the
/// loaded modules' unwind information, which a running profiler (or this call)
/// publishes. `None` where there is no DWARF unwinder (not x86_64).
pub fn unwind_cost(depth: u32, iterations: u32) -> Option<UnwindCost> {
    #[cfg(target_arch = "x86_64")]
    {
        super::dwarf::refresh(false);
        Some(recurse(depth.max(1), iterations.max(1)))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (depth, iterations);
        None
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn recurse(depth: u32, iterations: u32) -> UnwindCost {
    if depth > 1 {
        let c = recurse(std::hint::black_box(depth - 1), iterations);
        // Used after the call, so the call is not a tail call.
        return std::hint::black_box(c);
    }
    let (pc, sp, fp): (usize, usize, usize);
    // SAFETY: reads three registers into locals; touches no memory or stack.
    unsafe {
        core::arch::asm!(
            "lea {pc}, [rip]", "mov {sp}, rsp", "mov {fp}, rbp",
            pc = out(reg) pc, sp = out(reg) sp, fp = out(reg) fp,
            options(nomem, nostack, preserves_flags)
        )
    };
    let regs = super::unwind::Regs { pc, fp, sp };
    let (lo, hi) = super::unwind::current_stack_bounds().unwrap_or((0, 0));
    let map = super::dwarf::current().expect("modules published");
    let mut out = [0u64; super::MAX_FRAMES];
    let time = |f: &mut dyn FnMut() -> usize| {
        let start = Instant::now();
        let mut frames = 0;
        for _ in 0..iterations {
            frames = std::hint::black_box(f());
        }
        (
            start.elapsed().as_nanos() as f64 / f64::from(iterations),
            frames,
        )
    };
    let (frame_pointer_ns, frame_pointer_frames) = time(&mut || {
        // SAFETY: [lo, hi) is this thread's stack, and the registers were read in this
        // frame, which stays live below the walk (the walk's own frames lie below the
        // captured stack pointer).
        unsafe { super::unwind::walk(&regs, lo, hi, &mut out) }.0
    });
    let mut cache = super::dwarf::UnwindCache::new();
    let (dwarf_ns, dwarf_frames) = time(&mut || {
        // SAFETY: as for the frame-pointer walk above.
        unsafe { super::dwarf::walk(map, &regs, lo, hi, &mut cache, &mut out) }.depth
    });
    let cold_iterations = iterations.min(200);
    let mut caches: Vec<_> = (0..cold_iterations)
        .map(|_| super::dwarf::UnwindCache::new())
        .collect();
    let start = Instant::now();
    for c in &mut caches {
        // SAFETY: as for the frame-pointer walk above.
        std::hint::black_box(unsafe { super::dwarf::walk(map, &regs, lo, hi, c, &mut out) });
    }
    let dwarf_cold_ns = start.elapsed().as_nanos() as f64 / f64::from(cold_iterations);
    UnwindCost {
        frame_pointer_ns,
        frame_pointer_frames,
        dwarf_ns,
        dwarf_frames,
        dwarf_cold_ns,
    }
}
