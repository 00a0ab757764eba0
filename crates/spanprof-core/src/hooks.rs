//! tokio runtime integration: sampler registration for every runtime thread and,
//! with `--cfg tokio_unstable`, label inheritance by spawned tasks.
//!
//! A task spawned while labels are active captures them at spawn (`on_task_spawn`
//! runs on the spawning thread), pushes them around every one of its polls
//! (`on_before_task_poll` / `on_after_task_poll`, on whichever worker polls it) and
//! releases them at `on_task_terminate` (tokio runs that hook inside the task's final
//! poll, so the release then waits for the after-poll hook: the slot points at the
//! labels until it). Inherited labels do not keep the span alive: a task that
//! outlives its span runs on as *detached* work (see [`crate::SpanLabels`]). The task-to-labels table is a fixed-size,
//! lock-free open-addressing table indexed by task id, so the poll hooks take no
//! lock and allocate nothing; when it is full a new task runs unlabelled and the
//! overflow is counted ([`inheritance_stats`]).
//!
//! `spawn_blocking` gets no task hooks from tokio; use [`crate::spawn_blocking`],
//! which captures the labels and pushes them around the closure.

use std::sync::atomic::{AtomicU64, Ordering};

/// Installs spanprof on a tokio runtime builder: every worker and blocking thread
/// registers for sampling when it starts and deregisters when it stops, and (with
/// `--cfg tokio_unstable`) spawned tasks inherit the labels active at spawn.
///
/// This sets the builder's `on_thread_start` / `on_thread_stop` callbacks (and the
/// task hooks), replacing any set before; call [`on_thread_start`] /
/// [`on_thread_stop`] from your own callbacks to combine them. `#[tokio::main]`
/// builds its runtime itself and cannot call this: build the runtime yourself.
///
/// Without `--cfg tokio_unstable` tokio has no task hooks: this logs one warning
/// ([`crate::setup::NO_TOKIO_UNSTABLE`]) saying that spawned tasks will not inherit
/// labels, and how to add the cfg.
///
/// ```
/// let mut builder = tokio::runtime::Builder::new_multi_thread();
/// spanprof_core::install_runtime_hooks(&mut builder);
/// let rt = builder.worker_threads(2).enable_all().build().unwrap();
/// rt.block_on(async {});
/// ```
pub fn install_runtime_hooks(
    builder: &mut tokio::runtime::Builder,
) -> &mut tokio::runtime::Builder {
    crate::setup::runtime_hooks_installed();
    builder.on_thread_start(on_thread_start);
    builder.on_thread_stop(on_thread_stop);
    #[cfg(tokio_unstable)]
    {
        builder.on_task_spawn(task_table::on_spawn);
        builder.on_before_task_poll(task_table::on_before_poll);
        builder.on_after_task_poll(task_table::on_after_poll);
        builder.on_task_terminate(task_table::on_terminate);
    }
    builder
}

/// What [`install_runtime_hooks`] runs when a runtime thread starts.
pub fn on_thread_start() {
    crate::register_current_thread();
}

/// What [`install_runtime_hooks`] runs when a runtime thread stops.
pub fn on_thread_stop() {
    crate::deregister_current_thread();
}

/// Whether this build carries labels into spawned tasks (`--cfg tokio_unstable`).
pub const TASK_INHERITANCE: bool = cfg!(tokio_unstable);

/// Counters of label inheritance by spawned tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct InheritanceStats {
    /// Tasks that captured labels at spawn.
    pub inherited: u64,
    /// Labelled tasks alive now.
    pub live: u64,
    /// Tasks that should have inherited labels but found the table full.
    pub overflowed: u64,
}

/// The counters, written at labelled spawns and terminations only (never read by a
/// poll), on a line of their own.
#[repr(align(64))]
struct Counters {
    inherited: AtomicU64,
    live: AtomicU64,
    overflowed: AtomicU64,
}

static COUNTERS: Counters = Counters {
    inherited: AtomicU64::new(0),
    live: AtomicU64::new(0),
    overflowed: AtomicU64::new(0),
};

/// Label inheritance counters.
pub fn inheritance_stats() -> InheritanceStats {
    InheritanceStats {
        inherited: COUNTERS.inherited.load(Ordering::Relaxed),
        live: COUNTERS.live.load(Ordering::Relaxed),
        overflowed: COUNTERS.overflowed.load(Ordering::Relaxed),
    }
}

#[cfg(tokio_unstable)]
mod task_table {
    use std::hash::{Hash, Hasher};
    use std::ptr;
    use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicU64, Ordering};

    use super::COUNTERS;
    use crate::sys::record::LabelRecord;
    use crate::sys::slot;

    /// Slots in the table: the most labelled tasks alive at once (16 bytes each).
    const SLOTS: usize = 1 << 15;
    const PROBES: usize = 8;

    struct Entry {
        key: AtomicU64,
        record: AtomicPtr<LabelRecord>,
    }

    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Entry = Entry {
        key: AtomicU64::new(0),
        record: AtomicPtr::new(ptr::null_mut()),
    };
    static TABLE: [Entry; SLOTS] = [EMPTY; SLOTS];

    /// Labelled tasks alive per filter slot (by the low bits of the task id): a poll
    /// of a task whose slot counts none reads one byte of these 512 and nothing
    /// else. Written only when a labelled task is spawned or ends, so the lines stay
    /// in every worker's cache while no labelled task runs. A slot that reached 255
    /// stays there (the table is still asked; nothing is wrong, only slower).
    #[repr(align(64))]
    struct Filter([AtomicU8; FILTER_SLOTS]);

    const FILTER_SLOTS: usize = 512;

    static FILTER: Filter = Filter([const { AtomicU8::new(0) }; FILTER_SLOTS]);

    fn filter_slot(key: u64) -> &'static AtomicU8 {
        &FILTER.0[key as usize % FILTER_SLOTS]
    }

    /// tokio's task id as the `u64` its `Hash` impl writes.
    fn key(id: tokio::task::Id) -> u64 {
        struct Capture(u64);
        impl Hasher for Capture {
            fn finish(&self) -> u64 {
                self.0
            }
            fn write(&mut self, bytes: &[u8]) {
                for b in bytes {
                    self.0 = self.0.rotate_left(8) ^ u64::from(*b);
                }
            }
            fn write_u64(&mut self, v: u64) {
                self.0 ^= v;
            }
        }
        let mut h = Capture(0);
        id.hash(&mut h);
        h.0.max(1)
    }

    fn slots(key: u64) -> impl Iterator<Item = &'static Entry> {
        let start = key as usize;
        (0..PROBES).map(move |i| &TABLE[(start.wrapping_add(i)) % SLOTS])
    }

    pub(super) fn on_spawn(meta: &tokio::runtime::TaskMeta<'_>) {
        let record = slot::retain_current_raw();
        if record.is_null() {
            return;
        }
        let k = key(meta.id());
        for e in slots(k) {
            if e.key
                .compare_exchange(0, k, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                e.record.store(record.cast_mut(), Ordering::Release);
                // Counted in the filter once findable in the table.
                let f = filter_slot(k);
                let _ = f.fetch_update(Ordering::Release, Ordering::Relaxed, |n| {
                    (n != u8::MAX).then(|| n + 1)
                });
                COUNTERS.live.fetch_add(1, Ordering::Relaxed);
                COUNTERS.inherited.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        COUNTERS.overflowed.fetch_add(1, Ordering::Relaxed);
        slot::release_raw(record);
    }

    fn find(k: u64) -> Option<&'static Entry> {
        slots(k).find(|e| e.key.load(Ordering::Acquire) == k)
    }

    /// The record of labelled task `k`, if it is one: this thread's recent ones
    /// first, then (if the filter counts a labelled task in its slot) the table.
    #[inline]
    fn record_of(k: u64) -> *const LabelRecord {
        // The labelled tasks this thread polled last: a labelled task polled again on
        // the same worker is found there, not in the table. An entry of a task that
        // has ended is never matched again (task ids are never reused), and its
        // record is never read through it.
        let (key, cached) = slot::recent_task(k);
        if key == k {
            return cached;
        }
        if filter_slot(k).load(Ordering::Acquire) == 0 {
            return ptr::null();
        }
        let Some(record) = find(k).map(|e| e.record.load(Ordering::Acquire).cast_const()) else {
            return ptr::null();
        };
        if !record.is_null() {
            slot::set_recent_task(k, record);
        }
        record
    }

    pub(super) fn on_before_poll(meta: &tokio::runtime::TaskMeta<'_>) {
        let k = key(meta.id());
        slot::hook_push(record_of(k), k, crate::poll::entered);
    }

    pub(super) fn on_after_poll(_meta: &tokio::runtime::TaskMeta<'_>) {
        slot::hook_pop();
    }

    pub(super) fn on_terminate(meta: &tokio::runtime::TaskMeta<'_>) {
        let k = key(meta.id());
        if filter_slot(k).load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(e) = find(k) {
            let record = e.record.swap(ptr::null_mut(), Ordering::AcqRel);
            e.key.store(0, Ordering::Release);
            let _ = filter_slot(k).fetch_update(Ordering::Release, Ordering::Relaxed, |n| {
                (n != u8::MAX && n != 0).then(|| n - 1)
            });
            slot::forget_recent_task(k);
            COUNTERS.live.fetch_sub(1, Ordering::Relaxed);
            // Inside the task's final poll the slot still points at the record:
            // the release waits for the after-poll hook.
            slot::hook_release(record, k);
        }
    }
}
