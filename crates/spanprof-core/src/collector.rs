//! The collector: a drain thread empties every thread's sample ring at a fixed
//! interval into a bounded queue, and a processing thread symbolizes new stacks off
//! the hot path and feeds the store. Two threads, so that a slow symbolization (the
//! first DWARF parse takes a while) never leaves the rings undrained.
//!
//! Its caches (symbolized stacks by raw addresses, the symbolizer's frames and
//! names, the labels of open windows) are bounded by bytes, together
//! [`crate::ProfilerBuilder::cache_bytes`], with evictions counted; their figures
//! are in [`crate::Profiler::memory_stats`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cache::{BoundedCache, CacheStats};
use crate::profile::TRUNCATED_ADDR;
use crate::profile::{Hotness, SampleLabels, Stack};
use crate::store::{IncomingLabels, IncomingSample, SpanProfileStore};
use crate::symbolize::AddressSymbolizer;
use crate::sys;
use crate::sys::record::LabelIds;
use crate::sys::ring::{FLAG_LABELLED, FLAG_TRUNCATED, FLAG_WALL, RawSample};
use crate::window::WindowInner;

/// Most samples waiting for symbolization; past it samples are dropped and counted.
pub(crate) const MAX_BACKLOG: usize = 1 << 16;

/// How often an idle collector looks for a `tracing` subscriber while a start-up
/// message waits for one, or runs a filter check left to it.
const PENDING_LOG_POLL: Duration = Duration::from_millis(200);

/// Shares of [`crate::ProfilerBuilder::cache_bytes`], in eighths: symbolized stacks
/// by raw addresses, the symbolizer's frames and names; window labels get the rest.
const STACK_CACHE_EIGHTHS: usize = 4;
const SYMBOL_CACHE_EIGHTHS: usize = 3;

/// A drained sample: labels and its frames only (the ring slot is fixed-size).
struct Drained {
    labels: Option<(LabelIds, Hotness)>,
    addrs: Box<[u64]>,
    time_ns: u64,
    weight_ns: u64,
    /// A wall-clock sample, not a CPU sample.
    wall: bool,
    /// The callsite of the innermost unprofiled `tracing` span the sample was taken
    /// under (0: none).
    outer_span: usize,
}

impl Drained {
    /// Estimated bytes while queued.
    fn bytes(&self) -> usize {
        std::mem::size_of::<Drained>() + std::mem::size_of_val(&*self.addrs)
    }
}

#[derive(Default)]
struct Queue {
    samples: VecDeque<Drained>,
    /// Estimated bytes of `samples`.
    bytes: usize,
    enqueued: u64,
    processed: u64,
    stop: bool,
    /// When the latest drain whose samples are queued began (monotonic ns): every
    /// sample written before it is queued or processed.
    drained_at_ns: u64,
}

/// The collector's memory figures, published after each batch.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CollectorMemory {
    pub(crate) stacks: CacheStats,
    pub(crate) symbols: CacheStats,
    pub(crate) labels: CacheStats,
    pub(crate) windows: usize,
    pub(crate) window_entries: usize,
    pub(crate) window_bytes: usize,
}

struct Shared {
    queue: Mutex<Queue>,
    cv: Condvar,
    dropped_backlog: AtomicU64,
    memory: Mutex<CollectorMemory>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Empties every ring into the queue. Rings are drained under the registry lock,
    /// so any thread may call this (one consumer per ring at a time). Returns when the
    /// pass began if it found nothing and the collector had processed everything
    /// before it: then every sample written before that moment is in the store.
    fn drain(&self) -> Option<u64> {
        // Compacted straight out of the rings: a ring slot is a fixed-size sample of
        // about 1 KiB, most of it unused frames, so nothing copies whole slots.
        let started = sys::monotonic_now_ns();
        let mut drained: Vec<Drained> = Vec::new();
        {
            let mut reg = crate::threads::registry();
            for t in &reg.threads {
                t.ring.drain(|s| drained.push(compact(s)));
            }
            crate::threads::prune_retired(&mut reg);
        }
        let mut q = self.lock();
        q.drained_at_ns = q.drained_at_ns.max(started);
        if drained.is_empty() {
            let idle = (q.processed == q.enqueued).then_some(started);
            drop(q);
            if crate::setup::filters::waiting() {
                // A filter check waits for the collector, which may be asleep for
                // want of samples.
                self.cv.notify_all();
            }
            return idle;
        }
        for d in drained {
            if q.samples.len() >= MAX_BACKLOG {
                self.dropped_backlog.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            q.bytes += d.bytes();
            q.samples.push_back(d);
            q.enqueued += 1;
        }
        drop(q);
        self.cv.notify_all();
        None
    }
}

fn compact(s: &RawSample) -> Drained {
    let mut addrs = Vec::with_capacity(s.frames().len() + 1);
    addrs.extend_from_slice(s.frames());
    if s.flags & FLAG_TRUNCATED != 0 {
        addrs.push(TRUNCATED_ADDR);
    }
    Drained {
        labels: (s.flags & FLAG_LABELLED != 0).then_some((s.ids, Hotness::from_u8(s.hot))),
        addrs: addrs.into(),
        time_ns: s.time_ns,
        weight_ns: s.weight_ns,
        wall: s.flags & FLAG_WALL != 0,
        outer_span: s.outer_span,
    }
}

/// Samples taken under `tracing` spans entered outside labelled work, per callsite:
/// (unlabelled, labelled). Spans most of whose samples are unlabelled are CPU-heavy
/// work nothing profiles (background jobs); a request span has the layer's labels
/// pushed inside it, so most of its samples are labelled.
#[derive(Default)]
struct UnprofiledSpans(crate::cache::FastMap<usize, (u64, u64)>);

impl UnprofiledSpans {
    /// Spans counted at once; past it the counts start over.
    const MAX: usize = 1024;

    fn count(&mut self, batch: &[Drained]) {
        for d in batch.iter().filter(|d| d.outer_span != 0) {
            if self.0.len() >= Self::MAX && !self.0.contains_key(&d.outer_span) {
                self.0.clear();
            }
            let c = self.0.entry(d.outer_span).or_default();
            if d.labels.is_some() {
                c.1 += 1;
            } else {
                c.0 += 1;
            }
        }
        if let Some((&callsite, &(unlabelled, _))) = self
            .0
            .iter()
            .find(|&(_, &(u, l))| crate::setup::is_unprofiled_work(u, l))
            && let Some(meta) = sys::outer_span_metadata(callsite)
        {
            crate::setup::report_unprofiled_span(meta.name(), meta.target(), unlabelled);
        }
    }
}

pub(crate) struct Collector {
    pub(crate) windows: Arc<Mutex<Vec<Weak<WindowInner>>>>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    store: SpanProfileStore,
}

impl Collector {
    pub(crate) fn start(
        store: SpanProfileStore,
        interval: Duration,
        cache_bytes: usize,
    ) -> Collector {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            dropped_backlog: AtomicU64::new(0),
            memory: Mutex::new(CollectorMemory::default()),
        });
        let kept = store.clone();
        let drainer = {
            let shared = shared.clone();
            let store = store.clone();
            std::thread::Builder::new()
                .name("spanprof-drain".into())
                .spawn(move || {
                    // Not on `cv`: the collector's notifications after each batch
                    // would wake it for nothing. It sleeps its interval, or until a
                    // signal handler finds its ring half full, or until `shutdown`.
                    loop {
                        // Read before the pass: a request made after this read
                        // (a ring reaching half full, or `shutdown`, which sets
                        // `stop` first) changes the word, so the wait returns at
                        // once; one made before it is covered by the pass, which
                        // empties every ring.
                        let seen = sys::drain_requests();
                        if let Some(all_in) = shared.drain() {
                            // Nothing new: long polls that ended before this pass
                            // have every sample in the store.
                            crate::long_poll::emit_ready(&store, all_in);
                        }
                        sys::refresh_unwind_modules(true);
                        if shared.lock().stop {
                            break;
                        }
                        sys::wait_for_drain_request(seen, interval);
                    }
                })
                .expect("spawn the spanprof drain thread")
        };
        let windows: Arc<Mutex<Vec<Weak<WindowInner>>>> = Arc::default();
        let processor = {
            let shared = shared.clone();
            let windows = windows.clone();
            std::thread::Builder::new()
                .name("spanprof-collector".into())
                .spawn(move || process(shared, store, windows, cache_bytes))
                .expect("spawn the spanprof collector thread")
        };
        Collector {
            windows,
            shared,
            threads: vec![drainer, processor],
            store: kept,
        }
    }

    /// Drains every ring now and waits until the store has everything drained.
    pub(crate) fn flush(&self) {
        if let Some(all_in) = self.shared.drain() {
            crate::long_poll::emit_ready(&self.store, all_in);
        }
        let mut q = self.shared.lock();
        let target = q.enqueued;
        while q.processed < target && !q.stop {
            q = self.shared.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Samples dropped because the symbolization backlog was full.
    pub(crate) fn dropped_backlog(&self) -> u64 {
        self.shared.dropped_backlog.load(Ordering::Relaxed)
    }

    /// The caches' figures after the last batch, and the backlog's bytes now.
    pub(crate) fn memory(&self) -> (CollectorMemory, usize) {
        let m = *self.shared.memory.lock().unwrap_or_else(|e| e.into_inner());
        (m, self.shared.lock().bytes)
    }

    /// Drains what is left, processes it and stops both threads.
    pub(crate) fn stop(mut self) {
        self.flush();
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.lock().stop = true;
        self.shared.cv.notify_all();
        sys::request_drain();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn process(
    shared: Arc<Shared>,
    store: SpanProfileStore,
    windows: Arc<Mutex<Vec<Weak<WindowInner>>>>,
    cache_bytes: usize,
) {
    crate::setup::filters::on_collector_thread();
    let eighth = cache_bytes / 8;
    let mut symbolizer = AddressSymbolizer::new(SYMBOL_CACHE_EIGHTHS * eighth);
    let mut stacks = StackCache::new(STACK_CACHE_EIGHTHS * eighth);
    let mut labels_cache: LabelsCache =
        BoundedCache::new(cache_bytes - (STACK_CACHE_EIGHTHS + SYMBOL_CACHE_EIGHTHS) * eighth);
    let mut unprofiled = UnprofiledSpans::default();
    let mut drained_at;
    loop {
        let batch: Vec<Drained> = {
            let mut q = shared.lock();
            while q.samples.is_empty() && !q.stop {
                if crate::setup::pending() {
                    // A start-up message waits for a subscriber, or a filter check
                    // for this thread: look again soon, however idle the service.
                    q = shared
                        .cv
                        .wait_timeout(q, PENDING_LOG_POLL)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    if q.samples.is_empty() && !q.stop {
                        drop(q);
                        crate::setup::emit_pending();
                        q = shared.lock();
                    }
                } else {
                    q = shared.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            }
            if q.samples.is_empty() && q.stop {
                drop(q);
                // A filter check left to this thread is run before it ends.
                crate::setup::emit_pending();
                return;
            }
            q.bytes = 0;
            drained_at = q.drained_at_ns;
            q.samples.drain(..).collect()
        };
        crate::setup::emit_pending();
        crate::setup::filters::after_batch(batch.len() as u64);
        unprofiled.count(&batch);
        // Symbolize outside the store's lock, so queries never wait for DWARF parsing:
        // the batch's new addresses in one call, then each stack from the caches.
        symbolizer.prefetch(
            batch
                .iter()
                .map(|d| &*d.addrs)
                .filter(|addrs| stacks.cache.peek(*addrs).is_none()),
        );
        let batch_stacks: Vec<Stack> = batch
            .iter()
            .map(|d| stacks.stack(&d.addrs, &mut symbolizer))
            .collect();
        // Each sample's labels resolved to strings once, here, for the store and the
        // windows alike (one cache lookup per sample).
        let samples: Vec<IncomingSample<'_>> = batch
            .iter()
            .map(|d| IncomingSample {
                labels: d.labels.map(|(ids, hot)| IncomingLabels {
                    ids,
                    hot,
                    resolved: resolve_labels(&mut labels_cache, ids, hot),
                }),
                addrs: &d.addrs,
                time_ns: d.time_ns,
                weight_ns: d.weight_ns,
                wall: d.wall,
            })
            .collect();
        store.insert(&samples, |addrs| match stacks.cache.peek(addrs) {
            Some(s) => s.clone(),
            None => symbolizer.stack(addrs),
        });
        let open = feed_windows(&windows, &samples, &batch_stacks);
        // Long polls that ended before this batch was drained have all their samples
        // in the store now: logged with where their time went.
        crate::long_poll::emit_ready(&store, drained_at);
        *shared.memory.lock().unwrap_or_else(|e| e.into_inner()) = CollectorMemory {
            stacks: stacks.cache.stats(),
            symbols: symbolizer.stats(),
            labels: labels_cache.stats(),
            windows: open.len(),
            window_entries: open.iter().map(|w| w.entries()).sum(),
            window_bytes: open.iter().map(|w| w.bytes()).sum(),
        };
        drop(open);
        let mut q = shared.lock();
        q.processed += batch.len() as u64;
        drop(q);
        shared.cv.notify_all();
    }
}

/// Symbolized stacks by raw addresses, so a stack seen again costs one lookup.
struct StackCache {
    cache: BoundedCache<Box<[u64]>, Stack>,
}

impl StackCache {
    fn new(max_bytes: usize) -> Self {
        StackCache {
            cache: BoundedCache::new(max_bytes),
        }
    }

    /// The symbolized stack of `addrs`, from the cache or the symbolizer.
    fn stack(&mut self, addrs: &[u64], symbolizer: &mut AddressSymbolizer) -> Stack {
        if let Some(s) = self.cache.get(addrs) {
            return s.clone();
        }
        let provisional = symbolizer.provisional;
        let s = symbolizer.stack(addrs);
        if symbolizer.provisional != provisional {
            // Named in part before its code could be looked up: asked again later.
            return s;
        }
        // The key's slice, and the frames in their shared allocation (the store
        // may share it too; counted here in full).
        let bytes = std::mem::size_of_val(addrs)
            + 2 * std::mem::size_of::<usize>()
            + std::mem::size_of_val(&*s);
        self.cache.insert(addrs.into(), s.clone(), bytes);
        s
    }
}

/// Resolved labels by (ids, hotness): one resolution per distinct value.
type LabelsCache = BoundedCache<(LabelIds, Hotness), Arc<SampleLabels>>;

/// `ids` at `hot`, resolved to strings, from the cache or the interner.
fn resolve_labels(cache: &mut LabelsCache, ids: LabelIds, hot: Hotness) -> Arc<SampleLabels> {
    if let Some(labels) = cache.get(&(ids, hot)) {
        return labels.clone();
    }
    let labels = Arc::new(ids.resolve(hot));
    cache.insert(
        (ids, hot),
        labels.clone(),
        2 * std::mem::size_of::<usize>() + std::mem::size_of::<SampleLabels>(),
    );
    labels
}

/// Adds a batch to every open window (full labels per sample); returns the open
/// windows.
fn feed_windows(
    windows: &Mutex<Vec<Weak<WindowInner>>>,
    samples: &[IncomingSample<'_>],
    stacks: &[Stack],
) -> Vec<Arc<WindowInner>> {
    let live: Vec<Arc<WindowInner>> = {
        let mut w = windows.lock().unwrap_or_else(|e| e.into_inner());
        w.retain(|w| w.strong_count() > 0);
        w.iter().filter_map(Weak::upgrade).collect()
    };
    if live.is_empty() {
        return live;
    }
    for (s, stack) in samples.iter().zip(stacks) {
        let labels = s
            .labels
            .as_ref()
            .filter(|l| l.ids.is_named())
            .map(|l| l.resolved.clone());
        for w in &live {
            w.add(&labels, stack, s.weight_ns, s.wall);
        }
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(ids: LabelIds, hot: u8, flags: u32, frames: &[u64]) -> RawSample {
        let mut s = RawSample {
            ids,
            weight_ns: 0,
            time_ns: 0,
            hot,
            flags,
            depth: frames.len() as u32,
            outer_span: 0,
            frames: [0; crate::sys::MAX_FRAMES],
        };
        s.frames[..frames.len()].copy_from_slice(frames);
        s
    }

    fn ids(span_id: u64, route: &str) -> LabelIds {
        LabelIds {
            trace_id: 0xabc,
            span_id,
            parent_span_id: 0,
            root_span_id: span_id,
            span_name: crate::intern::intern("collector test"),
            route: crate::intern::intern(route),
        }
    }

    #[test]
    fn compacting_keeps_the_ids_and_marks_a_truncated_stack() {
        let labelled = raw(ids(7, "/a"), 1, FLAG_LABELLED | FLAG_TRUNCATED, &[1, 2]);
        let d = compact(&labelled);
        assert_eq!(d.labels, Some((ids(7, "/a"), Hotness::Sampled)));
        assert_eq!(&*d.addrs, &[1, 2, TRUNCATED_ADDR]);
        let unlabelled = raw(ids(7, "/a"), 0, 0, &[3]);
        let d = compact(&unlabelled);
        assert_eq!(d.labels, None, "no FLAG_LABELLED, no labels");
        assert_eq!(&*d.addrs, &[3]);
    }

    #[test]
    fn labels_are_resolved_once_per_ids_and_hotness_and_shared() {
        let mut cache = LabelsCache::new(1 << 20);
        let a = resolve_labels(&mut cache, ids(1, "/r"), Hotness::Cold);
        let again = resolve_labels(&mut cache, ids(1, "/r"), Hotness::Cold);
        assert!(Arc::ptr_eq(&a, &again), "one resolution, shared");
        assert_eq!(
            (&*a.span_name, &*a.route, a.span_id),
            ("collector test", "/r", 1)
        );
        let hot = resolve_labels(&mut cache, ids(1, "/r"), Hotness::Slow);
        assert!(!Arc::ptr_eq(&a, &hot));
        assert_eq!(hot.hot, Hotness::Slow);
        assert_eq!(cache.stats().entries, 2);
    }

    #[test]
    fn windows_get_the_resolved_labels_of_named_samples_only() {
        let (window, weak) = crate::window::ProfileWindow::new(100, 1_000_000);
        let windows = Mutex::new(vec![weak]);
        let mut cache = LabelsCache::new(1 << 20);
        let named = ids(5, "/w");
        let resolved = resolve_labels(&mut cache, named, Hotness::Cold);
        let nameless = LabelIds::NONE;
        let samples = [
            IncomingSample {
                labels: Some(IncomingLabels {
                    ids: named,
                    hot: Hotness::Cold,
                    resolved: resolved.clone(),
                }),
                addrs: &[1],
                time_ns: 0,
                weight_ns: 10,
                wall: false,
            },
            IncomingSample {
                labels: Some(IncomingLabels {
                    ids: nameless,
                    hot: Hotness::Cold,
                    resolved: resolve_labels(&mut cache, nameless, Hotness::Cold),
                }),
                addrs: &[1],
                time_ns: 0,
                weight_ns: 20,
                wall: false,
            },
        ];
        let stack: Stack = Arc::from(Vec::new());
        let open = feed_windows(&windows, &samples, &[stack.clone(), stack]);
        assert_eq!(open.len(), 1);
        let profile = window.take();
        let mut by_labels: Vec<(Option<u64>, u64)> = profile
            .samples
            .iter()
            .map(|s| (s.labels.as_ref().map(|l| l.span_id), s.cpu_ns))
            .collect();
        by_labels.sort();
        assert_eq!(by_labels, [(None, 20), (Some(5), 10)]);
        let shared = profile
            .samples
            .iter()
            .find_map(|s| s.labels.clone())
            .unwrap();
        assert!(
            Arc::ptr_eq(&shared, &resolved),
            "the collector's Arc, not a copy"
        );
    }

    #[test]
    fn a_stack_named_before_its_code_could_be_mapped_is_not_kept() {
        // An address outside every known mapping, met within a second of the last
        // re-read of the mappings, gets its hex value as a name for now (it may be
        // code loaded since): a stack holding it must be symbolized again later, not
        // kept with that name.
        let (lo, _) = crate::symbolize::executable_text().expect("this test binary's code");
        let mut symbolizer = AddressSymbolizer::new(1 << 20);
        let mut cache = StackCache::new(1 << 20);
        cache.stack(&[lo + 64], &mut symbolizer);
        // The first stray address re-reads the mappings; the next one, within the
        // interval, cannot.
        cache.stack(&[0x10, lo + 64], &mut symbolizer);
        let provisional = [0x20, lo + 64];
        let s = cache.stack(&provisional, &mut symbolizer);
        assert!(s.iter().any(|f| &*f.function == "0x20"), "{s:?}");
        assert!(
            cache.cache.peek(&provisional[..]).is_none(),
            "a stack with a provisional name was cached"
        );
        assert!(cache.cache.peek(&[lo + 64][..]).is_some());
    }

    #[test]
    fn the_stack_cache_stays_within_its_bound_and_counts_evictions() {
        const MAX: usize = 1 << 20;
        let mut symbolizer = AddressSymbolizer::new(MAX);
        let mut cache = StackCache::new(MAX);
        // Distinct stacks of 24 frames from 64 addresses in this crate's code, each
        // ending in an address of its own in that code: many more than fit 1 MiB
        // (each is a few KiB once symbolized).
        let base = process as *const () as u64;
        let stacks = 5_000u64;
        for i in 0..stacks {
            let addrs: Vec<u64> = (0..24).map(|k| base + ((i >> (k % 12)) & 63)).collect();
            let addrs: Vec<u64> = std::iter::once(base + 64 + i % 7)
                .chain(addrs)
                .chain(std::iter::once(base + 128 + i))
                .collect();
            let s = cache.stack(&addrs, &mut symbolizer);
            assert!(!s.is_empty());
            let st = cache.cache.stats();
            assert!(st.bytes <= MAX, "after {i} stacks: {st:?}");
        }
        let st = cache.cache.stats();
        assert!(st.evicted > 0, "{st:?}");
        assert_eq!(st.entries as u64 + st.evicted, stacks, "{st:?}");
        let sym = symbolizer.stats();
        assert!(sym.bytes <= sym.max_bytes, "{sym:?}");
    }
}
