//! Frame-pointer unwinding from a signal's saved register context, checked at every
//! step against the interrupted thread's stack so that code without frame pointers
//! (glibc, for one) ends the walk cleanly instead of faulting. The handler's choice
//! where there is no DWARF unwinder (`sys/dwarf.rs`), or when asked for
//! (`Unwinding::FramePointers`).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::MAX_FRAMES;

/// The main executable's code range, `[TEXT_LO, TEXT_HI)`: code built with frame
/// pointers, one contiguous readable mapping. Empty (0, 0) until set.
static TEXT_LO: AtomicUsize = AtomicUsize::new(0);
static TEXT_HI: AtomicUsize = AtomicUsize::new(0);

/// Sets the range of code that has frame pointers, for leaf-caller recovery.
pub(crate) fn set_frame_pointer_text(lo: usize, hi: usize) {
    TEXT_LO.store(lo, Ordering::Relaxed);
    TEXT_HI.store(hi, Ordering::Relaxed);
}

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

/// Whether the bytes before `ret` end a call instruction: `call rel32`
/// (`E8 xx xx xx xx`, through the PLT), `call [rip + disp32]` (`FF 15 xx xx xx xx`,
/// through the GOT) or `call reg` (`FF D0`..`FF D7`). A word on the stack that merely
/// points into the code (a saved function pointer) rarely passes.
///
/// # Safety
/// `[ret - 6, ret)` must be mapped, readable memory.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn follows_call(ret: usize) -> bool {
    // SAFETY: the caller guarantees `[ret - 6, ret)` is readable; k is 1..=6.
    let b = |k: usize| unsafe { *((ret - k) as *const u8) };
    b(5) == 0xE8 || (b(6) == 0xFF && b(5) == 0x15) || (b(2) == 0xFF && (b(1) & 0xF8) == 0xD0)
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
    // Leaf-caller recovery (x86_64): a sample inside code without frame pointers
    // (glibc's memcpy, say) leaves the frame pointer at its caller's frame record, so
    // the walk below would skip the caller itself. A leaf function that pushed
    // nothing has its return address at the stack pointer: when the pc is outside
    // the executable's code and the word at the stack pointer points into it, just
    // after a call instruction, that word is taken as the caller.
    #[cfg(target_arch = "x86_64")]
    {
        let text = TEXT_LO.load(Ordering::Relaxed)..TEXT_HI.load(Ordering::Relaxed);
        if !text.contains(&regs.pc)
            && regs.sp.is_multiple_of(std::mem::align_of::<usize>())
            && regs.sp <= stack_hi - 8
        {
            // SAFETY: `sp` is aligned and inside [stack_lo, stack_hi - 8] (checked
            // above), the mapped stack of the interrupted thread.
            let ret = unsafe { *(regs.sp as *const usize) };
            // SAFETY: `[ret - 6, ret)` lies inside the executable's code mapping
            // (`ret` in it and at least 6 bytes past its start), which is readable.
            if text.contains(&ret) && ret >= text.start + 6 && unsafe { follows_call(ret) } {
                out[n] = ret as u64;
                n += 1;
            }
        }
    }
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

/// Whether the code of this crate was compiled with frame pointers (and so, as
/// `RUSTFLAGS` apply to every crate of a build, probably the service's too): a
/// function reads its own frame pointer and checks that the return address in that
/// frame record points into its caller. `None` where this cannot be checked (not
/// x86_64, stack bounds unknown).
pub(crate) fn frame_pointers_present() -> Option<bool> {
    fp_probe_outer(std::hint::black_box(1))
}

#[inline(never)]
fn fp_probe_outer(x: usize) -> Option<bool> {
    let r = fp_probe_inner(x);
    // Used after the call, so the call is not a tail call (which would leave the
    // return address in `frame_pointers_present`).
    std::hint::black_box(r)
}

#[inline(never)]
fn fp_probe_inner(x: usize) -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        let fp: usize;
        // SAFETY: reads a register into a local; touches no memory, no stack.
        unsafe {
            core::arch::asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack, preserves_flags))
        };
        let here = std::hint::black_box(&x) as *const usize as usize;
        let (_, stack_hi) = current_stack_bounds()?;
        if fp < here || !fp.is_multiple_of(std::mem::align_of::<usize>()) || fp > stack_hi - 16 {
            return Some(false);
        }
        // SAFETY: `fp + 8` is aligned and inside [here, stack_hi - 8]: the live part
        // of this thread's own stack, above a local of this function.
        let ret = unsafe { *((fp + 8) as *const usize) };
        let caller = fp_probe_outer as fn(usize) -> Option<bool> as usize;
        Some(ret > caller && ret < caller + 4096)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = x;
        None
    }
}

/// The calling thread's stack as `[lo, hi)`.
pub(crate) fn current_stack_bounds() -> Option<(usize, usize)> {
    // SAFETY: `attr` is initialised by pthread_getattr_np before use and destroyed
    // once; the out-pointers are valid.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 || addr.is_null() {
            return None;
        }
        Some((addr as usize, addr as usize + size))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_probe_finds_the_frame_pointers_the_build_has() {
        // scripts/test says which build this is: the project's (.cargo/config.toml,
        // frame pointers) or the second pass's (none).
        let expected = match std::env::var("SPANPROF_EXPECT_FRAME_POINTERS").as_deref() {
            Ok("0") => false,
            Ok("1") => true,
            _ => return,
        };
        assert_eq!(super::frame_pointers_present(), Some(expected));
    }
}
