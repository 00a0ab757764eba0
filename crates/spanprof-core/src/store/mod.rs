//! The span profile store: samples aggregated per (labels, stack), bounded in
//! distinct spans, distinct stacks and bytes, with the oldest evicted first and
//! everything dropped counted.

use std::collections::VecDeque;

use crate::cache::FastMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use crate::error::{ConfigError, ProfilerError};
use crate::intern::NameId;
use crate::profile::{Hotness, SampleLabels, Stack};
use crate::sys::record::LabelIds;

mod buckets;
mod queries;
mod spans;
mod stacks;

use buckets::Bucket;
use spans::SpanEntry;
use stacks::StackEntry;

/// Default bound on distinct spans kept.
pub const DEFAULT_MAX_SPANS: usize = 20_000;
/// Default bound on distinct stacks kept.
pub const DEFAULT_MAX_STACKS: usize = 50_000;
/// Default bound on the store's estimated memory.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;
/// Default width of one time bucket of the route/process aggregates.
pub const DEFAULT_BUCKET_WIDTH: Duration = Duration::from_secs(10);
/// Default number of time buckets kept (with the default width: 10 minutes).
pub const DEFAULT_BUCKETS: usize = 60;

// Estimated sizes used for the byte bound (hash map overhead included).
const SPAN_BYTES: usize = 320;
const SPAN_STACK_BYTES: usize = 64;
const STACK_BYTES: usize = 128;
const FRAME_BYTES: usize = 64;
const BUCKET_ENTRY_BYTES: usize = 64;

/// Bounds of a [`SpanProfileStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreConfig {
    /// Distinct spans kept; the oldest is evicted first. Defaults to [`DEFAULT_MAX_SPANS`].
    pub max_spans: usize,
    /// Distinct stacks kept; samples with a new stack past this bound are kept under
    /// a `[dropped: stack table full]` frame and counted. Defaults to [`DEFAULT_MAX_STACKS`].
    pub max_stacks: usize,
    /// Estimated bytes; spans (then time buckets) are evicted oldest first to stay
    /// under it. Defaults to [`DEFAULT_MAX_BYTES`] (64 MiB).
    pub max_bytes: usize,
    /// Width of one time bucket for route and process profiles. Defaults to
    /// [`DEFAULT_BUCKET_WIDTH`] (10 s).
    pub bucket_width: Duration,
    /// Time buckets kept. Defaults to [`DEFAULT_BUCKETS`] (60).
    pub buckets: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            max_spans: DEFAULT_MAX_SPANS,
            max_stacks: DEFAULT_MAX_STACKS,
            max_bytes: DEFAULT_MAX_BYTES,
            bucket_width: DEFAULT_BUCKET_WIDTH,
            buckets: DEFAULT_BUCKETS,
        }
    }
}

impl StoreConfig {
    pub(crate) fn validate(&self) -> Result<(), ProfilerError> {
        let bad = |field: &str, reason: &str| Err(ConfigError::new(field, reason).into());
        if self.max_spans == 0 {
            return bad("store.max_spans", "must be at least 1");
        }
        if self.max_stacks < 2 {
            return bad("store.max_stacks", "must be at least 2");
        }
        if self.max_bytes < 1 << 20 {
            return bad("store.max_bytes", "must be at least 1 MiB");
        }
        if self.bucket_width < Duration::from_millis(100) {
            return bad("store.bucket_width", "must be at least 100ms");
        }
        if self.buckets == 0 {
            return bad("store.buckets", "must be at least 1");
        }
        Ok(())
    }
}

/// Counters of the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Spans held.
    pub spans: usize,
    /// Stacks held.
    pub stacks: usize,
    /// Estimated bytes held.
    pub bytes: usize,
    /// Samples received.
    pub samples: u64,
    /// Samples received that carried no labels (kept in the process aggregate only).
    pub unlabelled_samples: u64,
    /// Spans evicted to stay within the bounds.
    pub spans_evicted: u64,
    /// Samples whose new stack did not fit the stack table.
    pub stacks_dropped: u64,
    /// Time buckets evicted early to stay within the byte bound.
    pub buckets_evicted: u64,
}

/// One span known to the store.
#[derive(Debug, Clone)]
pub struct SpanSummary {
    /// The span's labels (`hot` is the highest seen in its samples).
    pub labels: Arc<SampleLabels>,
    /// Samples of this span alone.
    pub samples: u64,
    /// Weighted CPU estimate of this span alone.
    pub cpu_ns: u64,
    /// When its first sample was taken.
    pub first_sample: SystemTime,
    /// When its last sample was taken.
    pub last_sample: SystemTime,
}

/// What the collector hands the store for one sample.
pub(crate) struct IncomingSample<'a> {
    pub(crate) labels: Option<IncomingLabels>,
    pub(crate) addrs: &'a [u64],
    pub(crate) time_ns: u64,
    pub(crate) weight_ns: u64,
    /// A wall-clock sample (its weight is wall time), not a CPU sample.
    pub(crate) wall: bool,
}

/// A sample's labels: its ids, how hot it was, and the same resolved to strings by
/// the collector (shared with the profile windows; a new span entry keeps it).
pub(crate) struct IncomingLabels {
    pub(crate) ids: LabelIds,
    pub(crate) hot: Hotness,
    pub(crate) resolved: Arc<SampleLabels>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    count: u64,
    cpu_ns: u64,
    wall_ns: u64,
}

impl Counts {
    /// One sample: CPU (counted, its weight CPU time) or wall-clock.
    fn add(&mut self, weight: u64, wall: bool) {
        if wall {
            self.wall_ns += weight;
        } else {
            self.count += 1;
            self.cpu_ns += weight;
        }
    }
}

struct State {
    cfg: StoreConfig,
    stacks: Vec<Option<StackEntry>>,
    free_stacks: Vec<u32>,
    stack_ids: FastMap<Box<[u64]>, u32>,
    spans: FastMap<u64, SpanEntry>,
    span_order: VecDeque<(u64, u64)>,
    next_seq: u64,
    buckets: VecDeque<Bucket>,
    bytes: usize,
    stats: StoreStats,
}

/// Aggregated, symbolized samples, queried by span, span tree, trace, route or
/// process. Cloning gives another handle to the same store.
#[derive(Clone)]
pub struct SpanProfileStore {
    state: Arc<Mutex<State>>,
    period_ns: u64,
    mono_base_ns: u64,
    wall_base: SystemTime,
}

impl std::fmt::Debug for SpanProfileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanProfileStore")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Stack id 0: the stand-in for stacks that did not fit.
const OVERFLOW_STACK: u32 = 0;

pub(crate) use crate::sys::monotonic_now_ns;

impl SpanProfileStore {
    /// An empty store with the given bounds; `period_ns` is the baseline period
    /// reported in profiles.
    pub fn new(cfg: StoreConfig, period_ns: u64) -> Self {
        let overflow_frames: Stack = Arc::from(vec![crate::profile::Frame {
            function: Arc::from("[dropped: stack table full]"),
            file: None,
            line: 0,
            address: 0,
            inlined: false,
        }]);
        let mut stack_ids = FastMap::default();
        stack_ids.insert(
            Box::from([crate::profile::OVERFLOW_ADDR].as_slice()),
            OVERFLOW_STACK,
        );
        let state = State {
            cfg,
            stacks: vec![Some(StackEntry {
                addrs: Box::from([crate::profile::OVERFLOW_ADDR].as_slice()),
                frames: overflow_frames,
                refs: u32::MAX / 2,
            })],
            free_stacks: Vec::new(),
            stack_ids,
            spans: FastMap::default(),
            span_order: VecDeque::new(),
            next_seq: 0,
            buckets: VecDeque::new(),
            bytes: 0,
            stats: StoreStats::default(),
        };
        SpanProfileStore {
            state: Arc::new(Mutex::new(state)),
            period_ns,
            mono_base_ns: monotonic_now_ns(),
            wall_base: SystemTime::now(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wall(&self, mono_ns: u64) -> SystemTime {
        if mono_ns >= self.mono_base_ns {
            self.wall_base + Duration::from_nanos(mono_ns - self.mono_base_ns)
        } else {
            self.wall_base - Duration::from_nanos(self.mono_base_ns - mono_ns)
        }
    }

    /// Adds samples. `frames_of` symbolizes a raw stack the store has not seen.
    pub(crate) fn insert(
        &self,
        samples: &[IncomingSample<'_>],
        mut frames_of: impl FnMut(&[u64]) -> Stack,
    ) {
        let mut st = self.lock();
        for s in samples {
            st.stats.samples += 1;
            let stack = st.stack_id(s.addrs, &mut frames_of);
            let route = s.labels.as_ref().map_or(NameId::NONE, |l| l.ids.route);
            match &s.labels {
                Some(l) if l.ids.has_span() => {
                    st.add_to_bucket(s.time_ns, (route, true, stack), s.weight_ns, s.wall);
                    st.add_to_span(l, stack, s.time_ns, s.weight_ns, s.wall)
                }
                _ => {
                    st.add_to_bucket(s.time_ns, (route, false, stack), s.weight_ns, s.wall);
                    st.stats.unlabelled_samples += 1
                }
            }
            st.enforce_bounds();
        }
    }

    /// The baseline period reported in profiles.
    pub fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// Counters.
    pub fn stats(&self) -> StoreStats {
        let st = self.lock();
        let mut s = st.stats;
        s.spans = st.spans.len();
        s.stacks = st.stack_ids.len();
        s.bytes = st.bytes;
        s
    }
}

impl State {
    fn enforce_bounds(&mut self) {
        while self.spans.len() > self.cfg.max_spans {
            if !self.evict_oldest_span() {
                break;
            }
        }
        while self.bytes > self.cfg.max_bytes {
            if !self.evict_oldest_span() {
                if self.buckets.len() > 1 {
                    self.drop_oldest_bucket();
                    self.stats.buckets_evicted += 1;
                } else {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intern;
    use crate::profile::Frame;

    fn frames(addrs: &[u64]) -> Stack {
        addrs
            .iter()
            .map(|a| Frame {
                function: Arc::from(format!("fn_{a}")),
                file: None,
                line: 0,
                address: *a,
                inlined: false,
            })
            .collect::<Vec<_>>()
            .into()
    }

    fn labels(span: u64, parent: u64, root: u64) -> IncomingLabels {
        let ids = LabelIds {
            trace_id: 7,
            span_id: span,
            parent_span_id: parent,
            root_span_id: root,
            span_name: intern::intern("test span"),
            route: intern::intern("GET /store-test"),
        };
        IncomingLabels {
            ids,
            hot: Hotness::Cold,
            resolved: Arc::new(ids.resolve(Hotness::Cold)),
        }
    }

    fn sample(l: Option<IncomingLabels>, addrs: &[u64]) -> IncomingSample<'_> {
        IncomingSample {
            labels: l,
            addrs,
            time_ns: monotonic_now_ns(),
            weight_ns: 10,
            wall: false,
        }
    }

    #[test]
    fn span_tree_trace_route_and_process() {
        let store = SpanProfileStore::new(StoreConfig::default(), 10);
        let root = labels(1, 0, 1);
        let child = labels(2, 1, 1);
        let grandchild = labels(3, 2, 1);
        store.insert(
            &[
                sample(Some(root), &[10, 1]),
                sample(Some(child), &[20, 1]),
                sample(Some(grandchild), &[30, 1]),
                sample(None, &[40, 1]),
            ],
            frames,
        );
        assert_eq!(store.span(1).unwrap().sample_count(), 1);
        assert_eq!(store.span_tree(2).unwrap().sample_count(), 2);
        assert_eq!(store.span_tree(1).unwrap().sample_count(), 3);
        assert_eq!(store.trace(7).unwrap().sample_count(), 3);
        assert!(store.trace(8).is_none());
        assert_eq!(
            store
                .route("GET /store-test", Duration::from_secs(60))
                .sample_count(),
            3
        );
        assert_eq!(store.process(Duration::from_secs(60)).sample_count(), 4);
        let top = store.span(2).unwrap().top_functions(1);
        assert_eq!(&*top[0].function, "fn_20");
        assert_eq!(store.stats().unlabelled_samples, 1);
    }

    #[test]
    fn bounds_evict_oldest_and_free_stacks() {
        let cfg = StoreConfig {
            max_spans: 10,
            max_stacks: 20,
            buckets: 1,
            ..StoreConfig::default()
        };
        let store = SpanProfileStore::new(cfg, 10);
        let addrs: Vec<[u64; 2]> = (0..100).map(|i| [1000 + i, 1]).collect();
        for (i, a) in addrs.iter().enumerate() {
            store.insert(
                &[sample(Some(labels(100 + i as u64, 0, 100 + i as u64)), a)],
                frames,
            );
        }
        let s = store.stats();
        assert_eq!(s.spans, 10);
        assert_eq!(s.spans_evicted, 90);
        assert!(s.stacks <= 20, "{s:?}");
        assert!(s.stacks_dropped > 0);
        assert!(store.span(100).is_none(), "oldest evicted");
        assert!(store.span(199).is_some(), "newest kept");
    }

    /// A span's summary reports the hottest of its samples, and names it from the
    /// labels the collector resolved (kept, not resolved again); per-sample hotness
    /// stays in the span's profile.
    #[test]
    fn a_span_keeps_the_resolved_labels_and_reports_its_hottest_sample() {
        let store = SpanProfileStore::new(StoreConfig::default(), 10);
        let cold = labels(42, 0, 42);
        let resolved = cold.resolved.clone();
        let slow = IncomingLabels {
            hot: Hotness::Slow,
            resolved: Arc::new(cold.ids.resolve(Hotness::Slow)),
            ..labels(42, 0, 42)
        };
        store.insert(
            &[sample(Some(cold), &[1]), sample(Some(slow), &[2])],
            frames,
        );
        let summary = store.span_summary(42).expect("kept");
        assert_eq!(summary.samples, 2);
        assert_eq!(summary.labels.hot, Hotness::Slow, "the hottest sample's");
        assert_eq!(&*summary.labels.span_name, "test span");
        assert_eq!(&*summary.labels.route, "GET /store-test");
        assert_eq!(
            Arc::strong_count(&resolved),
            2,
            "the store holds the first sample's labels"
        );
        let profile = store.span(42).expect("kept");
        let mut hot: Vec<Hotness> = profile
            .samples
            .iter()
            .map(|s| s.labels.as_ref().unwrap().hot)
            .collect();
        hot.sort_by_key(|h| *h as u8);
        assert_eq!(hot, [Hotness::Cold, Hotness::Slow]);
    }
}
