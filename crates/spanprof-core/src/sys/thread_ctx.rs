//! The label slot as OpenTelemetry's thread context (OTEP 4947): the ELF TLS
//! variable `otel_thread_ctx_v1`, defined here in assembly (no C compiler needed),
//! with default visibility so that the executable can export it in `.dynsym`.
//!
//! It is the slot itself: a [`LabelRecord`] begins with its OTEP record
//! (`super::record::ThreadCtxRecord`, at offset 0 of a `#[repr(C)]` struct), so the
//! one pointer a push stores serves spanprof's signal handler and an outside reader
//! alike, and a push or a pop costs what it costs without the feature.
//!
//! Access is initial-exec: the variable's offset from the thread pointer is read
//! from the GOT (`@gottpoff`), which the linker turns into a constant when the
//! variable is in the executable (local-exec). So reading it is a plain TLS offset,
//! with no lazy initialisation or allocation: a signal handler may read it.

use std::sync::atomic::AtomicPtr;

use super::record::LabelRecord;

// One pointer per thread in `.tbss` (zero at thread start), a global TLS object of 8
// bytes. OTEP 4947 names the variable and asks for a pointer to the active record,
// null when none is.
std::arch::global_asm!(
    ".pushsection .tbss.otel_thread_ctx_v1,\"awT\",@nobits",
    ".globl otel_thread_ctx_v1",
    ".type otel_thread_ctx_v1,@object",
    ".size otel_thread_ctx_v1,8",
    ".p2align 3",
    "otel_thread_ctx_v1:",
    ".zero 8",
    ".popsection",
);

/// The name readers look up in `.dynsym`.
pub(crate) const SYMBOL: &std::ffi::CStr = c"otel_thread_ctx_v1";

/// Runs `f` with this thread's slot (`otel_thread_ctx_v1`).
#[inline(always)]
pub(crate) fn with_slot<R>(f: impl FnOnce(&AtomicPtr<LabelRecord>) -> R) -> R {
    let addr: usize;
    // SAFETY: 1. `fs:0` holds the thread control block's own address (the x86_64 TLS
    // ABI, glibc and musl alike), the thread pointer. 2. The GOT entry named by
    // `@gottpoff` holds the variable's (negative) offset from it, fixed for the
    // process's life (or a constant, once the linker relaxes it). 3. Neither memory
    // is written by this code, and the result depends on the thread only, which does
    // not change inside this synchronous call (`pure`).
    unsafe {
        std::arch::asm!(
            "mov {a}, qword ptr fs:[0]",
            "add {a}, qword ptr [rip + otel_thread_ctx_v1@gottpoff]",
            a = out(reg) addr,
            options(pure, readonly, nostack),
        );
    }
    // SAFETY: `addr` is this thread's `otel_thread_ctx_v1`: 8 bytes, 8-aligned,
    // zero-initialised, live as long as the thread; `AtomicPtr` has the layout of a
    // pointer. The reference does not leave `f`, which runs on this thread.
    f(unsafe { &*(addr as *const AtomicPtr<LabelRecord>) })
}

/// Whether the running executable exports `otel_thread_ctx_v1` in its dynamic
/// symbol table, where outside readers look for it: `dlsym` over the global scope
/// finds only exported symbols. It must find *this* variable, not another
/// library's of the same name.
pub(crate) fn symbol_exported() -> bool {
    // SAFETY: `SYMBOL` is NUL-terminated; RTLD_DEFAULT searches the global scope and
    // returns null when the symbol is not there. For a TLS symbol glibc returns the
    // calling thread's instance.
    let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, SYMBOL.as_ptr()) };
    let ours = with_slot(|s| s as *const AtomicPtr<LabelRecord> as usize);
    !found.is_null() && found as usize == ours
}
