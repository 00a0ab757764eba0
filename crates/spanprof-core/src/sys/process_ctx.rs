//! OpenTelemetry's process context (OTEP 4719): a small mapping named `OTEL_CTX`
//! whose header points at a protobuf payload, for readers outside the process.
//!
//! Header, 32 bytes: `"OTEL_CTX"`, version (u32, 2), payload size (u32), the
//! `CLOCK_BOOTTIME` time of publication in ns (u64; 0 while an update is under way),
//! the payload's address (u64). The payload lives on the heap beside it; the mapping
//! is never inherited by a child (`MADV_DONTFORK`).
//!
//! The caller is the single writer (the safe half holds a lock around every call).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering, fence};

/// The header's format version (OTEP 4719: currently 2).
pub(crate) const VERSION: u32 = 2;
const SIGNATURE: &[u8; 8] = b"OTEL_CTX";
const HEADER_LEN: usize = 32;

/// How the mapping was made, which decides its name in `/proc/<pid>/maps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backing {
    /// A `memfd` (`/memfd:OTEL_CTX`, or `[anon_shmem:OTEL_CTX]` once named).
    Memfd,
    /// An anonymous mapping (`[anon:OTEL_CTX]`): memfds were refused.
    Anonymous,
}

/// The published mapping and the payload it points at.
pub(crate) struct ProcessCtxMapping {
    addr: *mut u8,
    len: usize,
    backing: Backing,
    published_at_ns: u64,
    /// The payload the header points at (kept alive while it does).
    payload: Box<[u8]>,
}

// SAFETY: the mapping is process memory owned by this value alone; its writer holds
// it behind a lock.
unsafe impl Send for ProcessCtxMapping {}

impl ProcessCtxMapping {
    /// Publishes `payload` in a new mapping (the OTEP's publication protocol).
    pub(crate) fn publish(payload: Vec<u8>) -> io::Result<ProcessCtxMapping> {
        let len = page_size().max(HEADER_LEN);
        let (addr, backing) = map(len)?;
        // SAFETY: `addr` is a fresh private mapping of `len` bytes, ours alone.
        if unsafe { libc::madvise(addr.cast(), len, libc::MADV_DONTFORK) } != 0 {
            let e = io::Error::last_os_error();
            unmap(addr, len);
            return Err(e);
        }
        let mut m = ProcessCtxMapping {
            addr,
            len,
            backing,
            published_at_ns: 0,
            payload: payload.into_boxed_slice(),
        };
        // SAFETY: the header's fields lie inside the mapping (32 of at least 4096
        // bytes, page-aligned); nobody reads them before the timestamp is written.
        unsafe {
            std::ptr::copy_nonoverlapping(SIGNATURE.as_ptr(), addr, 8);
            addr.add(8).cast::<u32>().write_volatile(VERSION);
            addr.add(12)
                .cast::<u32>()
                .write_volatile(m.payload.len() as u32);
            addr.add(24)
                .cast::<u64>()
                .write_volatile(m.payload.as_ptr() as u64);
        }
        fence(Ordering::SeqCst);
        m.stamp();
        name(addr, len, backing)?;
        Ok(m)
    }

    /// Points the header at `payload` (the OTEP's updating protocol): the timestamp
    /// goes to 0, the payload's address and size change, then a new timestamp, later
    /// than the last, is written.
    pub(crate) fn update(&mut self, payload: Vec<u8>) {
        let payload = payload.into_boxed_slice();
        self.timestamp().store(0, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        // SAFETY: the fields lie inside the mapping, which this value owns.
        unsafe {
            self.addr
                .add(12)
                .cast::<u32>()
                .write_volatile(payload.len() as u32);
            self.addr
                .add(24)
                .cast::<u64>()
                .write_volatile(payload.as_ptr() as u64);
        }
        fence(Ordering::SeqCst);
        // A reader still copying the old payload sees the timestamp change and reads
        // again: the old payload may go once the new one is stamped.
        let _old = std::mem::replace(&mut self.payload, payload);
        self.stamp();
        let _ = name(self.addr, self.len, self.backing);
    }

    /// How the mapping was made.
    pub(crate) fn backing(&self) -> Backing {
        self.backing
    }

    /// The mapping's address.
    pub(crate) fn address(&self) -> usize {
        self.addr as usize
    }

    fn timestamp(&self) -> &AtomicU64 {
        // SAFETY: offset 16 of the page-aligned mapping is 8-aligned and inside it;
        // the mapping lives as long as `self`.
        unsafe { &*self.addr.add(16).cast::<AtomicU64>() }
    }

    /// Writes a publication time later than the last one (never 0).
    fn stamp(&mut self) {
        let now = boottime_ns().max(self.published_at_ns + 1);
        self.published_at_ns = now;
        self.timestamp().store(now, Ordering::SeqCst);
    }
}

impl Drop for ProcessCtxMapping {
    fn drop(&mut self) {
        self.timestamp().store(0, Ordering::SeqCst);
        unmap(self.addr, self.len);
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// A private read-write mapping of `len` bytes: from a memfd named `OTEL_CTX` (the fd
/// closed once mapped), else anonymous.
fn map(len: usize) -> io::Result<(*mut u8, Backing)> {
    let name = c"OTEL_CTX";
    let mut fd = -1;
    for flags in [
        libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_NOEXEC_SEAL,
        libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
    ] {
        // SAFETY: `name` is NUL-terminated; memfd_create returns -1 on failure.
        fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
        if fd >= 0 {
            break;
        }
    }
    if fd >= 0 {
        // SAFETY: `fd` is the memfd just made, ours alone; mmap returns MAP_FAILED on
        // failure; the fd is closed whatever happens (the mapping keeps the file).
        let addr = unsafe {
            let addr = if libc::ftruncate(fd, len as libc::off_t) == 0 {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE,
                    fd,
                    0,
                )
            } else {
                libc::MAP_FAILED
            };
            libc::close(fd);
            addr
        };
        if addr != libc::MAP_FAILED {
            return Ok((addr.cast(), Backing::Memfd));
        }
    }
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok((addr.cast(), Backing::Anonymous))
}

fn unmap(addr: *mut u8, len: usize) {
    // SAFETY: `addr`/`len` is a mapping made by `map` and not used after this.
    unsafe { libc::munmap(addr.cast(), len) };
}

/// Names the mapping `OTEL_CTX` (Linux 5.17+ with `CONFIG_ANON_VMA_NAME`). A failure
/// is fine for a memfd (already named by its file); an anonymous mapping nobody can
/// name cannot be found, so that fails the publication.
fn name(addr: *mut u8, len: usize, backing: Backing) -> io::Result<()> {
    // SAFETY: `addr`/`len` is our mapping; the name is NUL-terminated and, as the
    // kernel copies it, need not outlive the call.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_VMA,
            libc::PR_SET_VMA_ANON_NAME as libc::c_ulong,
            addr as libc::c_ulong,
            len as libc::c_ulong,
            c"OTEL_CTX".as_ptr() as libc::c_ulong,
        )
    };
    if r != 0 && backing == Backing::Anonymous {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `CLOCK_BOOTTIME` in ns, the clock OTEP 4719 stamps publications with.
pub(crate) fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_BOOTTIME exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}
