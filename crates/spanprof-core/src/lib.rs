#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
// Without the sampler (every target but Linux; see build.rs) nothing feeds the
// collector, the symbolizer or the store's ingest path. They are still compiled, so
// the public API is the same everywhere, but go unused.
#![cfg_attr(not(spanprof_sampler), allow(dead_code))]

mod cache;
mod clock;
mod collector;
mod error;
mod future;
mod hooks;
mod intern;
mod labels;
mod latency;
mod line;
mod long_poll;
mod offcpu;
#[cfg(feature = "otel-thread-ctx")]
mod otel_ctx;
mod poll;
pub mod pprof;
mod profile;
mod registration;
mod sampler;
#[doc(hidden)]
pub mod scope;
mod service;
pub mod setup;
#[doc(hidden)]
pub mod span_map;
mod store;
mod symbolize;
mod sys;
mod threads;
mod window;

pub use cache::CacheStats;
pub use error::{ConfigError, ProfilerError};
pub use future::{Labelled, WithSpanLabels, spawn_blocking, spawn_local};
pub use hooks::{
    InheritanceStats, TASK_INHERITANCE, inheritance_stats, install_runtime_hooks, on_thread_start,
    on_thread_stop,
};
pub use intern::{
    DEFAULT_MAX_NAMES, DETACHED_SPAN_NAME, InternStats, MAX_NAME_LEN, NameId, OVERFLOW_NAME,
    intern_stats, set_max_names,
};
pub use labels::{SpanLabels, SpanLabelsBuilder, current_labels, labels_active};
pub use latency::{LatencyClass, RouteLatency, route_latency};
#[cfg(feature = "otel-thread-ctx")]
pub use otel_ctx::{ATTRIBUTE_KEYS, ProcessContext, SCHEMA_VERSION, set_process_context_resource};
pub use poll::{DEFAULT_LONG_POLL, LabelGuard, PollStats, long_polls};
pub use profile::{
    Frame, FunctionCost, Hotness, Profile, ProfileSample, SampleLabels, SpanCost, Stack,
};
pub use sampler::{
    Capabilities, DEFAULT_BASELINE_HZ, DEFAULT_CACHE_BYTES, DEFAULT_DRAIN_INTERVAL,
    DEFAULT_HIGH_HZ, DEFAULT_WALL_HZ, MAX_HIGH_HZ, MemoryStats, Profiler, ProfilerBuilder,
    Sampling, TIMER_MAX_HZ,
};
#[doc(inline)]
pub use scope::ProfileScope;
pub use service::env_service_name;

// Plumbing for spanprof's own crates (the layers, the sinks): public so that they can
// reach it, hidden from the docs. The facade, `spanprof`, is the documented API.
#[doc(hidden)]
pub use labels::current_span_id;
#[doc(hidden)]
pub use latency::{classes_of_roots, init as init_latency};
#[doc(hidden)]
pub use long_poll::{stack as long_poll_stack, stack_pending as long_poll_stack_pending};
#[doc(hidden)]
pub use poll::PollTimer;
#[doc(hidden)]
pub use profile::physical_frames;
#[doc(hidden)]
pub use registration::on_first_sample;
#[doc(hidden)]
pub use service::{percent_decode, resource_service_name, set_resource_service_name};
pub use store::{
    DEFAULT_BUCKET_WIDTH, DEFAULT_BUCKETS, DEFAULT_MAX_BYTES, DEFAULT_MAX_SPANS,
    DEFAULT_MAX_STACKS, SpanProfileStore, SpanSummary, StoreConfig, StoreStats,
};
pub use sys::{Mechanism, Unwinding};
pub use threads::{
    DEFAULT_RING_CAPACITY, SamplerStats, ThreadRegistration, deregister_current_thread,
    register_current_thread,
};
pub use window::{DEFAULT_WINDOW_ENTRIES, ProfileWindow};

/// The frame limit of one sample: deeper stacks are cut and marked
/// `[truncated: stack deeper than the unwind limit]`.
pub const MAX_FRAMES: usize = sys::MAX_FRAMES;

/// CPU time the calling thread has used so far (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_time() -> std::time::Duration {
    sys::thread_cpu_time()
}

/// CPU time the whole process has used so far (`CLOCK_PROCESS_CPUTIME_ID`).
pub fn process_cpu_time() -> std::time::Duration {
    sys::process_cpu_time()
}

/// The calling thread's kernel thread id (`gettid`).
#[doc(hidden)]
pub fn current_tid() -> i32 {
    sys::current_tid()
}

/// Hooks for spanprof's own tests and benchmarks (feature `testing`): allocators that
/// watch the signal handler and label records, the sample-floor probes, and ways to
/// provoke what tests need to see. Not part of the profiler's API.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing {
    pub use crate::symbolize::warm_stack_cost;
    #[cfg(spanprof_sampler)]
    pub use crate::sys::HandlerAllocCounter;
    /// The machine's floor for one CPU sample (an empty `SIGPROF` handler re-armed by
    /// `ioctl`, and a signal-free kernel ring buffer), for the `rate_sweep --floor`
    /// benchmark. Linux only.
    #[cfg(spanprof_sampler)]
    pub use crate::sys::probe as sample_floor;
    pub use crate::sys::{POISON_BYTE, QuarantineAlloc};

    /// Whether the calling thread is inside spanprof's profiling signal handler right
    /// now: a counting global allocator uses it to prove the handler never allocates.
    pub fn in_signal_handler() -> bool {
        crate::sys::in_signal_handler()
    }

    /// Holds the name interner's lock until the returned guard drops: for tests that
    /// show a path does not take it.
    pub fn hold_name_interner() -> crate::intern::InternerHeld {
        crate::intern::hold()
    }

    /// Forks a child that sleeps `secs` seconds and exits; returns its pid. For tests
    /// of what a child process inherits.
    #[cfg(target_os = "linux")]
    pub fn fork_sleeping_child(secs: u32) -> i32 {
        crate::sys::fork_sleeping_child(secs)
    }

    /// Sends spanprof's profiling signal (`SIGPROF`) to thread `tid` of this process.
    /// The handler ignores signals it did not arm; tests use this to interrupt system
    /// calls on purpose. Returns whether the signal was sent.
    #[cfg(spanprof_sampler)]
    pub fn send_profiling_signal(tid: i32) -> bool {
        crate::sys::signal_thread(tid)
    }
}
