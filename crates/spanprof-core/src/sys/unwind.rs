//! Frame-pointer unwinding from a signal's saved register context, checked at every
//! step against the interrupted thread's stack so that code without frame pointers
//! (glibc, for one) ends the walk cleanly instead of faulting.

use super::MAX_FRAMES;

/// Registers of the interrupted context.
pub(crate) struct Regs {
    pub(crate) pc: usize,
    pub(crate) fp: usize,
    pub(crate) sp: usize,
}

/// Reads pc, frame pointer and stack pointer from a `ucontext_t`.
///
/// # Safety
/// `uctx` must be the third argument of an `SA_SIGINFO` signal handler.
#[inline(always)]
pub(crate) unsafe fn regs(uctx: *const libc::c_void) -> Regs {
    let uc = uctx as *const libc::ucontext_t;
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller guarantees `uc` is the kernel-provided context.
        let g = unsafe { &(*uc).uc_mcontext.gregs };
        Regs {
            pc: g[libc::REG_RIP as usize] as usize,
            fp: g[libc::REG_RBP as usize] as usize,
            sp: g[libc::REG_RSP as usize] as usize,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: the caller guarantees `uc` is the kernel-provided context.
        let m = unsafe { &(*uc).uc_mcontext };
        Regs {
            pc: m.pc as usize,
            fp: m.regs[29] as usize,
            sp: m.sp as usize,
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = uc;
        Regs {
            pc: 0,
            fp: 0,
            sp: 0,
        }
    }
}

/// Walks the frame-pointer chain into `out` (leaf first). Returns the number of
/// frames and whether the walk stopped at [`MAX_FRAMES`] with frames left.
///
/// Every frame record read lies in `[max(sp, stack_lo), stack_hi)`, which is mapped
/// stack memory of the interrupted thread; the chain must move strictly upward.
///
/// # Safety
/// `[stack_lo, stack_hi)` must be the interrupted thread's stack (mapped), and the
/// handler must run on that thread.
#[inline(always)]
pub(crate) unsafe fn walk(
    regs: &Regs,
    stack_lo: usize,
    stack_hi: usize,
    out: &mut [u64; MAX_FRAMES],
) -> (usize, bool) {
    out[0] = regs.pc as u64;
    let mut n = 1;
    if regs.sp < stack_lo || regs.sp >= stack_hi {
        // Not on the thread's known stack (alternate stack, coroutine): pc only.
        return (n, false);
    }
    let lo = regs.sp;
    let mut fp = regs.fp;
    while n < MAX_FRAMES {
        if fp < lo || !fp.is_multiple_of(std::mem::align_of::<usize>()) || fp > stack_hi - 16 {
            return (n, false);
        }
        // SAFETY: `fp` and `fp + 8` are aligned and inside [sp, stack_hi - 8], the
        // mapped part of the interrupted thread's stack (caller's guarantee).
        let (next, ret) = unsafe { (*(fp as *const usize), *((fp + 8) as *const usize)) };
        if ret == 0 {
            return (n, false);
        }
        out[n] = ret as u64;
        n += 1;
        if next <= fp {
            return (n, false);
        }
        fp = next;
    }
    // Truncated if another valid frame record follows.
    let more = fp >= lo && fp.is_multiple_of(std::mem::align_of::<usize>()) && fp <= stack_hi - 16;
    (n, more)
}
