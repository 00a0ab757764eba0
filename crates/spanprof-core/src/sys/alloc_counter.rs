//! A global allocator for tests: counts allocations made inside the profiling
//! signal handler (there must be none).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use super::handler::in_signal_handler;

thread_local! {
    // `const` and no `Drop`: reading it from the allocator never allocates.
    static THIS_THREAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Wraps the system allocator and counts every allocation, reallocation or free made
/// while the calling thread is inside spanprof's signal handler.
///
/// ```
/// #[global_allocator]
/// static ALLOC: spanprof_core::testing::HandlerAllocCounter =
///     spanprof_core::testing::HandlerAllocCounter::new();
/// # fn main() { assert_eq!(ALLOC.in_handler(), 0); }
/// ```
#[derive(Debug)]
pub struct HandlerAllocCounter {
    in_handler: AtomicU64,
    total: AtomicU64,
}

impl HandlerAllocCounter {
    /// A counter at zero.
    pub const fn new() -> Self {
        HandlerAllocCounter {
            in_handler: AtomicU64::new(0),
            total: AtomicU64::new(0),
        }
    }

    /// Allocator calls made inside the signal handler.
    pub fn in_handler(&self) -> u64 {
        self.in_handler.load(Ordering::Relaxed)
    }

    /// Allocator calls made in all.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Allocations (`alloc`, `alloc_zeroed`, `realloc`; not frees) made so far by
    /// the calling thread: what a piece of code allocates, measured around it, whatever
    /// other threads do meanwhile.
    pub fn allocations_on_this_thread(&self) -> u64 {
        THIS_THREAD.with(std::cell::Cell::get)
    }

    #[inline]
    fn count_allocation(&self) {
        THIS_THREAD.with(|c| c.set(c.get() + 1));
        self.count();
    }

    #[inline]
    fn count(&self) {
        self.total.fetch_add(1, Ordering::Relaxed);
        if in_signal_handler() {
            self.in_handler.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Default for HandlerAllocCounter {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees are ours; counting touches only atomics and a const
// thread-local, neither of which allocates.
unsafe impl GlobalAlloc for HandlerAllocCounter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.count_allocation();
        // SAFETY: forwarded unchanged (see the impl's comment).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.count_allocation();
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.count();
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.count_allocation();
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
