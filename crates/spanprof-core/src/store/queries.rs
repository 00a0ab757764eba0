//! The store's answers: a span, a span tree, a trace, a route, the process.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::intern::{self, NameId};
use crate::profile::{Hotness, Profile, ProfileSample, SampleLabels, Stack};

use super::*;

impl SpanProfileStore {
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
            e.0.wall_ns += c.wall_ns;
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
                                latency: None,
                            })
                        })
                    })
                    .clone();
                ProfileSample {
                    stack: frames,
                    labels,
                    count: c.count,
                    cpu_ns: c.cpu_ns,
                    wall_ns: c.wall_ns,
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
                    wall_ns: c.wall_ns,
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
