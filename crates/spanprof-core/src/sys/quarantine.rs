//! A global allocator for tests: poisons every freed small block and holds it back
//! from reuse for a while, so a read of freed memory sees the poison pattern instead
//! of whatever the allocator put there next.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The byte written over every block freed while poisoning is on.
pub const POISON_BYTE: u8 = 0xA5;
/// Freed blocks held back from the system allocator (the oldest goes back first).
const QUARANTINE: usize = 1 << 16;
/// Blocks larger than this are freed at once, unpoisoned.
const MAX_POISONED: usize = 1024;

/// Wraps the system allocator; while [`QuarantineAlloc::set_poisoning`] is on, every
/// freed block of up to 1 KiB is overwritten with [`POISON_BYTE`] and kept out of
/// circulation until 65 536 later frees have pushed it out. Label records are small,
/// so a signal handler that reads a freed one reads poison.
///
/// ```
/// #[global_allocator]
/// static ALLOC: spanprof_core::testing::QuarantineAlloc =
///     spanprof_core::testing::QuarantineAlloc::new();
/// # fn main() {
/// ALLOC.set_poisoning(true);
/// drop(Box::new(7u64));
/// assert_eq!(ALLOC.poisoned(), 1);
/// ALLOC.set_poisoning(false);
/// # }
/// ```
#[derive(Debug)]
pub struct QuarantineAlloc {
    on: AtomicBool,
    held: Mutex<Held>,
    poisoned: AtomicU64,
}

#[derive(Debug)]
struct Held {
    /// (address, size, align) of quarantined blocks; address 0 is an empty place.
    blocks: [(usize, usize, usize); QUARANTINE],
    next: usize,
}

impl QuarantineAlloc {
    /// An allocator with poisoning off.
    pub const fn new() -> Self {
        QuarantineAlloc {
            on: AtomicBool::new(false),
            held: Mutex::new(Held {
                blocks: [(0, 0, 0); QUARANTINE],
                next: 0,
            }),
            poisoned: AtomicU64::new(0),
        }
    }

    /// Turns poisoning and quarantine of freed blocks on or off.
    pub fn set_poisoning(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// Blocks poisoned so far.
    pub fn poisoned(&self) -> u64 {
        self.poisoned.load(Ordering::Relaxed)
    }
}

impl Default for QuarantineAlloc {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: allocation is forwarded to `System` unchanged. A freed block is written
// only while it is still ours (the caller gave it up) and is handed back to `System`
// later with the size and alignment it was allocated with. The bookkeeping is a
// futex-based mutex over a fixed array: it never allocates.
unsafe impl GlobalAlloc for QuarantineAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !self.on.load(Ordering::Relaxed) || layout.size() > MAX_POISONED {
            // SAFETY: forwarded unchanged.
            unsafe { System.dealloc(ptr, layout) };
            return;
        }
        // SAFETY: the block is `layout.size()` bytes and was given up by the caller.
        unsafe { std::ptr::write_bytes(ptr, POISON_BYTE, layout.size()) };
        self.poisoned.fetch_add(1, Ordering::Relaxed);
        let evicted = {
            let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
            let i = h.next % QUARANTINE;
            h.next = h.next.wrapping_add(1);
            std::mem::replace(
                &mut h.blocks[i],
                (ptr as usize, layout.size(), layout.align()),
            )
        };
        if evicted.0 != 0 {
            // SAFETY: 1. the evicted block was quarantined above with the size and
            // alignment of the layout `System` allocated it with, so they form a valid
            // layout; 2. it left the quarantine exactly once (it was replaced).
            unsafe {
                System.dealloc(
                    evicted.0 as *mut u8,
                    Layout::from_size_align_unchecked(evicted.1, evicted.2),
                )
            };
        }
    }
}
