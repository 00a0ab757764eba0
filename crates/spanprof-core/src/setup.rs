//! Set-up mistakes the core can detect: each is reported once per process, at warn
//! level, with the fix in the message; one found before a `tracing` subscriber is
//! installed is logged as soon as one is. The layer's own checks (no request span, no
//! OpenTelemetry context, routes it cannot see) are in `spanprof-tower`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Logged when stacks are walked by frame pointers (where there is no DWARF
/// unwinder: not x86_64) and the build has none (checked at [`crate::Profiler`] start);
/// followed by the name of the variable that replaced the config's flags, if any.
pub const NO_FRAME_POINTERS: &str = "spanprof: this build has no frame pointers, and on this architecture stacks are walked by them, so profile stacks stop after one or two frames. \
Build with frame pointers: in .cargo/config.toml, [build] rustflags = [\"-C\", \"force-frame-pointers=yes\", \"--cfg\", \"tokio_unstable\"].";

/// Logged when spanprof is built without `--cfg tokio_unstable` (at
/// [`crate::install_runtime_hooks`], or when a runtime without the hooks polls
/// labelled work); followed by the name of the variable that replaced the
/// config's flags, if any.
pub const NO_TOKIO_UNSTABLE: &str = "spanprof: built without `--cfg tokio_unstable`, so tasks spawned by a request (tokio::spawn) do not inherit its labels \
and their CPU is not attributed to it. Add the cfg for the whole build: in .cargo/config.toml, [build] rustflags = [\"--cfg\", \"tokio_unstable\"].";

/// The environment variable this build's rustc flags came from, if one was set (in
/// cargo's order: the first set wins and the others, `.cargo/config.toml`'s
/// `build.rustflags` included, are ignored).
pub(crate) fn rustflags_variable() -> Option<&'static str> {
    if option_env!("CARGO_ENCODED_RUSTFLAGS").is_some() {
        Some("CARGO_ENCODED_RUSTFLAGS")
    } else if option_env!("RUSTFLAGS").is_some() {
        Some("RUSTFLAGS")
    } else if let Some(var) = option_env!("SPANPROF_TARGET_RUSTFLAGS_VAR") {
        Some(var)
    } else if option_env!("CARGO_BUILD_RUSTFLAGS").is_some() {
        Some("CARGO_BUILD_RUSTFLAGS")
    } else {
        None
    }
}

/// Why a flag from `.cargo/config.toml` can be missing from the build, for the
/// warnings about one: the environment variable that replaced the config's list when
/// one was set (named, its value not logged), else the two ways the config is missed.
pub(crate) fn rustflags_cause(variable: Option<&str>) -> String {
    match variable {
        Some(var) => format!(
            " This build took its rustc flags from the {var} environment variable, which replaces \
.cargo/config.toml's build.rustflags (cargo uses the first of CARGO_ENCODED_RUSTFLAGS, RUSTFLAGS, \
CARGO_TARGET_<triple>_RUSTFLAGS, build.rustflags): add the flags to {var} as well."
        ),
        None => " No RUSTFLAGS-like variable was set for this build: cargo looks for .cargo/config.toml \
from the directory it runs in (not from --manifest-path's), and target.<triple>.rustflags there replace \
build.rustflags."
            .to_owned(),
    }
}

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

/// Unlabelled samples under one unprofiled span before it is reported (about half a
/// second of CPU at the default baseline), and the share of its samples they must be.
const UNPROFILED_MIN_SAMPLES: u64 = 50;

/// Whether `unlabelled` and `labelled` samples under one span make it CPU-heavy work
/// nothing profiles: at least [`UNPROFILED_MIN_SAMPLES`], and nine in ten.
pub(crate) fn is_unprofiled_work(unlabelled: u64, labelled: u64) -> bool {
    unlabelled >= UNPROFILED_MIN_SAMPLES && unlabelled >= 9 * labelled
}

static UNPROFILED_WARNED: AtomicBool = AtomicBool::new(false);

/// For tracing layers (`SpanProfileLayer`): span `id`, of callsite `meta`, is entered
/// on this thread outside labelled work, and nothing profiles it. Samples taken under
/// it are counted per callsite; one whose CPU goes mostly unlabelled is reported once.
#[inline]
pub fn enter_unprofiled_span(id: u64, meta: &'static tracing::Metadata<'static>) {
    crate::sys::slot::enter_outer_span(id, meta);
}

/// Undoes [`enter_unprofiled_span`] as span `id` is exited. Returns whether span
/// `id` was the innermost such span on this thread.
#[inline]
pub fn exit_unprofiled_span(id: u64) -> bool {
    crate::sys::slot::exit_outer_span(id)
}

/// Logs, once per process, that `samples` CPU samples landed unlabelled under spans
/// named `name` (target `target`) that nothing profiles, naming the fix.
pub(crate) fn report_unprofiled_span(name: &str, target: &str, samples: u64) {
    if UNPROFILED_WARNED.swap(true, Ordering::Relaxed) {
        return;
    }
    tracing::warn!(
        "spanprof: {samples} CPU samples landed in tracing spans `{name}` (target {target}), entered outside any \
request, and no profile covers them (background jobs, consumers and start-up work get no labels by themselves). \
Profile such spans with SpanProfileLayer::new().profile_roots(\"{name}\", RoutePolicy::new()) (docs/layer.md, \
\"Services without Tower\")."
    );
}

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

/// Whether a message waits for a subscriber, or a filter check for the collector
/// thread (which then wakes now and then to run it, even when no sample comes).
pub(crate) fn pending() -> bool {
    PENDING.load(Ordering::Relaxed) != 0
        || STARTED_PENDING.load(Ordering::Relaxed)
        || filters::waiting()
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
    filters::check();
}

/// Whether a `tracing` subscriber listens to the calling thread.
fn listening() -> bool {
    tracing::dispatcher::get_default(|d| !d.is::<tracing::subscriber::NoSubscriber>())
}

/// Logs the pending messages if a `tracing` subscriber is listening now. Called at
/// each check and by the collector thread as it wakes (a few atomic loads when
/// nothing is pending).
pub(crate) fn emit_pending() {
    if !pending() {
        return;
    }
    // Also without a subscriber: on the collector thread, a waiting check then ends.
    filters::check();
    if !listening() {
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
        if fresh & bit == 0 {
            continue;
        }
        if bit == RUNTIME_HOOKS || bit == THREAD_CTX_TARGET {
            tracing::warn!("{message}");
        } else {
            tracing::warn!("{message}{}", rustflags_cause(rustflags_variable()));
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
    fn a_missing_flag_is_blamed_on_the_variable_that_replaced_the_config() {
        // Docker images and CI systems set RUSTFLAGS (`-D warnings`), which makes cargo
        // ignore .cargo/config.toml's build.rustflags: the warning must say so, not ask
        // for the config line the user already has.
        let cause = super::rustflags_cause(Some("RUSTFLAGS"));
        assert!(
            cause.contains("from the RUSTFLAGS environment variable"),
            "{cause}"
        );
        assert!(
            cause.contains("replaces .cargo/config.toml's build.rustflags"),
            "{cause}"
        );
        assert!(cause.contains("add the flags to RUSTFLAGS"), "{cause}");
        let cause = super::rustflags_cause(None);
        assert!(cause.contains("--manifest-path"), "{cause}");
        assert!(cause.contains("target.<triple>.rustflags"), "{cause}");
        // This build: the project's own tests set the flags in .cargo/config.toml,
        // scripts/test's second pass through RUSTFLAGS.
        let expected = std::env::var("SPANPROF_EXPECT_RUSTFLAGS_VAR").ok();
        if let Some(expected) = expected {
            assert_eq!(
                super::rustflags_variable(),
                (!expected.is_empty()).then_some(expected.as_str())
            );
        }
    }

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

/// The service's own `tracing` filter, which can hide what spanprof needs: its
/// warnings (so every other check here goes unheard), and the spans it labels (a
/// `profile_roots` span, or `TraceLayer`'s request span, that the filter disables is
/// never created, so nothing is labelled). Checked once a subscriber listens, again
/// as root callsites register, and from the collector while samples arrive and no
/// root span was ever seen. Whether the warnings are shown, when the subscriber's
/// answer is "sometimes", is settled on the collector thread alone.
pub mod filters {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use tracing::Metadata;
    use tracing::level_filters::LevelFilter;
    use tracing_core::callsite::{Callsite, Identifier};
    use tracing_core::field::FieldSet;
    use tracing_core::metadata::Kind;
    use tracing_core::subscriber::Interest;
    use tracing_core::{Level, identify_callsite};

    /// Root selectors configured with `profile_roots` (for the messages), and the
    /// callsites of spans they picked, not yet checked.
    static ROOTS: Mutex<Roots> = Mutex::new(Roots {
        names: Vec::new(),
        unchecked: Vec::new(),
        watched: Vec::new(),
    });

    struct Roots {
        names: Vec<String>,
        unchecked: Vec<&'static Metadata<'static>>,
        /// Every callsite noted (asking the subscriber about one registers it again).
        watched: Vec<Identifier>,
    }

    /// Most root callsites checked per process.
    const MAX_CALLSITES: usize = 64;

    static ROOT_SEEN: AtomicBool = AtomicBool::new(false);
    /// A root callsite waits to be checked.
    static UNCHECKED: AtomicBool = AtomicBool::new(false);
    /// A check waits for the collector thread: the subscriber answered "sometimes".
    static WAITING: AtomicBool = AtomicBool::new(false);
    static STDERR_SAID: AtomicBool = AtomicBool::new(false);
    static WARNINGS_CHECKED: AtomicBool = AtomicBool::new(false);
    static NO_ROOT_WARNED: AtomicBool = AtomicBool::new(false);
    /// Samples the collector took while roots are configured and none was seen.
    static SAMPLES_WITHOUT_ROOT: AtomicU64 = AtomicU64::new(0);

    /// Samples after which a configured root never seen is reported.
    const SAMPLES_BEFORE_NO_ROOT: u64 = 200;

    /// Notes the selectors `SpanProfileLayer::profile_roots` was given (by their
    /// description, for the messages).
    pub fn roots_configured(description: impl Into<String>) {
        let mut r = ROOTS.lock().unwrap_or_else(|e| e.into_inner());
        let d = description.into();
        if !r.names.contains(&d) {
            r.names.push(d);
        }
    }

    /// Notes the callsite of a span a root selector picks, as tracing registers it
    /// (`Layer::register_callsite`): checked against the service's filter once a
    /// subscriber listens, once per process (asking registers it again, which is not
    /// noted twice). Must not check here: a check inside a registration would read
    /// that registration's partial interest.
    pub fn watch_root_callsite(meta: &'static Metadata<'static>) {
        let mut r = ROOTS.lock().unwrap_or_else(|e| e.into_inner());
        if r.watched.len() < MAX_CALLSITES && !r.watched.contains(&meta.callsite()) {
            r.watched.push(meta.callsite());
            r.unchecked.push(meta);
            UNCHECKED.store(true, Ordering::Release);
        }
    }

    thread_local! {
        /// Set on the collector thread, where a "sometimes" answer is settled.
        static ON_COLLECTOR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Marks the calling thread as the collector's, at its start.
    pub(crate) fn on_collector_thread() {
        ON_COLLECTOR.with(|c| c.set(true));
    }

    /// Whether a check waits for the collector thread (it then wakes to run it).
    pub(crate) fn waiting() -> bool {
        WAITING.load(Ordering::Relaxed)
    }

    /// From the collector, after each batch of `samples`: the checks due (a waiting
    /// one ran as the batch came, from [`super::emit_pending`]).
    pub(crate) fn after_batch(samples: u64) {
        if UNCHECKED.load(Ordering::Acquire) {
            check();
        }
        samples_taken(samples);
    }

    /// Notes that a root span was profiled (so none was hidden).
    #[inline]
    pub fn root_span_seen() {
        if !ROOT_SEEN.load(Ordering::Relaxed) {
            ROOT_SEEN.store(true, Ordering::Relaxed);
        }
    }

    /// `samples` more were taken.
    fn samples_taken(samples: u64) {
        if ROOT_SEEN.load(Ordering::Relaxed) || NO_ROOT_WARNED.load(Ordering::Relaxed) {
            return;
        }
        let names = {
            let r = ROOTS.lock().unwrap_or_else(|e| e.into_inner());
            if r.names.is_empty() {
                return;
            }
            r.names.join(", ")
        };
        if SAMPLES_WITHOUT_ROOT.fetch_add(samples, Ordering::Relaxed) + samples
            < SAMPLES_BEFORE_NO_ROOT
            || NO_ROOT_WARNED.swap(true, Ordering::Relaxed)
        {
            return;
        }
        say(&format!(
            "spanprof: {SAMPLES_BEFORE_NO_ROOT} CPU samples and not one span that profile_roots picks ({names}) was \
             profiled: no such span was created outside a request, or the service's tracing filter disables them. \
             Check the names, and give the OpenTelemetry and spanprof layers no filter (docs/layer.md, \"Log \
             filters\")."
        ));
    }

    /// Runs the checks a listening subscriber makes possible. Whether spanprof's
    /// warnings are shown, when the subscriber answers "sometimes", and the root
    /// callsites after it, are left to the collector thread (see [`warnings_shown`]).
    pub(crate) fn check() {
        if !super::listening() {
            if ON_COLLECTOR.with(std::cell::Cell::get) {
                // The check waits for a subscriber the collector thread cannot see
                // (one scoped to the thread that asked): left undecided, as shown.
                WAITING.store(false, Ordering::Relaxed);
            }
            return;
        }
        UNCHECKED.store(false, Ordering::Release);
        WAITING.store(false, Ordering::Relaxed);
        if !WARNINGS_CHECKED.load(Ordering::Relaxed) {
            match warnings_shown() {
                None => {
                    // Root callsites are decided once it is known where their
                    // warnings go, on the collector thread.
                    WAITING.store(true, Ordering::Relaxed);
                    return;
                }
                Some(shown) => {
                    if !WARNINGS_CHECKED.swap(true, Ordering::Relaxed) && !shown {
                        warnings_hidden();
                    }
                }
            }
        }
        // Taken out of the list, then asked outside the lock: asking registers the
        // callsite again, and a root's registration takes the lock.
        let mut roots = [None; MAX_CALLSITES];
        for (slot, meta) in roots.iter_mut().zip(
            ROOTS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .unchecked
                .drain(..),
        ) {
            *slot = Some(meta);
        }
        for meta in roots.into_iter().flatten() {
            if may_enable(meta) {
                continue;
            }
            say(&format!(
                "spanprof: the tracing filter disables the spans `{}` (target {}, level {}) that profile_roots \
                 picks: they are never created, so nothing is labelled. Give the OpenTelemetry and spanprof layers \
                 no filter and filter the fmt layer alone (docs/layer.md, \"Log filters\").",
                meta.name(),
                meta.target(),
                meta.level()
            ));
        }
    }

    /// Nothing spanprof warns about will be seen: one line to stderr, now.
    fn warnings_hidden() {
        let max = LevelFilter::current().to_string().to_uppercase();
        let roots = ROOTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .names
            .join(", ");
        let spans = if LevelFilter::current() < LevelFilter::INFO {
            format!(
                ", and every span less severe than {max}, so{} TraceLayer's request spans are not created and \
                 nothing is labelled",
                if roots.is_empty() {
                    String::new()
                } else {
                    format!(" the spans profile_roots picks ({roots}) and")
                }
            )
        } else {
            String::new()
        };
        said(&format!(
            "spanprof: this process's tracing filter (max level {max}) hides spanprof's warnings{spans}. Filter \
             the log output, not the spans: fmt::layer().with_filter(EnvFilter::from_default_env()), with the \
             OpenTelemetry and spanprof layers unfiltered (docs/layer.md, \"Log filters\")."
        ));
    }

    /// Logs `message` at warn level, or, if the filter hides spanprof's warnings and
    /// nothing went to stderr yet, there.
    fn say(message: &str) {
        // Undecided ("sometimes" off the collector thread) counts as shown.
        if warnings_shown() != Some(false) {
            tracing::warn!("{message}");
        } else {
            said(message);
        }
    }

    /// Whether the subscriber would show what `meta` describes, as far as its
    /// callsite tells: under the compiled and the current maximum level, and an
    /// interest other than never. "Sometimes" (span directives, per-layer filters that
    /// disagree) counts as shown: a span directive such as `[run]=debug` enables a
    /// root span inside `run` spans, which no check outside them can see. Never
    /// `Dispatch::enabled` here: it is meant for the event or span that follows it,
    /// and with per-layer filters it leaves the thread's filter state set, so that
    /// thread's next span that every filter enables skips each layer whose filter
    /// disabled `meta` (a request's span lost from its traces).
    fn may_enable(meta: &'static Metadata<'static>) -> bool {
        interest(meta).unwrap_or(true)
    }

    /// The subscriber's answer for `meta` from the level caps and its interest in
    /// the callsite; `None` for "sometimes".
    fn interest(meta: &'static Metadata<'static>) -> Option<bool> {
        let level = *meta.level();
        if !(level <= tracing::level_filters::STATIC_MAX_LEVEL && level <= LevelFilter::current()) {
            return Some(false);
        }
        let interest = tracing::dispatcher::get_default(|d| d.register_callsite(meta));
        (!interest.is_sometimes()).then(|| interest.is_always())
    }

    /// Whether spanprof's warnings are shown. An interest of "sometimes" is settled
    /// by `Dispatch::enabled` on the collector thread, which runs no span of the
    /// service's and logs most of spanprof's warnings, outside any span; the filter
    /// state it leaves there is the verdict for spanprof's own warnings. On any
    /// other thread "sometimes" is `None`, undecided (see [`may_enable`] for why not
    /// `enabled` there).
    fn warnings_shown() -> Option<bool> {
        if let Some(answer) = interest(&WARNING) {
            return Some(answer);
        }
        if !ON_COLLECTOR.with(std::cell::Cell::get) {
            return None;
        }
        Some(tracing::dispatcher::get_default(|d| d.enabled(&WARNING)))
    }

    /// The callsite of a warning from spanprof, as the service's filters see it (not
    /// zero-sized: callsites are told apart by address).
    struct WarningCallsite {
        _distinct: u8,
    }

    static WARNING_CALLSITE: WarningCallsite = WarningCallsite { _distinct: 0 };

    static WARNING: Metadata<'static> = Metadata::new(
        "spanprof warning",
        module_path!(),
        Level::WARN,
        Some(file!()),
        Some(line!()),
        Some(module_path!()),
        FieldSet::new(&["message"], identify_callsite!(&WARNING_CALLSITE)),
        Kind::EVENT,
    );

    impl Callsite for WarningCallsite {
        fn set_interest(&self, _: Interest) {}

        fn metadata(&self) -> &Metadata<'_> {
            &WARNING
        }
    }

    /// One line to stderr, once per process.
    fn said(message: &str) {
        if !STDERR_SAID.swap(true, Ordering::Relaxed) {
            eprintln!("{message}");
        }
    }
}
