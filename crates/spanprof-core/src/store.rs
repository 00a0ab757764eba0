//! The span profile store: samples aggregated per (labels, stack), bounded in
//! distinct spans, distinct stacks and bytes, with the oldest evicted first and
//! everything dropped counted.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use crate::intern::{self, NameId};
use crate::profile::{Hotness, Profile, ProfileSample, SampleLabels, Stack};
use crate::sampler::ProfilerError;

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
        let bad = |field, reason: &str| {
            Err(ProfilerError::InvalidConfig {
                field,
                reason: reason.to_owned(),
            })
        };
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
}

#[derive(Clone, Copy)]
pub(crate) struct IncomingLabels {
    pub(crate) trace_id: u128,
    pub(crate) span_id: u64,
    pub(crate) parent_span_id: u64,
    pub(crate) root_span_id: u64,
    pub(crate) span_name: NameId,
    pub(crate) route: NameId,
    pub(crate) hot: Hotness,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    count: u64,
    cpu_ns: u64,
}

impl Counts {
    fn add(&mut self, weight: u64) {
        self.count += 1;
        self.cpu_ns += weight;
    }
}

struct StackEntry {
    addrs: Box<[u64]>,
    frames: Stack,
    refs: u32,
}

struct SpanEntry {
    labels: Arc<SampleLabels>,
    seq: u64,
    first_ns: u64,
    last_ns: u64,
    samples: u64,
    cpu_ns: u64,
    max_hot: Hotness,
    stacks: HashMap<(u32, Hotness), Counts>,
}

struct Bucket {
    start_ns: u64,
    /// Keyed by (route, labelled), then stack: a route's query touches its own
    /// entries only.
    entries: HashMap<(NameId, bool), HashMap<u32, Counts>>,
}

struct State {
    cfg: StoreConfig,
    stacks: Vec<Option<StackEntry>>,
    free_stacks: Vec<u32>,
    stack_ids: HashMap<Box<[u64]>, u32>,
    spans: HashMap<u64, SpanEntry>,
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
        let mut stack_ids = HashMap::new();
        stack_ids.insert(
            Box::from([crate::symbolize::OVERFLOW_ADDR].as_slice()),
            OVERFLOW_STACK,
        );
        let state = State {
            cfg,
            stacks: vec![Some(StackEntry {
                addrs: Box::from([crate::symbolize::OVERFLOW_ADDR].as_slice()),
                frames: overflow_frames,
                refs: u32::MAX / 2,
            })],
            free_stacks: Vec::new(),
            stack_ids,
            spans: HashMap::new(),
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
            let route = s.labels.map_or(NameId::NONE, |l| l.route);
            match s.labels {
                Some(l) if l.span_id != 0 || l.trace_id != 0 => {
                    st.add_to_bucket(s.time_ns, (route, true, stack), s.weight_ns);
                    st.add_to_span(&l, stack, s.time_ns, s.weight_ns)
                }
                _ => {
                    st.add_to_bucket(s.time_ns, (route, false, stack), s.weight_ns);
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

    /// The spans held, newest first.
    pub fn spans(&self) -> Vec<SpanSummary> {
        let st = self.lock();
        let mut v: Vec<(u64, SpanSummary)> = st
            .spans
            .values()
            .map(|e| (e.seq, self.summary(e)))
            .collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.0));
        v.into_iter().map(|(_, s)| s).collect()
    }

    /// One span's summary.
    pub fn span_summary(&self, span_id: u64) -> Option<SpanSummary> {
        let st = self.lock();
        st.spans.get(&span_id).map(|e| self.summary(e))
    }

    fn summary(&self, e: &SpanEntry) -> SpanSummary {
        let mut labels = (*e.labels).clone();
        labels.hot = e.max_hot;
        SpanSummary {
            labels: Arc::new(labels),
            samples: e.samples,
            cpu_ns: e.cpu_ns,
            first_sample: self.wall(e.first_ns),
            last_sample: self.wall(e.last_ns),
        }
    }

    /// The profile of one span alone (samples taken while its own labels were
    /// active). `None` if the store holds no sample of it.
    pub fn span(&self, span_id: u64) -> Option<Profile> {
        let st = self.lock();
        let e = st.spans.get(&span_id)?;
        Some(self.profile_of(&st, [e]))
    }

    /// The profile of one span and every span under it (its descendants in the same
    /// trace, as far as the store knows them; for a local root, every span whose
    /// local root it is).
    pub fn span_tree(&self, span_id: u64) -> Option<Profile> {
        let st = self.lock();
        let trace_id = match st.spans.get(&span_id) {
            Some(e) => e.labels.trace_id,
            None => {
                st.spans
                    .values()
                    .find(|e| {
                        e.labels.parent_span_id == span_id || e.labels.root_span_id == span_id
                    })?
                    .labels
                    .trace_id
            }
        };
        let in_trace: Vec<&SpanEntry> = st
            .spans
            .values()
            .filter(|e| e.labels.trace_id == trace_id)
            .collect();
        let parent: HashMap<u64, u64> = in_trace
            .iter()
            .map(|e| (e.labels.span_id, e.labels.parent_span_id))
            .collect();
        let under = |e: &SpanEntry| {
            if e.labels.span_id == span_id || e.labels.root_span_id == span_id {
                return true;
            }
            let mut cur = e.labels.parent_span_id;
            let mut hops = 0;
            while cur != 0 && hops < 256 {
                if cur == span_id {
                    return true;
                }
                cur = parent.get(&cur).copied().unwrap_or(0);
                hops += 1;
            }
            false
        };
        let chosen: Vec<&SpanEntry> = in_trace.into_iter().filter(|e| under(e)).collect();
        if chosen.is_empty() {
            return None;
        }
        Some(self.profile_of(&st, chosen))
    }

    /// The profile of every span of one trace held here.
    pub fn trace(&self, trace_id: u128) -> Option<Profile> {
        let st = self.lock();
        let chosen: Vec<&SpanEntry> = st
            .spans
            .values()
            .filter(|e| e.labels.trace_id == trace_id)
            .collect();
        if chosen.is_empty() {
            return None;
        }
        Some(self.profile_of(&st, chosen))
    }

    /// The profile of one route (as labelled, for example `POST /checkout`) over the
    /// last `window` (rounded out to whole time buckets). Samples carry the `route`
    /// label only: the time buckets keep routes, not spans, so this answer outlives
    /// span eviction.
    pub fn route(&self, route: &str, window: Duration) -> Profile {
        let id = intern::lookup(route);
        self.window_profile(window, |r, labelled| labelled && Some(r) == id)
    }

    /// The profile of the whole process over the last `window`: every span with a
    /// sample in the window (with its full labels) plus every unlabelled sample.
    /// Spans already evicted from the store are missing; [`SpanProfileStore::route`]
    /// answers for them by route.
    pub fn process(&self, window: Duration) -> Profile {
        let mut p = self.window_profile(window, |_, labelled| !labelled);
        let since = monotonic_now_ns().saturating_sub(window.as_nanos() as u64);
        let st = self.lock();
        let spans = self.profile_of(&st, st.spans.values().filter(|e| e.last_ns >= since));
        p.samples.extend(spans.samples);
        p
    }

    /// The time-bucket entries of the last `window` whose (route, labelled) `keep`
    /// accepts. Under the lock it only copies those entries out (with their frames);
    /// aggregating them happens after the lock is released.
    fn window_profile(&self, window: Duration, keep: impl Fn(NameId, bool) -> bool) -> Profile {
        let now = monotonic_now_ns();
        let since = now.saturating_sub(window.as_nanos() as u64);
        let mut start = now;
        let mut copied: Vec<(NameId, u32, Counts, Stack)> = Vec::new();
        {
            let st = self.lock();
            let width = st.cfg.bucket_width.as_nanos() as u64;
            for b in st.buckets.iter().filter(|b| b.start_ns + width > since) {
                start = start.min(b.start_ns);
                for (&(route, labelled), stacks) in &b.entries {
                    if !keep(route, labelled) {
                        continue;
                    }
                    copied.extend(stacks.iter().filter_map(|(&stack, &c)| {
                        let frames = st.stacks.get(stack as usize)?.as_ref()?.frames.clone();
                        Some((route, stack, c, frames))
                    }));
                }
            }
        }
        let mut agg: HashMap<(NameId, u32), (Counts, Stack)> = HashMap::new();
        for (route, stack, c, frames) in copied {
            let e = agg
                .entry((route, stack))
                .or_insert_with(|| (Counts::default(), frames));
            e.0.count += c.count;
            e.0.cpu_ns += c.cpu_ns;
        }
        let mut labels_of_route: HashMap<NameId, Option<Arc<SampleLabels>>> = HashMap::new();
        let samples = agg
            .into_iter()
            .map(|((route, _), (c, frames))| {
                let labels = labels_of_route
                    .entry(route)
                    .or_insert_with(|| {
                        (route != NameId::NONE).then(|| {
                            Arc::new(SampleLabels {
                                trace_id: 0,
                                span_id: 0,
                                parent_span_id: 0,
                                root_span_id: 0,
                                span_name: Arc::from(""),
                                route: intern::resolve(route),
                                hot: Hotness::Cold,
                            })
                        })
                    })
                    .clone();
                ProfileSample {
                    stack: frames,
                    labels,
                    count: c.count,
                    cpu_ns: c.cpu_ns,
                }
            })
            .collect();
        Profile {
            samples,
            start: self.wall(start),
            duration_ns: now.saturating_sub(start),
            period_ns: self.period_ns,
        }
    }

    fn profile_of<'a>(
        &self,
        st: &State,
        spans: impl IntoIterator<Item = &'a SpanEntry>,
    ) -> Profile {
        let mut samples = Vec::new();
        let (mut first, mut last) = (u64::MAX, 0);
        for e in spans {
            first = first.min(e.first_ns);
            last = last.max(e.last_ns);
            let mut by_hot: HashMap<Hotness, Arc<SampleLabels>> = HashMap::new();
            for (&(stack, hot), c) in &e.stacks {
                let Some(Some(entry)) = st.stacks.get(stack as usize) else {
                    continue;
                };
                let labels = by_hot
                    .entry(hot)
                    .or_insert_with(|| {
                        let mut l = (*e.labels).clone();
                        l.hot = hot;
                        Arc::new(l)
                    })
                    .clone();
                samples.push(ProfileSample {
                    stack: entry.frames.clone(),
                    labels: Some(labels),
                    count: c.count,
                    cpu_ns: c.cpu_ns,
                });
            }
        }
        if first == u64::MAX {
            first = monotonic_now_ns();
            last = first;
        }
        Profile {
            samples,
            start: self.wall(first),
            duration_ns: last - first,
            period_ns: self.period_ns,
        }
    }
}

impl State {
    fn stack_id(&mut self, addrs: &[u64], frames_of: &mut impl FnMut(&[u64]) -> Stack) -> u32 {
        if let Some(&id) = self.stack_ids.get(addrs) {
            return id;
        }
        if self.stack_ids.len() >= self.cfg.max_stacks {
            self.stats.stacks_dropped += 1;
            return OVERFLOW_STACK;
        }
        let frames = frames_of(addrs);
        self.bytes += STACK_BYTES + 8 * addrs.len() + FRAME_BYTES * frames.len();
        let entry = StackEntry {
            addrs: addrs.into(),
            frames,
            refs: 0,
        };
        let id = match self.free_stacks.pop() {
            Some(id) => {
                self.stacks[id as usize] = Some(entry);
                id
            }
            None => {
                self.stacks.push(Some(entry));
                (self.stacks.len() - 1) as u32
            }
        };
        self.stack_ids.insert(addrs.into(), id);
        id
    }

    fn stack_ref(&mut self, id: u32) {
        if let Some(Some(e)) = self.stacks.get_mut(id as usize) {
            e.refs = e.refs.saturating_add(1);
        }
    }

    fn stack_unref(&mut self, id: u32) {
        let Some(Some(e)) = self.stacks.get_mut(id as usize) else {
            return;
        };
        e.refs = e.refs.saturating_sub(1);
        if e.refs == 0 && id != OVERFLOW_STACK {
            let e = self.stacks[id as usize].take().expect("checked above");
            self.stack_ids.remove(&e.addrs);
            self.bytes = self
                .bytes
                .saturating_sub(STACK_BYTES + 8 * e.addrs.len() + FRAME_BYTES * e.frames.len());
            self.free_stacks.push(id);
        }
    }

    fn add_to_bucket(&mut self, time_ns: u64, key: (NameId, bool, u32), weight: u64) {
        let (route, labelled, stack) = key;
        let width = self.cfg.bucket_width.as_nanos() as u64;
        let start = time_ns - time_ns % width;
        let need_new = self.buckets.back().is_none_or(|b| b.start_ns < start);
        if need_new {
            self.buckets.push_back(Bucket {
                start_ns: start,
                entries: HashMap::new(),
            });
            while self.buckets.len() > self.cfg.buckets {
                self.drop_oldest_bucket();
            }
        }
        // Late samples (older than the newest bucket) go to the bucket they belong to
        // if it is still held, else to the oldest.
        let idx = self
            .buckets
            .iter()
            .rposition(|b| b.start_ns <= start)
            .unwrap_or(0);
        let stacks = self.buckets[idx]
            .entries
            .entry((route, labelled))
            .or_default();
        let is_new = !stacks.contains_key(&stack);
        stacks.entry(stack).or_default().add(weight);
        if is_new {
            self.bytes += BUCKET_ENTRY_BYTES;
            self.stack_ref(stack);
        }
    }

    fn drop_oldest_bucket(&mut self) {
        if let Some(b) = self.buckets.pop_front() {
            for stack in b.entries.into_values().flat_map(HashMap::into_keys) {
                self.bytes = self.bytes.saturating_sub(BUCKET_ENTRY_BYTES);
                self.stack_unref(stack);
            }
        }
    }

    fn add_to_span(&mut self, l: &IncomingLabels, stack: u32, time_ns: u64, weight: u64) {
        if !self.spans.contains_key(&l.span_id) {
            let seq = self.next_seq;
            self.next_seq += 1;
            self.span_order.push_back((l.span_id, seq));
            self.bytes += SPAN_BYTES;
            self.spans.insert(
                l.span_id,
                SpanEntry {
                    labels: Arc::new(SampleLabels {
                        trace_id: l.trace_id,
                        span_id: l.span_id,
                        parent_span_id: l.parent_span_id,
                        root_span_id: l.root_span_id,
                        span_name: intern::resolve(l.span_name),
                        route: intern::resolve(l.route),
                        hot: Hotness::Cold,
                    }),
                    seq,
                    first_ns: time_ns,
                    last_ns: time_ns,
                    samples: 0,
                    cpu_ns: 0,
                    max_hot: Hotness::Cold,
                    stacks: HashMap::new(),
                },
            );
        }
        let e = self.spans.get_mut(&l.span_id).expect("inserted above");
        e.first_ns = e.first_ns.min(time_ns);
        e.last_ns = e.last_ns.max(time_ns);
        e.samples += 1;
        e.cpu_ns += weight;
        if (l.hot as u8) > (e.max_hot as u8) {
            e.max_hot = l.hot;
        }
        let key = (stack, l.hot);
        let is_new = !e.stacks.contains_key(&key);
        e.stacks.entry(key).or_default().add(weight);
        if is_new {
            self.bytes += SPAN_STACK_BYTES;
            self.stack_ref(stack);
        }
    }

    fn evict_oldest_span(&mut self) -> bool {
        while let Some((id, seq)) = self.span_order.pop_front() {
            if self.spans.get(&id).is_some_and(|e| e.seq == seq) {
                let e = self.spans.remove(&id).expect("checked");
                self.bytes = self
                    .bytes
                    .saturating_sub(SPAN_BYTES + SPAN_STACK_BYTES * e.stacks.len());
                for (stack, _) in e.stacks.into_keys() {
                    self.stack_unref(stack);
                }
                self.stats.spans_evicted += 1;
                return true;
            }
        }
        false
    }

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
        IncomingLabels {
            trace_id: 7,
            span_id: span,
            parent_span_id: parent,
            root_span_id: root,
            span_name: intern::intern("test span"),
            route: intern::intern("GET /store-test"),
            hot: Hotness::Cold,
        }
    }

    fn sample(l: Option<IncomingLabels>, addrs: &[u64]) -> IncomingSample<'_> {
        IncomingSample {
            labels: l,
            addrs,
            time_ns: monotonic_now_ns(),
            weight_ns: 10,
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
}
