//! Recent finished spans, grouped by trace, for the viewer: an OpenTelemetry span
//! processor that records each span as it ends (after spanprof's attributes were
//! added) and passes it on. Bounded by traces, oldest evicted first.

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
/// Most spans kept per trace.
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
    /// `spanprof.hot`.
    pub hot: Option<String>,
    /// `pyroscope.profile.id`.
    pub profile_id: Option<String>,
}

struct Trace {
    spans: Vec<SpanRecord>,
}

#[derive(Default)]
struct Inner {
    traces: HashMap<String, Trace>,
    order: VecDeque<String>,
}

/// The recent spans store; cheap to clone.
#[derive(Clone, Default)]
pub struct RecentSpans {
    inner: Arc<Mutex<Inner>>,
    max_traces: usize,
}

impl std::fmt::Debug for RecentSpans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecentSpans")
            .field("max_traces", &self.max_traces)
            .finish()
    }
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
    /// Spans recorded.
    pub spans: usize,
    /// Services taking part.
    pub services: Vec<String>,
    /// Whether any span was profiled at the high rate, and why.
    pub hot: Option<String>,
    /// The root span's id.
    pub root_span_id: String,
}

impl RecentSpans {
    /// An empty store keeping `max_traces` traces.
    pub fn new(max_traces: usize) -> Self {
        RecentSpans {
            inner: Arc::default(),
            max_traces: max_traces.max(1),
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
        let key = rec.trace_id.clone();
        if !g.traces.contains_key(&key) {
            g.order.push_back(key.clone());
            g.traces.insert(key.clone(), Trace { spans: Vec::new() });
        }
        let t = g.traces.get_mut(&key).expect("inserted");
        if t.spans.len() < MAX_SPANS_PER_TRACE {
            t.spans.push(rec);
        }
        while g.traces.len() > self.max_traces {
            let Some(old) = g.order.pop_front() else {
                break;
            };
            g.traces.remove(&old);
        }
    }

    /// Traces, slowest root first; `route` filters on the root's name (substring).
    pub fn traces(&self, route: Option<&str>, limit: usize) -> Vec<TraceSummary> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<TraceSummary> = g
            .traces
            .iter()
            .filter_map(|(id, t)| summary(id, &t.spans))
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

fn summary(id: &str, spans: &[SpanRecord]) -> Option<TraceSummary> {
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
