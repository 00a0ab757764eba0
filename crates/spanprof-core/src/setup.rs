//! Set-up mistakes the core can detect: each is reported once per process, at warn
//! level, with the fix in the message; one found before a `tracing` subscriber is
//! installed is logged as soon as one is. The layer's own checks (no request span, no
//! OpenTelemetry context, routes it cannot see) are in `spanprof-tower`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Logged when stacks are walked by frame pointers (where there is no DWARF
/// unwinder: not x86_64) and the build has none (checked at [`crate::Profiler`] start).
pub const NO_FRAME_POINTERS: &str = "spanprof: this build has no frame pointers, and on this architecture stacks are walked by them, so profile stacks stop after one or two frames. \
Build with frame pointers: in .cargo/config.toml, [build] rustflags = [\"-C\", \"force-frame-pointers=yes\", \"--cfg\", \"tokio_unstable\"] \
(a RUSTFLAGS variable in the environment replaces that list: add the flags to it too)";

/// Logged when spanprof is built without `--cfg tokio_unstable` (at
/// [`crate::install_runtime_hooks`], or when a runtime without the hooks polls
/// labelled work).
pub const NO_TOKIO_UNSTABLE: &str = "spanprof: built without `--cfg tokio_unstable`, so tasks spawned by a request (tokio::spawn) do not inherit its labels \
and their CPU is not attributed to it. Add the cfg for the whole build: in .cargo/config.toml, \
[build] rustflags = [\"--cfg\", \"tokio_unstable\"] (a RUSTFLAGS variable in the environment replaces that list: add the flag to it too)";

/// Logged when labelled work is polled inside a task of a tokio runtime that was not
/// built with [`crate::install_runtime_hooks`].
pub const NO_RUNTIME_HOOKS: &str = "spanprof: labelled work runs on a tokio runtime built without spanprof::install_runtime_hooks, \
so tasks a request spawns are not labelled and idle runtime threads are not sampled. `#[tokio::main]` cannot install hooks: \
build the runtime with let mut b = tokio::runtime::Builder::new_multi_thread(); spanprof::install_runtime_hooks(&mut b); \
let rt = b.enable_all().build()?; and run your server with rt.block_on(...)";

/// Logged at start with the feature `otel-thread-ctx` when the executable does not
/// export `otel_thread_ctx_v1`, so outside profilers cannot find the thread context.
pub const THREAD_CTX_NOT_EXPORTED: &str = "spanprof: the feature otel-thread-ctx is on but this executable does not export the symbol otel_thread_ctx_v1, so profilers outside the process (the OpenTelemetry eBPF profiler) cannot read which span each thread runs. Add one line to your binary's build.rs: println!(\"cargo:rustc-link-arg=-Wl,--export-dynamic-symbol=otel_thread_ctx_v1\"); or to .cargo/config.toml: [build] rustflags = [\"-C\", \"link-arg=-Wl,--export-dynamic-symbol=otel_thread_ctx_v1\"] (docs/ebpf-profiler.md)";

/// Logged at start with the feature `otel-thread-ctx` where it does nothing (it is
/// implemented on Linux on x86_64).
pub const THREAD_CTX_UNSUPPORTED: &str = "spanprof: the feature otel-thread-ctx publishes nothing on this target: OpenTelemetry's thread and process context are implemented on Linux on x86_64 only";

const FRAME_POINTERS: u8 = 1;
const TOKIO_UNSTABLE: u8 = 2;
const RUNTIME_HOOKS: u8 = 4;
const THREAD_CTX: u8 = 8;
const THREAD_CTX_TARGET: u8 = 16;

/// Warnings found but not yet logged: a check can run before the service installs
/// its `tracing` subscriber (the runtime is often built first), so a warning waits
/// until someone listens.
static PENDING: AtomicU8 = AtomicU8::new(0);
/// Warnings logged (each once per process).
static LOGGED: AtomicU8 = AtomicU8::new(0);
/// Set by [`crate::install_runtime_hooks`].
static RUNTIME_HOOKS_INSTALLED: AtomicBool = AtomicBool::new(false);
/// The profiler's start-up line, waiting for a subscriber like the warnings (the
/// profiler usually starts before the service installs one).
static STARTED_LINE: Mutex<Option<String>> = Mutex::new(None);
static STARTED_PENDING: AtomicBool = AtomicBool::new(false);

fn report(which: u8) {
    if LOGGED.load(Ordering::Relaxed) & which == 0 {
        PENDING.fetch_or(which, Ordering::Relaxed);
        emit_pending();
    }
}

/// At profiler start: its one info line (rates, mechanism, unwinding), logged as
/// soon as a subscriber listens.
pub(crate) fn profiler_started(line: String) {
    *STARTED_LINE.lock().unwrap_or_else(|e| e.into_inner()) = Some(line);
    STARTED_PENDING.store(true, Ordering::Release);
    emit_pending();
}

/// Whether a message waits for a subscriber (the collector thread then wakes now
/// and then to log it, even when no sample comes).
pub(crate) fn pending() -> bool {
    PENDING.load(Ordering::Relaxed) != 0 || STARTED_PENDING.load(Ordering::Relaxed)
}

/// The set-up checks of a service's start, run where spanprof's layer is built
/// (`ProfileCorrelationLayer`): a tokio runtime around the caller that was built
/// without [`crate::install_runtime_hooks`] (what `#[tokio::main]` gives) is
/// reported now rather than at the first request, and the messages waiting for a
/// subscriber are logged if one listens.
pub fn check_at_start() {
    if tokio::runtime::Handle::try_current().is_ok()
        && !RUNTIME_HOOKS_INSTALLED.load(Ordering::Relaxed)
    {
        report(RUNTIME_HOOKS);
        if !cfg!(tokio_unstable) {
            report(TOKIO_UNSTABLE);
        }
    }
    emit_pending();
}

/// Logs the pending messages if a `tracing` subscriber is listening now. Called at
/// each check and by the collector thread as it wakes (one or two atomic loads when
/// nothing is pending).
pub(crate) fn emit_pending() {
    if !pending() {
        return;
    }
    let listening =
        tracing::dispatcher::get_default(|d| !d.is::<tracing::subscriber::NoSubscriber>());
    if !listening {
        return;
    }
    if STARTED_PENDING.swap(false, Ordering::AcqRel)
        && let Some(line) = STARTED_LINE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    {
        tracing::info!("{line}");
    }
    let pending = PENDING.swap(0, Ordering::Relaxed);
    let fresh = pending & !LOGGED.fetch_or(pending, Ordering::Relaxed);
    for (bit, message) in [
        (FRAME_POINTERS, NO_FRAME_POINTERS),
        (TOKIO_UNSTABLE, NO_TOKIO_UNSTABLE),
        (RUNTIME_HOOKS, NO_RUNTIME_HOOKS),
        (THREAD_CTX, THREAD_CTX_NOT_EXPORTED),
        (THREAD_CTX_TARGET, THREAD_CTX_UNSUPPORTED),
    ] {
        if fresh & bit != 0 {
            tracing::warn!("{message}");
        }
    }
}

/// The message for a frame-pointer probe result, if it is one to report: only where
/// stacks are walked by frame pointers (the DWARF unwinder needs none).
pub(crate) fn frame_pointer_warning(
    present: Option<bool>,
    unwinding: crate::Unwinding,
) -> Option<&'static str> {
    (present == Some(false) && unwinding == crate::Unwinding::FramePointers)
        .then_some(NO_FRAME_POINTERS)
}

/// At profiler start: reports a build whose stacks will break (no frame pointers
/// where they are walked) or without `--cfg tokio_unstable`.
pub(crate) fn check_build(frame_pointers: Option<bool>, unwinding: crate::Unwinding) {
    if frame_pointer_warning(frame_pointers, unwinding).is_some() {
        report(FRAME_POINTERS);
    }
    if !cfg!(tokio_unstable) {
        report(TOKIO_UNSTABLE);
    }
}

/// At start with the feature `otel-thread-ctx`: the symbol is not exported.
#[cfg(spanprof_otel_ctx)]
pub(crate) fn thread_ctx_not_exported() {
    report(THREAD_CTX);
}

/// At start with the feature `otel-thread-ctx` on a target where it does nothing.
#[cfg(all(feature = "otel-thread-ctx", not(spanprof_otel_ctx)))]
pub(crate) fn thread_ctx_unsupported() {
    report(THREAD_CTX_TARGET);
}

/// At [`crate::install_runtime_hooks`].
pub(crate) fn runtime_hooks_installed() {
    RUNTIME_HOOKS_INSTALLED.store(true, Ordering::Relaxed);
    if !cfg!(tokio_unstable) {
        report(TOKIO_UNSTABLE);
    }
}

/// When a thread registers itself at its first labelled poll (off the hot path:
/// once per thread): inside a tokio task of a process that never installed the
/// runtime hooks, that runtime is missing them.
pub(crate) fn thread_registered_lazily() {
    if tokio::task::try_id().is_some() && !RUNTIME_HOOKS_INSTALLED.load(Ordering::Relaxed) {
        report(RUNTIME_HOOKS);
        if !cfg!(tokio_unstable) {
            report(TOKIO_UNSTABLE);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_build_without_frame_pointers_is_reported_only_where_they_are_walked() {
        use crate::Unwinding::{DwarfCfi, FramePointers};
        let m = super::frame_pointer_warning(Some(false), FramePointers).expect("a message");
        assert!(m.contains("force-frame-pointers=yes"), "{m}");
        assert_eq!(
            super::frame_pointer_warning(Some(true), FramePointers),
            None
        );
        assert_eq!(super::frame_pointer_warning(None, FramePointers), None);
        // The DWARF unwinder needs no frame pointers: nothing to report.
        assert_eq!(super::frame_pointer_warning(Some(false), DwarfCfi), None);
    }
}
