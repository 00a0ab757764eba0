//! A preallocated single-producer single-consumer ring of raw samples.
//!
//! The producer is the signal handler of the owning thread (it cannot interrupt
//! itself: the signal is blocked while its handler runs); the consumer is the
//! collector thread. No allocation, no locks: two indices and release/acquire.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::MAX_FRAMES;
use super::record::LabelIds;

/// Flag bit: the work was hot when sampled.
pub(crate) const FLAG_PERF: u32 = 1 << 0;
/// Flag bit: the stack hit [`MAX_FRAMES`] and was cut.
pub(crate) const FLAG_TRUNCATED: u32 = 1 << 1;
/// Flag bit: a label record was in the slot.
pub(crate) const FLAG_LABELLED: u32 = 1 << 2;
/// Flag bit: a wall-clock sample (of a hot poll), not a CPU sample.
pub(crate) const FLAG_WALL: u32 = 1 << 3;

/// One sample as the signal handler writes it.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct RawSample {
    /// The labels' ids (all zero when no labels were in the slot).
    pub(crate) ids: LabelIds,
    pub(crate) weight_ns: u64,
    /// CLOCK_MONOTONIC nanoseconds.
    pub(crate) time_ns: u64,
    pub(crate) hot: u8,
    pub(crate) flags: u32,
    pub(crate) depth: u32,
    /// The callsite of the innermost `tracing` span entered outside labelled work on
    /// the sampled thread (0 for none): see `slot::outer_span`.
    pub(crate) outer_span: usize,
    pub(crate) frames: [u64; MAX_FRAMES],
}

impl RawSample {
    /// The frames, leaf first.
    pub(crate) fn frames(&self) -> &[u64] {
        &self.frames[..(self.depth as usize).min(MAX_FRAMES)]
    }
}

pub(crate) struct SampleRing {
    slots: Box<[UnsafeCell<MaybeUninit<RawSample>>]>,
    mask: u32,
    head: AtomicU32,
    tail: AtomicU32,
    dropped_full: AtomicU64,
}

// SAFETY: the slots are only accessed under the SPSC protocol of `write` and
// `drain` (the producer writes slots in [tail+len, tail+cap), the consumer reads
// slots in [tail, head)), which the head/tail release/acquire pairs order.
unsafe impl Sync for SampleRing {}
// SAFETY: as above; the ring owns plain data.
unsafe impl Send for SampleRing {}

impl SampleRing {
    /// A ring of `capacity` samples, rounded up to a power of two (at least 2).
    pub(crate) fn new(capacity: usize) -> Self {
        let cap = capacity.clamp(2, 1 << 20).next_power_of_two();
        let slots = (0..cap)
            .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
            .collect();
        SampleRing {
            slots,
            mask: (cap - 1) as u32,
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
            dropped_full: AtomicU64::new(0),
        }
    }

    /// Producer side: reserves the next slot and lets `fill` write it. Returns how
    /// many samples wait in the ring with this one, or `None` (and counts a drop)
    /// when the ring is full. Only the owning thread's signal handler may call this.
    #[inline]
    pub(crate) fn write(&self, fill: impl FnOnce(&mut RawSample)) -> Option<u32> {
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        let waiting = head.wrapping_sub(tail);
        if waiting > self.mask {
            self.dropped_full.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let cell = &self.slots[(head & self.mask) as usize];
        // SAFETY: 1. Single producer: only the owning thread's handler writes, and the
        // handler cannot nest (SIGPROF is blocked while it runs).
        // 2. The slot at `head` is not readable by the consumer, which only reads
        // [tail, head), and `head - tail <= mask` means it is not in that range.
        // 3. `RawSample` is plain old data, so writing into uninitialised memory
        // through `&mut` to a `MaybeUninit` is fine and `fill` writes every field.
        let sample = unsafe { (*cell.get()).as_mut_ptr() };
        // SAFETY: `sample` points at a slot we own exclusively (see above); we zero the
        // fixed fields before `fill` so nothing uninitialised is ever read.
        unsafe {
            std::ptr::write_bytes(
                sample.cast::<u8>(),
                0,
                std::mem::offset_of!(RawSample, frames),
            );
            fill(&mut *sample);
        }
        self.head.store(head.wrapping_add(1), Ordering::Release);
        Some(waiting + 1)
    }

    /// Half the ring's capacity: the fill at which the handler wakes the drain thread.
    #[inline]
    pub(crate) fn half(&self) -> u32 {
        // The capacity (mask + 1) is a power of two of at least 2.
        self.mask.div_ceil(2)
    }

    /// Consumer side: hands every sample written so far to `f`, in order, and frees
    /// their slots. Only one thread (the collector, or the owner after the thread
    /// stopped sampling) may drain at a time.
    pub(crate) fn drain(&self, mut f: impl FnMut(&RawSample)) -> usize {
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Acquire);
        let n = head.wrapping_sub(tail);
        for i in 0..n {
            let cell = &self.slots[(tail.wrapping_add(i) & self.mask) as usize];
            // SAFETY: slots in [tail, head) were fully written by the producer before
            // it published `head` with release, which our acquire load observed; the
            // producer does not touch them again until we advance `tail`.
            f(unsafe { (*cell.get()).assume_init_ref() });
        }
        self.tail.store(head, Ordering::Release);
        n as usize
    }

    /// Samples dropped because the ring was full.
    pub(crate) fn dropped_full(&self) -> u64 {
        self.dropped_full.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_drains_and_counts_drops() {
        let ring = SampleRing::new(4);
        for i in 0..6 {
            let waiting = ring.write(|s| {
                s.ids.span_id = i;
                s.depth = 1;
                s.frames[0] = 100 + i;
            });
            assert_eq!(waiting, (i < 4).then_some(i as u32 + 1));
        }
        assert_eq!(ring.dropped_full(), 2);
        let mut out = Vec::new();
        assert_eq!(
            ring.drain(|s| out.push((s.ids.span_id, s.frames().to_vec()))),
            4
        );
        assert_eq!(out.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(out[3].1, [103]);
        assert_eq!(ring.half(), 2);
        assert_eq!(ring.write(|s| s.ids.span_id = 9), Some(1));
        out.clear();
        assert_eq!(
            ring.drain(|s| out.push((s.ids.span_id, s.frames().to_vec()))),
            1
        );
        assert_eq!(out[0].0, 9);
    }
}
