//! Latency classes: each local root's duration against its route's recent ones, so
//! that a sample can be labelled with how slow the request it belongs to turned out
//! (`span_latency`: `p0-50`, `p50-90`, `p90-99`, `p99+`, or `open` for a request
//! still running when its samples were exported).
//!
//! Every local root that ends ([`record`]) adds its duration to its route's histogram,
//! kept per thread (a plain store to memory the thread owns: no shared write on the
//! request path) and summed when classes are wanted. A root that was sampled is also
//! remembered by its span id with its duration (a shared map, but only for the few
//! requests a sample lands in), so that its samples can be classed when exported.
//! Classes are read against the last [`WINDOW`] of each route's durations, and only
//! once a route has [`MIN_REQUESTS`] in it: with fewer, a p99 is a guess.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::cache::FastMap;
use crate::intern::NameId;

/// Requests a route must have had in the last [`WINDOW`] for its samples to be
/// classed: below it, the route's samples carry no `span_latency` and the viewer
/// says there are too few.
pub const MIN_REQUESTS: u64 = 100;

/// How far back a route's durations count towards its classes.
pub const WINDOW: Duration = Duration::from_secs(300);

/// Sampled local roots remembered with their duration; past it the oldest go (their
/// samples are labelled `open` if exported later).
const MAX_ENDED: usize = 1 << 16;

/// Histogram buckets: four per power of two of microseconds, up to 2^40 µs.
const SUB_BITS: u32 = 2;
const BUCKETS: usize = 40 << SUB_BITS;

/// Routes a thread keeps histograms for; the rest go to a shared one.
const THREAD_ROUTES: usize = 16;

/// How long a request took against its route's recent requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LatencyClass {
    /// At or under the route's median.
    P0To50,
    /// Between the median and the 90th percentile.
    P50To90,
    /// Between the 90th and the 99th percentile.
    P90To99,
    /// Above the 99th percentile.
    P99Plus,
    /// Still running when its samples were exported.
    Open,
}

impl LatencyClass {
    /// Every class, fastest first, `Open` last.
    pub const ALL: [LatencyClass; 5] = [
        LatencyClass::P0To50,
        LatencyClass::P50To90,
        LatencyClass::P90To99,
        LatencyClass::P99Plus,
        LatencyClass::Open,
    ];

    /// The label value: `p0-50`, `p50-90`, `p90-99`, `p99+` or `open`.
    pub fn as_str(self) -> &'static str {
        match self {
            LatencyClass::P0To50 => "p0-50",
            LatencyClass::P50To90 => "p50-90",
            LatencyClass::P90To99 => "p90-99",
            LatencyClass::P99Plus => "p99+",
            LatencyClass::Open => "open",
        }
    }

    /// The class a label value names.
    pub fn parse(s: &str) -> Option<LatencyClass> {
        LatencyClass::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for LatencyClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The bucket of a duration.
fn bucket(ns: u64) -> usize {
    let us = (ns / 1_000).max(1);
    let exp = 63 - us.leading_zeros();
    let sub = if exp >= SUB_BITS {
        (us >> (exp - SUB_BITS)) & ((1 << SUB_BITS) - 1)
    } else {
        (us << (SUB_BITS - exp)) & ((1 << SUB_BITS) - 1)
    };
    (((exp as usize) << SUB_BITS) | sub as usize).min(BUCKETS - 1)
}

/// The lowest duration of bucket `b`, in ns.
pub(crate) fn bucket_floor_ns(b: usize) -> u64 {
    let exp = (b >> SUB_BITS) as u32;
    let sub = (b & ((1 << SUB_BITS) - 1)) as u64;
    let us = if exp >= SUB_BITS {
        (1u64 << exp) | (sub << (exp - SUB_BITS))
    } else {
        (1u64 << exp) | (sub >> (SUB_BITS - exp))
    };
    us.saturating_mul(1_000)
}

/// One thread's histograms: route ids (id + 1; 0 for a free place) and counts.
/// Written only by its thread (a load and a store, no read-modify-write), read by
/// whoever sums them.
struct ThreadHistograms {
    routes: [AtomicU32; THREAD_ROUTES],
    counts: Box<[[AtomicU32; BUCKETS]; THREAD_ROUTES]>,
}

impl ThreadHistograms {
    fn new() -> Self {
        ThreadHistograms {
            routes: std::array::from_fn(|_| AtomicU32::new(0)),
            counts: Box::new(std::array::from_fn(|_| {
                std::array::from_fn(|_| AtomicU32::new(0))
            })),
        }
    }

    /// Adds one duration of `route` on the owning thread; `false` when every place
    /// holds another route.
    fn add(&self, route: u32, b: usize) -> bool {
        for (k, r) in self.routes.iter().enumerate() {
            let at = r.load(Ordering::Relaxed);
            if at == 0 {
                r.store(route + 1, Ordering::Release);
            } else if at != route + 1 {
                continue;
            }
            let c = &self.counts[k][b];
            c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            return true;
        }
        false
    }

    fn add_into(&self, sums: &mut FastMap<u32, Vec<u64>>) {
        for (k, r) in self.routes.iter().enumerate() {
            let at = r.load(Ordering::Acquire);
            if at == 0 {
                break;
            }
            let sum = sums.entry(at - 1).or_insert_with(|| vec![0; BUCKETS]);
            for (s, c) in sum.iter_mut().zip(self.counts[k].iter()) {
                *s += u64::from(c.load(Ordering::Relaxed));
            }
        }
    }
}

/// The histograms of every thread, the shared one, and those of threads gone.
struct Registry {
    threads: Vec<Weak<ThreadHistograms>>,
    /// Routes past a thread's places, and the counts of threads that exited.
    shared: FastMap<u32, Vec<u64>>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    Mutex::new(Registry {
        threads: Vec::new(),
        shared: FastMap::default(),
    })
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// This thread's histograms, folded into the shared ones when the thread exits.
struct Local(Arc<ThreadHistograms>);

impl Local {
    /// The thread's histograms, registered for [`totals`] (at its first request).
    fn new() -> Self {
        let h = Arc::new(ThreadHistograms::new());
        registry().threads.push(Arc::downgrade(&h));
        Local(h)
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let mut r = registry();
        let mut shared = std::mem::take(&mut r.shared);
        self.0.add_into(&mut shared);
        r.shared = shared;
        r.threads
            .retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), &*self.0));
    }
}

thread_local! {
    static LOCAL: Local = Local::new();
}

/// Adds `ns` to `route`'s histogram: in this thread's own, or (its places all taken,
/// or the thread exiting) in the shared one.
fn add_duration(route: NameId, ns: u64) {
    let b = bucket(ns);
    let kept = LOCAL.try_with(|l| l.0.add(route.0, b)).unwrap_or(false);
    if !kept {
        registry()
            .shared
            .entry(route.0)
            .or_insert_with(|| vec![0; BUCKETS])[b] += 1;
    }
}

/// The sampled roots that ended, by span id: their route and duration.
struct Ended {
    by_span: FastMap<u64, (u32, u64)>,
    order: VecDeque<u64>,
}

/// Sized for its bound at once: a request a sample lands in allocates nothing here.
static ENDED: LazyLock<Mutex<Ended>> = LazyLock::new(|| {
    let mut by_span = FastMap::default();
    by_span.reserve(MAX_ENDED + 1);
    Mutex::new(Ended {
        by_span,
        order: VecDeque::with_capacity(MAX_ENDED + 1),
    })
});

/// Allocates the shared tables now, on the thread that sets the service up (the
/// layers call it when they are built), rather than in the first request a sample
/// lands in.
#[doc(hidden)]
pub fn init() {
    LazyLock::force(&ENDED);
    LazyLock::force(&REGISTRY);
}

fn ended() -> std::sync::MutexGuard<'static, Ended> {
    ENDED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records that the local root `root_span_id` of `route` ended after `ns`: into the
/// route's histogram and, when a sample landed in its work (`sampled`), by its id
/// for its samples' class.
pub(crate) fn record(route: NameId, root_span_id: u64, ns: u64, sampled: bool) {
    if route == NameId::NONE {
        return;
    }
    add_duration(route, ns);
    if sampled && root_span_id != 0 {
        let mut e = ended();
        if e.by_span.insert(root_span_id, (route.0, ns)).is_none() {
            e.order.push_back(root_span_id);
            if e.order.len() > MAX_ENDED
                && let Some(old) = e.order.pop_front()
            {
                e.by_span.remove(&old);
            }
        }
    }
}

/// Snapshots of the summed histograms, to read the last [`WINDOW`] off them.
static HISTORY: Mutex<VecDeque<(Instant, Arc<Histograms>)>> = Mutex::new(VecDeque::new());

/// Histograms by route id.
type Histograms = FastMap<u32, Vec<u64>>;

/// How often a snapshot is kept.
const SNAPSHOT_EVERY: Duration = Duration::from_secs(10);

/// The summed histograms since the process started.
fn totals() -> Histograms {
    let r = registry();
    let mut sums = r.shared.clone();
    for t in r.threads.iter().filter_map(Weak::upgrade) {
        t.add_into(&mut sums);
    }
    sums
}

/// Each route's durations over the last [`WINDOW`] (all of them when the process is
/// younger): the totals now minus the newest snapshot at least that old.
pub(crate) fn recent() -> Distributions {
    let now_totals = Arc::new(totals());
    let now = Instant::now();
    let mut h = HISTORY.lock().unwrap_or_else(|e| e.into_inner());
    if h.back()
        .is_none_or(|(t, _)| now.duration_since(*t) >= SNAPSHOT_EVERY)
    {
        h.push_back((now, now_totals.clone()));
    }
    // Keep one snapshot older than the window: the base.
    while h.len() > 1 && now.duration_since(h[1].0) >= WINDOW {
        h.pop_front();
    }
    let base = h
        .front()
        .filter(|(t, _)| now.duration_since(*t) >= WINDOW)
        .map(|(_, s)| s.clone());
    drop(h);
    let mut routes = (*now_totals).clone();
    if let Some(base) = base {
        for (route, counts) in routes.iter_mut() {
            if let Some(old) = base.get(route) {
                for (c, o) in counts.iter_mut().zip(old) {
                    *c = c.saturating_sub(*o);
                }
            }
        }
    }
    Distributions { routes }
}

/// Routes' recent durations, as histograms.
pub(crate) struct Distributions {
    routes: FastMap<u32, Vec<u64>>,
}

impl Distributions {
    /// The class of a root of `route` that took `ns`; `None` while the route has
    /// fewer than [`MIN_REQUESTS`] recent requests.
    pub(crate) fn class(&self, route: u32, ns: u64) -> Option<LatencyClass> {
        let counts = self.routes.get(&route)?;
        let n: u64 = counts.iter().sum();
        if n < MIN_REQUESTS {
            return None;
        }
        let b = bucket(ns);
        let below: u64 = counts[..b].iter().sum();
        // The middle of its own bucket: a request in the bucket that holds a
        // quantile is ranked by its bucket's middle.
        let rank = (2 * below + counts[b]) as f64 / (2 * n) as f64;
        Some(if rank < 0.5 {
            LatencyClass::P0To50
        } else if rank < 0.9 {
            LatencyClass::P50To90
        } else if rank < 0.99 {
            LatencyClass::P90To99
        } else {
            LatencyClass::P99Plus
        })
    }

    /// `route`'s recent histogram: (lowest duration of the bucket in ns, count), for
    /// the buckets from the first to the last that hold a request.
    pub(crate) fn histogram(&self, route: u32) -> Vec<(u64, u64)> {
        let Some(counts) = self.routes.get(&route) else {
            return Vec::new();
        };
        let Some(first) = counts.iter().position(|&c| c > 0) else {
            return Vec::new();
        };
        let last = counts.iter().rposition(|&c| c > 0).unwrap_or(first);
        (first..=last)
            .map(|b| (bucket_floor_ns(b), counts[b]))
            .collect()
    }
}

/// The class of the samples of local root `root_span_id`: from its duration when it
/// ended, `Open` when it has not (as far as `ended` knows), `None` when its route
/// has too few requests.
pub(crate) struct Classifier {
    dist: Distributions,
}

impl Classifier {
    pub(crate) fn new() -> Self {
        Classifier { dist: recent() }
    }

    /// The class of root `root_span_id`, if it has ended and its route has enough
    /// requests; `Err(())` when it has not ended.
    pub(crate) fn class_of(&self, root_span_id: u64) -> Result<Option<LatencyClass>, ()> {
        let found = ended().by_span.get(&root_span_id).copied();
        match found {
            Some((route, ns)) => Ok(self.dist.class(route, ns)),
            None => Err(()),
        }
    }

    /// Whether `route` (by name) has the [`MIN_REQUESTS`] recent requests classes
    /// need: samples of a route with fewer, or of one that never ends a root here
    /// (labels built by hand), get no class, not even `open`.
    pub(crate) fn has_classes(&self, route: &str) -> bool {
        crate::intern::lookup(route).is_some_and(|id| {
            self.dist
                .routes
                .get(&id.0)
                .is_some_and(|c| c.iter().sum::<u64>() >= MIN_REQUESTS)
        })
    }
}

/// A route's recent latency, for the viewer: its histogram and its quantiles'
/// bucket floors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteLatency {
    /// Requests in the last [`RouteLatency::WINDOW`].
    pub requests: u64,
    /// (lowest duration of the bucket in ns, requests in it), buckets of a quarter
    /// power of two of microseconds, from the fastest to the slowest that holds one.
    pub buckets: Vec<(u64, u64)>,
}

impl RouteLatency {
    /// Requests a route needs in the window before its samples are classed.
    pub const MIN_REQUESTS: u64 = MIN_REQUESTS;
    /// How far back a route's requests count.
    pub const WINDOW: Duration = WINDOW;

    /// Whether the route has enough requests for latency classes.
    pub fn has_classes(&self) -> bool {
        self.requests >= MIN_REQUESTS
    }
}

/// `route`'s latency over the last [`RouteLatency::WINDOW`] (empty when it has none).
pub fn route_latency(route: &str) -> RouteLatency {
    let Some(id) = crate::intern::lookup(route) else {
        return RouteLatency::default();
    };
    let buckets = recent().histogram(id.0);
    RouteLatency {
        requests: buckets.iter().map(|(_, c)| c).sum(),
        buckets,
    }
}

/// The class of each of these local roots' samples: from the root's duration when it
/// ended, [`LatencyClass::Open`] when it has not (or ended too long ago to be
/// remembered), `None` where its route has too few requests.
pub fn classes_of_roots(roots: &[u64]) -> Vec<Option<LatencyClass>> {
    let c = Classifier::new();
    roots
        .iter()
        .map(|&r| c.class_of(r).unwrap_or(Some(LatencyClass::Open)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_grow_by_a_quarter_power_of_two_and_floors_are_in_their_bucket() {
        assert_eq!(bucket(0), bucket(1_000));
        let mut last = 0;
        for us in [
            1u64, 2, 3, 5, 8, 13, 100, 1_000, 10_000, 1_000_000, 60_000_000,
        ] {
            let b = bucket(us * 1_000);
            assert!(b >= last, "{us} µs");
            last = b;
            let floor = bucket_floor_ns(b);
            assert!(floor <= us * 1_000, "{us} µs: floor {floor}");
            assert_eq!(bucket(floor), b, "{us} µs");
        }
        // 1.0, 1.25, 1.5, 1.75 ms: four buckets of one power of two.
        let bs: Vec<usize> = [1024u64, 1280, 1536, 1792]
            .iter()
            .map(|us| bucket(us * 1_000))
            .collect();
        assert_eq!(bs, [bs[0], bs[0] + 1, bs[0] + 2, bs[0] + 3]);
    }

    #[test]
    fn classes_follow_the_routes_quantiles_and_need_enough_requests() {
        let mut counts = vec![0u64; BUCKETS];
        // 1000 requests: 500 at 1 ms, 400 at 3 ms, 90 at 10 ms, 10 at 100 ms.
        counts[bucket(1_000_000)] = 500;
        counts[bucket(3_000_000)] = 400;
        counts[bucket(10_000_000)] = 90;
        counts[bucket(100_000_000)] = 10;
        let mut routes = FastMap::default();
        routes.insert(7, counts);
        routes.insert(8, {
            let mut few = vec![0u64; BUCKETS];
            few[bucket(1_000_000)] = MIN_REQUESTS - 1;
            few
        });
        let d = Distributions { routes };
        assert_eq!(d.class(7, 1_000_000), Some(LatencyClass::P0To50));
        assert_eq!(d.class(7, 10_000_000), Some(LatencyClass::P90To99));
        assert_eq!(d.class(7, 100_000_000), Some(LatencyClass::P99Plus));
        assert_eq!(d.class(7, 3_000_000), Some(LatencyClass::P50To90));
        // Slower than 90 % of them, in a bucket of its own.
        assert_eq!(d.class(7, 5_000_000), Some(LatencyClass::P90To99));
        assert_eq!(d.class(8, 1_000_000), None, "too few requests");
        assert_eq!(d.class(9, 1_000_000), None, "an unknown route");
    }

    #[test]
    fn class_names_round_trip() {
        for c in LatencyClass::ALL {
            assert_eq!(LatencyClass::parse(c.as_str()), Some(c));
        }
        assert_eq!(LatencyClass::parse("p42"), None);
    }
}
