//! Recent finished spans, grouped by trace, for the viewer: an OpenTelemetry span
//! processor that records each span as it ends (after spanprof's attributes were
//! added) and passes it on. Bounded by traces and by spans, oldest traces evicted
//! first; within a trace past [`MAX_SPANS_PER_TRACE`], the longest spans are kept.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use opentelemetry::Value;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};
use serde::Serialize;

/// Default number of traces kept.
pub const DEFAULT_MAX_TRACES: usize = 2_000;
/// Default number of spans kept, all traces together (about 20 MB of records).
pub const DEFAULT_MAX_RECENT_SPANS: usize = 50_000;
/// Most spans kept per trace. Past it, a trace keeps its local roots (spans
/// without a parent) and its longest other spans: a connection trace of thousands
/// of commands keeps the connection span and its slowest commands; the others are
/// counted ([`TraceSummary::spans_left_out`]).
pub const MAX_SPANS_PER_TRACE: usize = 512;

/// One finished span, as the viewer shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SpanRecord {
    /// 32-hex trace id.
    pub trace_id: String,
    /// 16-hex span id.
    pub span_id: String,
    /// 16-hex parent span id ("" for none).
    pub parent_span_id: String,
    /// Span name.
    pub name: String,
    /// The service: the span's `service.name` attribute, else the resource's.
    pub service: String,
    /// Start, Unix ns.
    pub start_unix_ns: u64,
    /// Duration, ns.
    pub duration_ns: u64,
    /// `spanprof.busy_ns`, if profiled.
    pub busy_ns: Option<i64>,
    /// `spanprof.idle_ns`.
    pub idle_ns: Option<i64>,
    /// `spanprof.polls`.
    pub polls: Option<i64>,
    /// `spanprof.cpu_samples`.
    pub cpu_samples: Option<i64>,
    /// `spanprof.cpu_ns`.
    pub cpu_ns: Option<i64>,
    /// `spanprof.cpu_source`: `thread_clock` or `samples`.
    pub cpu_source: Option<String>,
    /// `spanprof.blocked_ns`: inside polls, off CPU, not runnable.
    pub blocked_ns: Option<i64>,
    /// `spanprof.sched_delay_ns`: runnable but not running.
    pub sched_delay_ns: Option<i64>,
    /// `spanprof.wait_ns`: the rest of the duration.
    pub wait_ns: Option<i64>,
    /// `spanprof.long_polls`.
    pub long_polls: Option<i64>,
    /// `spanprof.hot`.
    pub hot: Option<String>,
    /// `pyroscope.profile.id`.
    pub profile_id: Option<String>,
}

impl SpanRecord {
    /// Estimated bytes of the record and its strings.
    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.trace_id.capacity()
            + self.span_id.capacity()
            + self.parent_span_id.capacity()
            + self.name.capacity()
            + self.service.capacity()
            + self.hot.as_ref().map_or(0, String::capacity)
            + self.profile_id.as_ref().map_or(0, String::capacity)
    }

    /// Which spans a full trace keeps: local roots first, then the longest.
    fn keep_rank(&self) -> (bool, u64) {
        (self.parent_span_id.is_empty(), self.duration_ns)
    }
}

#[derive(Default)]
struct Trace {
    spans: Vec<SpanRecord>,
    /// Spans not kept because the trace was full.
    left_out: u64,
    /// The index of the span a full trace gives up first (lowest `keep_rank`).
    weakest: usize,
}

impl Trace {
    /// Adds `rec`, or, when full, keeps it in place of the weakest span if it ranks
    /// higher. Returns the bytes added (negative when a larger record left) and
    /// whether a span was left out.
    fn add(&mut self, rec: SpanRecord) -> (isize, bool) {
        if self.spans.len() < MAX_SPANS_PER_TRACE {
            let added = rec.bytes() as isize;
            self.spans.push(rec);
            if self.spans.len() == MAX_SPANS_PER_TRACE {
                self.find_weakest();
            }
            return (added, false);
        }
        self.left_out += 1;
        if rec.keep_rank() <= self.spans[self.weakest].keep_rank() {
            return (0, true);
        }
        let added = rec.bytes() as isize;
        let gone = std::mem::replace(&mut self.spans[self.weakest], rec);
        self.find_weakest();
        (added - gone.bytes() as isize, true)
    }

    fn find_weakest(&mut self) {
        self.weakest = self
            .spans
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| s.keep_rank())
            .map_or(0, |(i, _)| i);
    }
}

#[derive(Default)]
struct Inner {
    traces: HashMap<String, Trace>,
    order: VecDeque<String>,
    spans: usize,
    bytes: usize,
    left_out: u64,
    traces_evicted: u64,
}

impl Inner {
    fn evict_oldest(&mut self) -> bool {
        let Some(old) = self.order.pop_front() else {
            return false;
        };
        if let Some(t) = self.traces.remove(&old) {
            self.spans -= t.spans.len();
            self.bytes -= t.spans.iter().map(SpanRecord::bytes).sum::<usize>();
            self.traces_evicted += 1;
        }
        true
    }
}

/// The recent spans store; cheap to clone.
#[derive(Clone, Default)]
pub struct RecentSpans {
    inner: Arc<Mutex<Inner>>,
    max_traces: usize,
    max_spans: usize,
}

impl std::fmt::Debug for RecentSpans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecentSpans")
            .field("max_traces", &self.max_traces)
            .field("max_spans", &self.max_spans)
            .finish()
    }
}

/// What [`RecentSpans`] holds, with its bounds: what [`RecentSpans::stats`] returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RecentSpansStats {
    /// Traces held.
    pub traces: usize,
    /// Their bound.
    pub max_traces: usize,
    /// Spans held, all traces together.
    pub spans: usize,
    /// Their bound.
    pub max_spans: usize,
    /// Estimated bytes of the spans held (records and their strings, not the maps).
    pub bytes: usize,
    /// Spans not kept because their trace had [`MAX_SPANS_PER_TRACE`] longer ones.
    pub spans_left_out: u64,
    /// Traces evicted, oldest first, to stay within the bounds.
    pub traces_evicted: u64,
}

/// A trace summary (for the trace list).
#[derive(Debug, Clone, Serialize)]
pub struct TraceSummary {
    /// 32-hex trace id.
    pub trace_id: String,
    /// The root span's name.
    pub root: String,
    /// The root span's service.
    pub service: String,
    /// The root span's start, Unix ns.
    pub start_unix_ns: u64,
    /// The root span's duration, ns.
    pub duration_ns: u64,
    /// Spans kept (at most [`MAX_SPANS_PER_TRACE`]).
    pub spans: usize,
    /// Spans of the trace not kept: it had [`MAX_SPANS_PER_TRACE`] longer ones.
    pub spans_left_out: u64,
    /// Services taking part.
    pub services: Vec<String>,
    /// Whether any span was profiled at the high rate, and why.
    pub hot: Option<String>,
    /// The root span's id.
    pub root_span_id: String,
}

impl RecentSpans {
    /// An empty store keeping `max_traces` traces and at most
    /// [`DEFAULT_MAX_RECENT_SPANS`] spans in all.
    pub fn new(max_traces: usize) -> Self {
        RecentSpans {
            inner: Arc::default(),
            max_traces: max_traces.max(1),
            max_spans: DEFAULT_MAX_RECENT_SPANS,
        }
    }

    /// Keeps at most `max_spans` spans, all traces together (at least one trace's
    /// worth: [`MAX_SPANS_PER_TRACE`]); the oldest traces are evicted first. Call it
    /// before [`RecentSpans::processor`]: clones made earlier keep the old bound.
    pub fn with_max_spans(mut self, max_spans: usize) -> Self {
        self.max_spans = max_spans.max(MAX_SPANS_PER_TRACE);
        self
    }

    /// What the store holds, with its bounds.
    pub fn stats(&self) -> RecentSpansStats {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        RecentSpansStats {
            traces: g.traces.len(),
            max_traces: self.max_traces,
            spans: g.spans,
            max_spans: self.max_spans,
            bytes: g.bytes,
            spans_left_out: g.left_out,
            traces_evicted: g.traces_evicted,
        }
    }

    /// A span processor recording into this store, then passing spans to `next`
    /// (`None`: recording only).
    pub fn processor(&self, next: Option<Box<dyn SpanProcessor>>) -> SpanRecorder {
        SpanRecorder {
            spans: self.clone(),
            next,
            resource_service: Mutex::new(String::new()),
        }
    }

    fn record(&self, rec: SpanRecord) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let g = &mut *g;
        let (kept_before, (added, left_out)) = match g.traces.get_mut(&rec.trace_id) {
            Some(t) => (t.spans.len(), t.add(rec)),
            None => {
                g.order.push_back(rec.trace_id.clone());
                let t = g.traces.entry(rec.trace_id.clone()).or_default();
                (0, t.add(rec))
            }
        };
        if kept_before < MAX_SPANS_PER_TRACE {
            g.spans += 1;
        }
        g.bytes = g.bytes.saturating_add_signed(added);
        g.left_out += u64::from(left_out);
        while (g.traces.len() > self.max_traces || g.spans > self.max_spans) && g.evict_oldest() {}
    }

    /// Spans named `name` (exactly), slowest first, at most `limit`; only those of
    /// `trace_id` when given.
    pub fn spans_named(&self, name: &str, trace_id: Option<&str>, limit: usize) -> Vec<SpanRecord> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut found: Vec<&SpanRecord> = match trace_id {
            Some(id) => g
                .traces
                .get(id)
                .map(|t| &t.spans[..])
                .unwrap_or_default()
                .iter()
                .collect(),
            None => g.traces.values().flat_map(|t| t.spans.iter()).collect(),
        };
        found.retain(|s| s.name == name);
        found.sort_by_key(|s| std::cmp::Reverse(s.duration_ns));
        found.into_iter().take(limit).cloned().collect()
    }

    /// Traces, slowest root first; `route` filters on the root's name (substring).
    pub fn traces(&self, route: Option<&str>, limit: usize) -> Vec<TraceSummary> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<TraceSummary> = g
            .traces
            .iter()
            .filter_map(|(id, t)| summary(id, t))
            .filter(|s| route.is_none_or(|r| s.root.contains(r)))
            .collect();
        v.sort_by_key(|t| std::cmp::Reverse(t.duration_ns));
        v.truncate(limit);
        v
    }

    /// The spans of one trace, by start time.
    pub fn trace(&self, trace_id: &str) -> Option<Vec<SpanRecord>> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut spans = g.traces.get(trace_id)?.spans.clone();
        spans.sort_by_key(|s| s.start_unix_ns);
        Some(spans)
    }

    /// One span.
    pub fn span(&self, span_id: &str) -> Option<SpanRecord> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.traces
            .values()
            .flat_map(|t| t.spans.iter())
            .find(|s| s.span_id == span_id)
            .cloned()
    }
}

fn summary(id: &str, trace: &Trace) -> Option<TraceSummary> {
    let spans = &trace.spans;
    let ids: std::collections::HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let root = spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty() || !ids.contains(s.parent_span_id.as_str()))
        .min_by_key(|s| s.start_unix_ns)?;
    let mut services: Vec<String> = spans.iter().map(|s| s.service.clone()).collect();
    services.sort();
    services.dedup();
    let hot = spans
        .iter()
        .filter_map(|s| s.hot.clone())
        .max_by_key(|h| h == "slow");
    Some(TraceSummary {
        trace_id: id.to_owned(),
        root: root.name.clone(),
        service: root.service.clone(),
        start_unix_ns: root.start_unix_ns,
        duration_ns: root.duration_ns,
        spans: spans.len(),
        spans_left_out: trace.left_out,
        services,
        hot,
        root_span_id: root.span_id.clone(),
    })
}

/// The span processor made by [`RecentSpans::processor`].
pub struct SpanRecorder {
    spans: RecentSpans,
    next: Option<Box<dyn SpanProcessor>>,
    resource_service: Mutex<String>,
}

impl std::fmt::Debug for SpanRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanRecorder").finish_non_exhaustive()
    }
}

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn int(span: &SpanData, key: &str) -> Option<i64> {
    match attr(span, key)? {
        Value::I64(v) => Some(*v),
        _ => None,
    }
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos() as u64
}

impl SpanProcessor for SpanRecorder {
    fn on_start(&self, span: &mut Span, cx: &opentelemetry::Context) {
        if let Some(n) = &self.next {
            n.on_start(span, cx);
        }
    }

    fn on_end(&self, span: SpanData) {
        let service = attr(&span, "service.name")
            .map(|v| v.as_str().into_owned())
            .unwrap_or_else(|| {
                self.resource_service
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
            });
        let parent = span.parent_span_id;
        self.spans.record(SpanRecord {
            trace_id: span.span_context.trace_id().to_string(),
            span_id: span.span_context.span_id().to_string(),
            parent_span_id: if parent == opentelemetry::trace::SpanId::INVALID {
                String::new()
            } else {
                parent.to_string()
            },
            name: span.name.to_string(),
            service,
            start_unix_ns: unix_ns(span.start_time),
            duration_ns: span
                .end_time
                .duration_since(span.start_time)
                .unwrap_or(Duration::ZERO)
                .as_nanos() as u64,
            busy_ns: int(&span, "spanprof.busy_ns"),
            idle_ns: int(&span, "spanprof.idle_ns"),
            polls: int(&span, "spanprof.polls"),
            cpu_samples: int(&span, "spanprof.cpu_samples"),
            cpu_ns: int(&span, "spanprof.cpu_ns"),
            cpu_source: attr(&span, "spanprof.cpu_source").map(|v| v.as_str().into_owned()),
            blocked_ns: int(&span, "spanprof.blocked_ns"),
            sched_delay_ns: int(&span, "spanprof.sched_delay_ns"),
            wait_ns: int(&span, "spanprof.wait_ns"),
            long_polls: int(&span, "spanprof.long_polls"),
            hot: attr(&span, "spanprof.hot").map(|v| v.as_str().into_owned()),
            profile_id: attr(&span, "pyroscope.profile.id").map(|v| v.as_str().into_owned()),
        });
        if let Some(n) = &self.next {
            n.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.next.as_ref().map_or(Ok(()), |n| n.force_flush())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.next
            .as_ref()
            .map_or(Ok(()), |n| n.shutdown_with_timeout(timeout))
    }

    fn set_resource(&mut self, resource: &Resource) {
        if let Some(v) = resource.get(&opentelemetry::Key::from_static_str("service.name")) {
            *self
                .resource_service
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = v.as_str().into_owned();
        }
        if let Some(n) = &mut self.next {
            n.set_resource(resource);
        }
    }
}
