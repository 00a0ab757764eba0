//! The collector: a drain thread empties every thread's sample ring at a fixed
//! interval into a bounded queue, and a processing thread symbolizes new stacks off
//! the hot path and feeds the store. Two threads, so that a slow symbolization (the
//! first DWARF parse takes a while) never leaves the rings undrained.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::intern::NameId;
use crate::profile::{Hotness, SampleLabels, Stack};
use crate::store::{IncomingLabels, IncomingSample, SpanProfileStore};
use crate::symbolize::{AddressSymbolizer, TRUNCATED_ADDR};
use crate::sys::ring::{FLAG_LABELLED, FLAG_TRUNCATED, RawSample};
use crate::window::WindowInner;

/// Most samples waiting for symbolization; past it samples are dropped and counted.
pub(crate) const MAX_BACKLOG: usize = 1 << 16;

/// A drained sample: labels and its frames only (the ring slot is fixed-size).
struct Drained {
    labels: Option<IncomingLabels>,
    addrs: Box<[u64]>,
    time_ns: u64,
    weight_ns: u64,
}

#[derive(Default)]
struct Queue {
    samples: VecDeque<Drained>,
    enqueued: u64,
    processed: u64,
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    cv: Condvar,
    dropped_backlog: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Empties every ring into the queue. Rings are drained under the registry lock,
    /// so any thread may call this (one consumer per ring at a time).
    fn drain(&self) {
        let mut raw: Vec<RawSample> = Vec::new();
        {
            let mut reg = crate::sampler::registry();
            for t in &reg.threads {
                t.ring.drain(&mut raw);
            }
            crate::sampler::prune_retired(&mut reg);
        }
        if raw.is_empty() {
            return;
        }
        let mut q = self.lock();
        for s in &raw {
            if q.samples.len() >= MAX_BACKLOG {
                self.dropped_backlog.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            q.samples.push_back(compact(s));
            q.enqueued += 1;
        }
        drop(q);
        self.cv.notify_all();
    }
}

fn compact(s: &RawSample) -> Drained {
    let mut addrs = Vec::with_capacity(s.frames().len() + 1);
    addrs.extend_from_slice(s.frames());
    if s.flags & FLAG_TRUNCATED != 0 {
        addrs.push(TRUNCATED_ADDR);
    }
    Drained {
        labels: (s.flags & FLAG_LABELLED != 0).then_some(IncomingLabels {
            trace_id: s.trace_id,
            span_id: s.span_id,
            parent_span_id: s.parent_span_id,
            root_span_id: s.root_span_id,
            span_name: NameId(s.span_name),
            route: NameId(s.route),
            hot: Hotness::from_u8(s.hot),
        }),
        addrs: addrs.into(),
        time_ns: s.time_ns,
        weight_ns: s.weight_ns,
    }
}

pub(crate) struct Collector {
    pub(crate) windows: Arc<Mutex<Vec<Weak<WindowInner>>>>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Collector {
    pub(crate) fn start(store: SpanProfileStore, interval: Duration) -> Collector {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            dropped_backlog: AtomicU64::new(0),
        });
        let drainer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("spanprof-drain".into())
                .spawn(move || {
                    let mut q = shared.lock();
                    while !q.stop {
                        q = shared
                            .cv
                            .wait_timeout(q, interval)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                        drop(q);
                        shared.drain();
                        q = shared.lock();
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
                .spawn(move || process(shared, store, windows))
                .expect("spawn the spanprof collector thread")
        };
        Collector {
            windows,
            shared,
            threads: vec![drainer, processor],
        }
    }

    /// Drains every ring now and waits until the store has everything drained.
    pub(crate) fn flush(&self) {
        self.shared.drain();
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

    /// Drains what is left, processes it and stops both threads.
    pub(crate) fn stop(mut self) {
        self.flush();
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.lock().stop = true;
        self.shared.cv.notify_all();
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
) {
    let mut symbolizer = AddressSymbolizer::new();
    let mut stacks: HashMap<Box<[u64]>, Stack> = HashMap::new();
    let mut labels_cache: HashMap<(u64, u128, u8), Arc<SampleLabels>> = HashMap::new();
    loop {
        let batch: Vec<Drained> = {
            let mut q = shared.lock();
            while q.samples.is_empty() && !q.stop {
                q = shared.cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            if q.samples.is_empty() && q.stop {
                return;
            }
            q.samples.drain(..).collect()
        };
        if stacks.len() > MAX_STACK_CACHE {
            stacks.clear();
        }
        // Symbolize outside the store's lock, so queries never wait for DWARF parsing.
        for d in &batch {
            if !stacks.contains_key(&d.addrs) {
                let s = symbolizer.stack(&d.addrs);
                stacks.insert(d.addrs.clone(), s);
            }
        }
        let samples: Vec<IncomingSample<'_>> = batch
            .iter()
            .map(|d| IncomingSample {
                labels: d.labels,
                addrs: &d.addrs,
                time_ns: d.time_ns,
                weight_ns: d.weight_ns,
            })
            .collect();
        store.insert(&samples, |addrs| match stacks.get(addrs) {
            Some(s) => s.clone(),
            None => symbolizer.stack(addrs),
        });
        feed_windows(&windows, &batch, &stacks, &mut labels_cache);
        let mut q = shared.lock();
        q.processed += batch.len() as u64;
        drop(q);
        shared.cv.notify_all();
    }
}

/// Symbolized stacks kept by raw addresses (cleared when larger).
const MAX_STACK_CACHE: usize = 100_000;

/// Adds a batch to every open window (full labels per sample).
fn feed_windows(
    windows: &Mutex<Vec<Weak<WindowInner>>>,
    batch: &[Drained],
    stacks: &HashMap<Box<[u64]>, Stack>,
    labels_cache: &mut HashMap<(u64, u128, u8), Arc<SampleLabels>>,
) {
    let live: Vec<Arc<WindowInner>> = {
        let mut w = windows.lock().unwrap_or_else(|e| e.into_inner());
        w.retain(|w| w.strong_count() > 0);
        w.iter().filter_map(Weak::upgrade).collect()
    };
    if live.is_empty() {
        return;
    }
    if labels_cache.len() > 50_000 {
        labels_cache.clear();
    }
    for d in batch {
        let Some(stack) = stacks.get(&d.addrs) else {
            continue;
        };
        let labels = d
            .labels
            .filter(|l| l.span_id != 0 || l.trace_id != 0 || l.route != NameId::NONE)
            .map(|l| {
                labels_cache
                    .entry((l.span_id, l.trace_id, l.hot as u8))
                    .or_insert_with(|| {
                        Arc::new(SampleLabels {
                            trace_id: l.trace_id,
                            span_id: l.span_id,
                            parent_span_id: l.parent_span_id,
                            root_span_id: l.root_span_id,
                            span_name: crate::intern::resolve(l.span_name),
                            route: crate::intern::resolve(l.route),
                            hot: l.hot,
                        })
                    })
                    .clone()
            });
        for w in &live {
            w.add(&labels, stack, d.weight_ns);
        }
    }
}
