//! Profile windows: every sample from the moment a window is opened, aggregated per
//! (labels, stack) with full labels, taken interval by interval. Sinks (periodic
//! pprof files, Pyroscope, OTLP, `/debug/spanprof/profile?seconds=N`) read these.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use std::cell::RefCell;

use crate::cache::FastMap;
use crate::latency::{Classifier, LatencyClass};
use crate::profile::{Profile, ProfileSample, SampleLabels, Stack};

/// Default bound on distinct (labels, stack) entries of one window interval.
pub const DEFAULT_WINDOW_ENTRIES: usize = 100_000;

struct Entry {
    labels: Option<Arc<SampleLabels>>,
    stack: Stack,
    count: u64,
    cpu_ns: u64,
    wall_ns: u64,
}

struct Interval {
    start: SystemTime,
    entries: FastMap<(usize, usize), Entry>,
    /// Samples of requests still running at the last take: exported at the next one,
    /// with their request's latency class, or `open`.
    held: Vec<Entry>,
}

pub(crate) struct WindowInner {
    interval: Mutex<Interval>,
    max_entries: usize,
    dropped: AtomicU64,
    period_ns: u64,
}

/// Samples from the moment the window was opened ([`crate::Profiler::window`]),
/// aggregated per (labels, stack); [`ProfileWindow::take`] returns them and starts a
/// new interval. Bounded: past `max_entries` distinct (labels, stack) pairs in one
/// interval, further new pairs are dropped and counted. Closing (dropping) the window
/// stops the collection.
#[must_use = "a window collects only while it lives: keep it, and take() its profile"]
pub struct ProfileWindow {
    inner: Arc<WindowInner>,
}

impl std::fmt::Debug for ProfileWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfileWindow")
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl ProfileWindow {
    pub(crate) fn new(max_entries: usize, period_ns: u64) -> (ProfileWindow, Weak<WindowInner>) {
        let inner = Arc::new(WindowInner {
            interval: Mutex::new(Interval {
                start: SystemTime::now(),
                entries: FastMap::default(),
                held: Vec::new(),
            }),
            max_entries: max_entries.max(1),
            dropped: AtomicU64::new(0),
            period_ns,
        });
        let weak = Arc::downgrade(&inner);
        (ProfileWindow { inner }, weak)
    }

    /// The samples since the window opened or since the last `take`, as a profile
    /// whose start and duration are those of the interval.
    ///
    /// Each sample of a request (a local root with a route) carries the request's
    /// latency class ([`SampleLabels::latency`]): known once the request has ended.
    /// Samples of a request still running are held back to the next `take`, once:
    /// then they go with its class, or [`LatencyClass::Open`] if it is still running.
    /// So a profile holds the samples of its interval, less those of requests still
    /// running at its end, plus those held back from the interval before.
    pub fn take(&self) -> Profile {
        self.take_with(false)
    }

    /// [`ProfileWindow::take`] with nothing held back: a request still running is
    /// [`LatencyClass::Open`]. For the last profile of a window (a sink shutting
    /// down, a one-off capture).
    pub fn take_all(&self) -> Profile {
        self.take_with(true)
    }

    fn take_with(&self, all: bool) -> Profile {
        let now = SystemTime::now();
        let mut g = self
            .inner
            .interval
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let start = std::mem::replace(&mut g.start, now);
        let entries = std::mem::take(&mut g.entries);
        let held = std::mem::take(&mut g.held);
        drop(g);
        let classes = Classes::new();
        let mut samples = Vec::with_capacity(entries.len() + held.len());
        let mut hold = Vec::new();
        for (e, last) in held
            .into_iter()
            .map(|e| (e, true))
            .chain(entries.into_values().map(|e| (e, all)))
        {
            match classes.labels(&e.labels, last) {
                Some(labels) => samples.push(ProfileSample {
                    stack: e.stack,
                    labels,
                    count: e.count,
                    cpu_ns: e.cpu_ns,
                    wall_ns: e.wall_ns,
                }),
                None => hold.push(e),
            }
        }
        if !hold.is_empty() {
            let mut g = self
                .inner
                .interval
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            g.held.extend(hold);
        }
        Profile {
            samples,
            start,
            duration_ns: now.duration_since(start).map_or(0, |d| d.as_nanos() as u64),
            period_ns: self.inner.period_ns,
        }
    }

    /// New (labels, stack) pairs dropped because an interval was full.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }
}

/// The labels of a take's samples with their request's latency class, each distinct
/// labels classed once.
struct Classes {
    classifier: Classifier,
    /// By labels (pointer): the classed labels, or `None` to hold back.
    done: RefCell<FastMap<usize, Option<Option<Arc<SampleLabels>>>>>,
}

impl Classes {
    fn new() -> Self {
        Classes {
            classifier: Classifier::new(),
            done: RefCell::default(),
        }
    }

    /// `labels` with their latency class; `None` to hold the sample back (its
    /// request is running and this is not its `last` chance).
    fn labels(
        &self,
        labels: &Option<Arc<SampleLabels>>,
        last: bool,
    ) -> Option<Option<Arc<SampleLabels>>> {
        let Some(l) = labels else {
            return Some(None);
        };
        let key = Arc::as_ptr(l) as usize;
        if let Some(Some(done)) = self.done.borrow().get(&key) {
            return Some(done.clone());
        }
        let class = if l.root_span_id == 0 || !self.classifier.has_classes(&l.route) {
            // Not a request's (labels built by hand, a route that never ends one), or
            // a route with too few requests to tell.
            None
        } else {
            match self.classifier.class_of(l.root_span_id) {
                Ok(class) => class,
                Err(()) if last => Some(LatencyClass::Open),
                Err(()) => {
                    self.done.borrow_mut().insert(key, None);
                    return None;
                }
            }
        };
        let out = Some(match class {
            Some(class) => Arc::new(SampleLabels {
                latency: Some(class),
                ..SampleLabels::clone(l)
            }),
            None => l.clone(),
        });
        self.done.borrow_mut().insert(key, Some(out.clone()));
        Some(out)
    }
}

impl WindowInner {
    /// Distinct (labels, stack) entries of the current interval.
    pub(crate) fn entries(&self) -> usize {
        self.interval
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
    }

    /// Estimated bytes of the current interval: its map's slots (the labels and
    /// stacks they point at are shared with the collector's caches and the store).
    pub(crate) fn bytes(&self) -> usize {
        self.entries() * (std::mem::size_of::<((usize, usize), Entry)>() + 1) * 8 / 7
    }

    /// Adds one sample (called by the collector): CPU, or wall-clock when `wall`.
    pub(crate) fn add(
        &self,
        labels: &Option<Arc<SampleLabels>>,
        stack: &Stack,
        weight_ns: u64,
        wall: bool,
    ) {
        let key = (
            labels.as_ref().map_or(0, |l| Arc::as_ptr(l) as usize),
            Arc::as_ptr(stack) as *const () as usize,
        );
        let mut g = self.interval.lock().unwrap_or_else(|e| e.into_inner());
        let full = g.entries.len() >= self.max_entries;
        match g.entries.get_mut(&key) {
            Some(e) if wall => e.wall_ns += weight_ns,
            Some(e) => {
                e.count += 1;
                e.cpu_ns += weight_ns;
            }
            None if full => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                g.entries.insert(
                    key,
                    Entry {
                        labels: labels.clone(),
                        stack: stack.clone(),
                        count: u64::from(!wall),
                        cpu_ns: if wall { 0 } else { weight_ns },
                        wall_ns: if wall { weight_ns } else { 0 },
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Frame, Hotness};

    fn stack(name: &str) -> Stack {
        vec![Frame {
            function: Arc::from(name),
            file: None,
            line: 0,
            address: 1,
            inlined: false,
        }]
        .into()
    }

    fn labels(span_id: u64) -> Option<Arc<SampleLabels>> {
        Some(Arc::new(SampleLabels {
            trace_id: 1,
            span_id,
            parent_span_id: 0,
            root_span_id: span_id,
            span_name: Arc::from("span"),
            route: Arc::from("/r"),
            hot: Hotness::Cold,
            latency: None,
        }))
    }

    #[test]
    fn samples_aggregate_per_labels_and_stack_and_take_starts_a_new_interval() {
        let (window, inner) = ProfileWindow::new(100, 10_101_010);
        let inner = inner.upgrade().unwrap();
        let (a, b) = (labels(1), labels(2));
        let (s, t) = (stack("f"), stack("g"));
        inner.add(&a, &s, 10, false);
        inner.add(&a, &s, 20, false);
        inner.add(&a, &t, 5, false);
        inner.add(&b, &s, 7, false);
        inner.add(&None, &s, 1, false);
        assert_eq!(inner.entries(), 4);
        let p = window.take();
        assert_eq!(p.period_ns, 10_101_010);
        assert_eq!((p.sample_count(), p.cpu_ns()), (5, 43));
        let aa = p
            .samples
            .iter()
            .find(|x| {
                x.labels.as_ref().is_some_and(|l| l.span_id == 1) && &*x.stack[0].function == "f"
            })
            .unwrap();
        assert_eq!((aa.count, aa.cpu_ns), (2, 30));
        // The next interval starts empty, where the last one ended.
        let q = window.take();
        assert!(q.samples.is_empty());
        assert!(q.start >= p.start);
    }

    #[test]
    fn a_full_interval_drops_new_pairs_and_counts_them_but_adds_to_known_ones() {
        let (window, inner) = ProfileWindow::new(2, 1);
        let inner = inner.upgrade().unwrap();
        let (s, t, u) = (stack("f"), stack("g"), stack("h"));
        inner.add(&None, &s, 1, false);
        inner.add(&None, &t, 1, false);
        inner.add(&None, &u, 1, false); // a third pair: dropped
        inner.add(&None, &s, 1, false); // a known pair: still counted
        assert_eq!(window.dropped(), 1);
        let p = window.take();
        assert_eq!((p.samples.len(), p.sample_count()), (2, 3));
        // Room again after the take.
        inner.add(&None, &u, 1, false);
        assert_eq!(window.take().sample_count(), 1);
    }

    #[test]
    fn samples_carry_their_requests_latency_class_and_wait_one_take_for_it() {
        use crate::latency::{LatencyClass, MIN_REQUESTS};
        let route = "GET /window_latency_test";
        let id = crate::intern::NameId::intern(route);
        // The route's recent requests: 1 ms each, and one of 50 ms (root 0xA).
        for _ in 0..MIN_REQUESTS {
            crate::latency::record(id, 0, 1_000_000, false);
        }
        crate::latency::record(id, 0xA, 50_000_000, true);
        let of = |root: u64| {
            Some(Arc::new(SampleLabels {
                root_span_id: root,
                route: Arc::from(route),
                ..(*labels(root).unwrap()).clone()
            }))
        };
        let class = |p: &Profile, root: u64| {
            p.samples
                .iter()
                .find(|s| s.labels.as_ref().is_some_and(|l| l.root_span_id == root))
                .map(|s| s.labels.as_ref().unwrap().latency)
        };
        let (window, inner) = ProfileWindow::new(100, 1);
        let inner = inner.upgrade().unwrap();
        let (ended, running, unnamed) = (of(0xA), of(0xB), labels(0xC));
        inner.add(&ended, &stack("slow_path"), 10, false);
        inner.add(&running, &stack("f"), 10, false);
        inner.add(&unnamed, &stack("g"), 10, false);
        let first = window.take();
        assert_eq!(class(&first, 0xA), Some(Some(LatencyClass::P99Plus)));
        assert_eq!(class(&first, 0xB), None, "held back while its request runs");
        assert_eq!(
            class(&first, 0xC),
            Some(None),
            "no route with durations: no class"
        );
        // Still running at the next take: `open`.
        let second = window.take();
        assert_eq!(class(&second, 0xB), Some(Some(LatencyClass::Open)));
        // The last take holds nothing back.
        inner.add(&of(0xD), &stack("f"), 10, false);
        assert_eq!(
            class(&window.take_all(), 0xD),
            Some(Some(LatencyClass::Open))
        );
        // A request of a route with too few requests: no class, running or not.
        let rare = "GET /window_latency_rare";
        crate::latency::record(crate::intern::NameId::intern(rare), 0, 1_000_000, false);
        let running_rare = Some(Arc::new(SampleLabels {
            root_span_id: 0xE,
            route: Arc::from(rare),
            ..(*labels(0xE).unwrap()).clone()
        }));
        inner.add(&running_rare, &stack("f"), 10, false);
        assert_eq!(class(&window.take(), 0xE), Some(None));
    }

    #[test]
    fn a_closed_window_is_no_longer_reachable_by_the_collector() {
        let (window, weak) = ProfileWindow::new(10, 1);
        drop(window);
        assert!(weak.upgrade().is_none());
    }
}
