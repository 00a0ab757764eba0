#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs` (Cargo.toml's `[package.metadata.docs.rs]`): each
// item behind a feature then says which.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The profiler and how it samples.
pub use spanprof_core::{
    Capabilities, ConfigError, Mechanism, ProfileScope, ProfileWindow, Profiler, ProfilerBuilder,
    ProfilerError, Sampling, StoreConfig, Unwinding,
};
// Labels: what every poll carries.
pub use spanprof_core::{
    Hotness, LabelGuard, Labelled, NameId, SpanLabels, SpanLabelsBuilder, WithSpanLabels,
    current_labels, labels_active, set_max_names, spawn_blocking, spawn_local,
};
// Runtime threads and tokio's hooks.
pub use spanprof_core::{
    TASK_INHERITANCE, ThreadRegistration, deregister_current_thread, install_runtime_hooks,
    on_thread_start, on_thread_stop, register_current_thread,
};
// Profiles and the store that keeps them.
pub use spanprof_core::{
    Frame, FunctionCost, Profile, ProfileSample, SampleLabels, SpanCost, SpanProfileStore,
    SpanSummary, Stack, env_service_name, pprof, setup,
};
// How long each request took against its route's recent ones.
pub use spanprof_core::{LatencyClass, RouteLatency, route_latency};

/// Health counters and clocks: how much spanprof kept, dropped and evicted, and the
/// CPU clocks its figures are read from. [`Profiler::sampler_stats`],
/// [`Profiler::memory_stats`] and [`SpanProfileStore::stats`] return some of these;
/// the rest are process-wide.
pub mod stats {
    pub use spanprof_core::{
        CacheStats, InheritanceStats, InternStats, MemoryStats, PollStats, SamplerStats,
        StoreStats, inheritance_stats, intern_stats, long_polls, process_cpu_time, thread_cpu_time,
    };
    #[cfg(feature = "export")]
    pub use spanprof_export::DeliveryStats;
    #[cfg(feature = "tower")]
    pub use spanprof_tower::{SpanExportStats, ended_unexported, tracking_evicted};
    #[cfg(feature = "viewer")]
    pub use spanprof_viewer::{DebugEndpointStats, debug_endpoint_stats};
}

/// The documented defaults and bounds of the configuration: each setter's doc names
/// the constant it defaults to.
pub mod defaults {
    pub use spanprof_core::{
        DEFAULT_BASELINE_HZ, DEFAULT_BUCKET_WIDTH, DEFAULT_BUCKETS, DEFAULT_CACHE_BYTES,
        DEFAULT_DRAIN_INTERVAL, DEFAULT_HIGH_HZ, DEFAULT_LONG_POLL, DEFAULT_MAX_BYTES,
        DEFAULT_MAX_NAMES, DEFAULT_MAX_SPANS, DEFAULT_MAX_STACKS, DEFAULT_RING_CAPACITY,
        DEFAULT_WALL_HZ, DEFAULT_WINDOW_ENTRIES, DETACHED_SPAN_NAME, MAX_FRAMES, MAX_HIGH_HZ,
        MAX_NAME_LEN, OVERFLOW_NAME, TIMER_MAX_HZ,
    };
}

/// OpenTelemetry's process context (OTEP 4719) and thread context (OTEP 4947), for
/// profilers outside the process (the repository's `docs/ebpf-profiler.md`).
#[cfg(feature = "otel-thread-ctx")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel-thread-ctx")))]
pub mod otel_thread_ctx {
    pub use spanprof_core::{
        ATTRIBUTE_KEYS, ProcessContext, SCHEMA_VERSION, set_process_context_resource,
    };
}

/// Runs an `async fn main` on a tokio runtime built with [`install_runtime_hooks`],
/// as `#[tokio::main]` would without them: every runtime thread, and the one running
/// `main`'s future, registered for sampling and, with `--cfg tokio_unstable`, tasks a
/// request spawns labelled as it is. Takes `#[tokio::main]`'s `flavor = "multi_thread" | "current_thread"` and
/// `worker_threads = N` (and `crate = "path"` where `spanprof` is renamed); the
/// program must depend on `tokio` with the runtime flavour it asks for, as with
/// `#[tokio::main]`.
///
/// ```
/// #[spanprof::main(worker_threads = 2)]
/// async fn main() {
///     let answer = tokio::spawn(async { 6 * 7 }).await.unwrap();
///     assert_eq!(answer, 42);
/// }
/// ```
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use spanprof_macros::main;

/// The Tower middleware, the tracing layer and the OpenTelemetry span processor.
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower {
    /// A plain hyper service wrapper (feature `hyper`).
    #[cfg(feature = "hyper")]
    #[cfg_attr(docsrs, doc(cfg(feature = "hyper")))]
    pub mod hyper_service {
        pub use spanprof_tower::hyper_service::*;
    }
    pub use spanprof_tower::{
        ATTR_BLOCKED_NS, ATTR_BUSY_NS, ATTR_CPU_NS, ATTR_CPU_SAMPLES, ATTR_CPU_SOURCE, ATTR_HOT,
        ATTR_IDLE_NS, ATTR_LONG_POLLS, ATTR_MAX_POLL_NS, ATTR_POLLS, ATTR_PROFILE_ID,
        ATTR_SCHED_DELAY_NS, ATTR_WAIT_NS, ConfigError, DEFAULT_MAX_ROUTES, DEFAULT_SAMPLE_RATE,
        DEFAULT_SLOW_AFTER, DefaultRoute, GrpcRoute, MAX_MAX_ROUTES, MAX_TRACKED_SPANS, MakeRoute,
        PolicyConfig, ProfileCorrelation, ProfileCorrelationLayer, ProfileCorrelationLayerBuilder,
        ProfileScope, ProfiledBody, ResponseFuture, RoutePolicy, RoutePolicyConfig,
        SpanExportStats, SpanExportWatch, SpanProfileLayer, SpanProfileProcessor, SpanSelector,
        UNKNOWN_ROUTE, UNMATCHED_ROUTE, WatchedBatch, ended_unexported, extract_trace_context,
        parse_duration, rate_picks, tracking_evicted,
    };
}

#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub use spanprof_tower::{
    ProfileCorrelationLayer, RoutePolicy, SpanProfileLayer, SpanProfileProcessor, SpanSelector,
};

/// Sinks: periodic pprof files, Grafana Pyroscope push, OTLP profiles and spans, with
/// delivery that survives outages.
#[cfg(feature = "export")]
#[cfg_attr(docsrs, doc(cfg(feature = "export")))]
pub mod export {
    pub use spanprof_export::{
        DEFAULT_FILE_INTERVAL, DEFAULT_MAX_FILES, DEFAULT_SHUTDOWN_DEADLINE,
        DEFAULT_SPAN_QUEUE_BATCHES, DEFAULT_SPAN_QUEUE_BYTES, Delivery, DeliveryConfig,
        DeliveryStats, ExportError, OtlpProfilesConfig, OtlpProfilesExporter, OtlpProtocol,
        OtlpSpanExporter, OtlpSpansConfig, PprofFileConfig, PprofFileExporter, ProfileSource,
        PyroscopeAuth, PyroscopeConfig, PyroscopeExporter, RejectStatus, SendError, Sinks,
        SpanDeliveryHandle, Transport, read_ca_certificates, redact_url,
    };
}

/// The embedded viewer: recent traces, a span's waterfall and its flamegraph at
/// `/debug/spanprof/`, served from a loopback port, thread and runtime of its own.
///
/// The one line (see the crate's front page for the span recorder it reads):
/// `ViewerThread::start(Viewer::new(profiler, spans), addr, Exposure::LoopbackOnly)?`.
#[cfg(feature = "viewer")]
#[cfg_attr(docsrs, doc(cfg(feature = "viewer")))]
pub mod viewer {
    pub use spanprof_viewer::{
        DEBUG_PROFILE_PATH, DEFAULT_ALLOWED_HOSTS, DEFAULT_MAX_RECENT_SPANS, DEFAULT_MAX_TRACES,
        DebugEndpointStats, Exposure, MAX_CONCURRENT_RENDERS, MAX_CONCURRENT_WINDOWS,
        MAX_SPANS_PER_TRACE, RecentSpans, RecentSpansStats, SpanRecord, SpanRecorder, TraceSummary,
        VIEWER_PATH, Viewer, ViewerThread, debug_endpoint_stats, debug_router,
        debug_router_with_hosts, serve,
    };
}
