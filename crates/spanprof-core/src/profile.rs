//! The answer to a store query: aggregated samples with symbolized stacks and labels.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

/// Address standing for "the stack was cut here": the last frame of a stack the
/// unwinder truncated (symbolized as a marker frame).
pub(crate) const TRUNCATED_ADDR: u64 = u64::MAX;
/// Address standing for "stack table full": the stand-in stack of samples the store
/// could not keep their own stack for.
pub(crate) const OVERFLOW_ADDR: u64 = u64::MAX - 1;

/// One symbolized stack frame. Inlined functions are separate frames with
/// [`Frame::inlined`] set, so a flamegraph shows them as the code reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Demangled function name, without the trailing `::h<hash>`.
    pub function: Arc<str>,
    /// Source file, when debug info has it.
    pub file: Option<Arc<str>>,
    /// Source line, or 0 when unknown.
    pub line: u32,
    /// The instruction address this frame was resolved from (the same for every
    /// inlined frame of one physical frame).
    pub address: u64,
    /// Whether this frame was inlined into its caller.
    pub inlined: bool,
}

impl Frame {
    /// Whether this frame is the service's own code, as far as a frame tells: Rust
    /// source (C libraries such as glibc are not the service's), outside the standard
    /// library (its functions' paths begin with `std`, `core` or `alloc`) and the
    /// cargo registries (when the file has its directory).
    pub(crate) fn is_own_code(&self) -> bool {
        let Some(file) = self.file.as_deref() else {
            return false;
        };
        // `<T as Trait>::method` is the code of `T`'s impl: a generic parameter's (no
        // path: `<F as core::future::Future>::poll`) is the library's.
        let function = self.function.trim_start_matches('<');
        let own_type = function.split(" as ").next().unwrap_or_default();
        let own_type = own_type
            .trim_start_matches('&')
            .trim_start_matches("mut ")
            .trim_start_matches("dyn ");
        let root = own_type.split("::").next().unwrap_or_default();
        let generic = function.contains(" as ") && !own_type.contains("::");
        let library = generic
            || matches!(root, "std" | "core" | "alloc")
            || file.starts_with("/rustc/")
            || file.contains("/.cargo/registry/")
            || file.contains("/.cargo/git/");
        file.ends_with(".rs") && !library
    }
}

/// A symbolized call stack, leaf (innermost) frame first.
pub type Stack = Arc<[Frame]>;

/// The physical frames of `stack`, leaf first: each item is the run of frames at one
/// return address (the functions inlined there, innermost first, then the function
/// they were inlined into). pprof's locations and OTLP's are one per item.
///
/// ```
/// use spanprof_core::{Frame, physical_frames};
/// let frame = |function: &str, address, inlined| Frame {
///     function: function.into(),
///     file: None,
///     line: 0,
///     address,
///     inlined,
/// };
/// let stack = [frame("hash", 0x20, true), frame("compute", 0x20, false), frame("main", 0x10, false)];
/// let groups: Vec<usize> = physical_frames(&stack).map(|f| f.len()).collect();
/// assert_eq!(groups, [2, 1]);
/// ```
pub fn physical_frames(stack: &[Frame]) -> impl Iterator<Item = &[Frame]> {
    let mut rest = stack;
    std::iter::from_fn(move || {
        let first = rest.first()?;
        let mut end = 0;
        while rest[end].inlined && end + 1 < rest.len() && rest[end + 1].address == first.address {
            end += 1;
        }
        let (frame, tail) = rest.split_at(end + 1);
        rest = tail;
        Some(frame)
    })
}

/// The span identity carried by a sample, resolved to strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SampleLabels {
    /// 128-bit OpenTelemetry trace id (0 when the work had no trace).
    pub trace_id: u128,
    /// 64-bit span id whose labels were active when the sample was taken.
    pub span_id: u64,
    /// The parent of `span_id` (0 for a local root).
    pub parent_span_id: u64,
    /// The local-root span id of the work (equal to `span_id` for a root).
    pub root_span_id: u64,
    /// Span name (interned, bounded).
    pub span_name: Arc<str>,
    /// Route template such as `POST /checkout` (interned, bounded); empty when unknown.
    pub route: Arc<str>,
    /// Why the work was profiled at the high rate when this sample was taken.
    pub hot: Hotness,
    /// How long the request (local root) this sample belongs to took against its
    /// route's recent requests, as windows export it ([`crate::ProfileWindow::take`]);
    /// `None` in the store, and where the route has too few requests to tell.
    pub latency: Option<crate::LatencyClass>,
}

impl SampleLabels {
    /// `span_id` as 16 lowercase hex digits, the form Pyroscope parses.
    pub fn span_id_hex(&self) -> String {
        format!("{:016x}", self.span_id)
    }

    /// `trace_id` as 32 lowercase hex digits, the form Pyroscope parses.
    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }
}

/// Whether, and why, work is profiled at the high rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Hotness {
    /// Baseline rate only.
    #[default]
    Cold = 0,
    /// Picked by sampling (trace flag and route rate, or explicitly).
    Sampled = 1,
    /// Promoted because it ran past its slow threshold.
    Slow = 2,
}

impl Hotness {
    /// Decodes the byte stored in a label record; unknown values read as `Cold`.
    pub fn from_u8(v: u8) -> Self {
        match v {
            1 => Hotness::Sampled,
            2 => Hotness::Slow,
            _ => Hotness::Cold,
        }
    }

    /// `"sampled"`, `"slow"`, or `None` for cold work.
    pub fn as_str(self) -> Option<&'static str> {
        match self {
            Hotness::Cold => None,
            Hotness::Sampled => Some("sampled"),
            Hotness::Slow => Some("slow"),
        }
    }
}

/// Aggregated samples of one (labels, stack) pair.
#[derive(Debug, Clone)]
pub struct ProfileSample {
    /// The stack, leaf first.
    pub stack: Stack,
    /// The labels, or `None` for samples taken outside any labelled work.
    pub labels: Option<Arc<SampleLabels>>,
    /// Number of samples.
    pub count: u64,
    /// Estimated CPU time: each sample weighted by the period it was taken at.
    pub cpu_ns: u64,
    /// Estimated wall-clock time inside hot polls, on or off CPU: each wall-clock
    /// sample weighted by its period (0 for work that was not hot, and for stacks
    /// only CPU samples saw). A stack only wall-clock samples saw has `count` and
    /// `cpu_ns` 0: time spent blocked there.
    pub wall_ns: u64,
}

impl ProfileSample {
    /// Whether the unwinder cut this stack short at [`crate::MAX_FRAMES`]: its
    /// outermost frames are missing and its last frame is the marker
    /// `[truncated: stack deeper than the unwind limit]`.
    pub fn is_truncated(&self) -> bool {
        self.stack
            .last()
            .is_some_and(|f| f.address == TRUNCATED_ADDR)
    }
}

/// A CPU profile: the answer to a [`crate::SpanProfileStore`] query.
#[derive(Debug, Clone)]
pub struct Profile {
    /// Aggregated samples.
    pub samples: Vec<ProfileSample>,
    /// Wall-clock start of the window this profile covers.
    pub start: SystemTime,
    /// Length of that window in nanoseconds.
    pub duration_ns: u64,
    /// The baseline sampling period in nanoseconds (pprof's `period`).
    pub period_ns: u64,
}

/// One row of [`Profile::top_functions`].
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionCost {
    /// Function name.
    pub function: Arc<str>,
    /// CPU time with this function as the leaf frame.
    pub self_ns: u64,
    /// CPU time with this function anywhere on the stack.
    pub total_ns: u64,
    /// Samples with this function anywhere on the stack.
    pub samples: u64,
}

/// One span's share of a profile: a row of [`Profile::by_span`].
#[derive(Debug, Clone)]
pub struct SpanCost {
    /// The span's labels (trace and span id, names, route); `None` for CPU outside
    /// any labelled work.
    pub labels: Option<Arc<SampleLabels>>,
    /// Samples taken in the span.
    pub samples: u64,
    /// Their estimated CPU time.
    pub cpu_ns: u64,
    /// The span's functions by total time, the [spine](Profile::spine) left out.
    pub top_functions: Vec<FunctionCost>,
}

impl Profile {
    /// An empty profile starting now.
    pub fn empty(period_ns: u64) -> Self {
        Profile {
            samples: Vec::new(),
            start: SystemTime::now(),
            duration_ns: 0,
            period_ns,
        }
    }

    /// Total number of samples.
    pub fn sample_count(&self) -> u64 {
        self.samples.iter().map(|s| s.count).sum()
    }

    /// Total estimated CPU time in nanoseconds.
    pub fn cpu_ns(&self) -> u64 {
        self.samples.iter().map(|s| s.cpu_ns).sum()
    }

    /// The "spine": the functions around the span's own code (the runtime, the
    /// server, the framework), which every stack goes through. Ranking by total time
    /// without them puts the code that did the work on top.
    ///
    /// Where a stack holds spanprof's own poll wrapper (the layer's response future
    /// or a [`crate::Labelled`] future), the wrapper and the functions outside it
    /// (rootward of its innermost frame) are spine, and the functions inside it
    /// never are, however much of the time they take. Other functions are spine when they are on at least `percent` % of the
    /// CPU time of the stacks that reach their thread's root: the stacks ending in
    /// the two outermost frames most of the time ends in (say `thread_start` called
    /// by `clone3`). Truncated stacks ([`ProfileSample::is_truncated`]) and stacks
    /// whose unwinding broke early (in code without frame pointers) lack their outer
    /// frames and do not count.
    pub fn spine(&self, percent: u64) -> Vec<Arc<str>> {
        fn root(s: &ProfileSample) -> Option<(&Arc<str>, &Arc<str>)> {
            match &s.stack[..] {
                [.., a, b] if !s.is_truncated() => Some((&a.function, &b.function)),
                _ => None,
            }
        }
        let is_wrapper = |f: &Frame| {
            f.function.contains("spanprof_core::") || f.function.contains("spanprof_tower::")
        };
        let mut inside: HashSet<&Arc<str>> = HashSet::new();
        let mut spine: HashSet<&Arc<str>> = HashSet::new();
        let mut by_root: HashMap<(&Arc<str>, &Arc<str>), u64> = HashMap::new();
        for s in &self.samples {
            // The stack is leaf first: the first wrapper frame is the innermost,
            // where the span's own code starts.
            if let Some(w) = s.stack.iter().position(is_wrapper) {
                inside.extend(s.stack[..w].iter().map(|f| &f.function));
                spine.extend(s.stack[w..].iter().map(|f| &f.function));
            }
            if let Some(r) = root(s) {
                *by_root.entry(r).or_default() += s.cpu_ns;
            }
        }
        if let Some(whole_root) = by_root
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            .map(|(r, _)| r)
        {
            let mut on: HashMap<&Arc<str>, u64> = HashMap::new();
            let mut total = 0;
            let mut seen: HashSet<&Arc<str>> = HashSet::new();
            for s in self.samples.iter().filter(|s| root(s) == Some(whole_root)) {
                total += s.cpu_ns;
                seen.clear();
                for f in s.stack.iter() {
                    if seen.insert(&f.function) {
                        *on.entry(&f.function).or_default() += s.cpu_ns;
                    }
                }
            }
            if total > 0 {
                spine.extend(
                    on.into_iter()
                        .filter(|&(_, ns)| ns * 100 >= total * percent)
                        .map(|(f, _)| f),
                );
            }
        }
        let mut out: Vec<Arc<str>> = spine
            .into_iter()
            .filter(|f| !inside.contains(f))
            .cloned()
            .collect();
        out.sort();
        out
    }

    /// The same profile with every sample's `span_id` replaced by its local root's
    /// (Grafana's local-root scope: inner spans' samples count for their root).
    pub fn with_local_root_ids(mut self) -> Profile {
        let mut cache: HashMap<*const SampleLabels, Arc<SampleLabels>> = HashMap::new();
        for s in &mut self.samples {
            if let Some(l) = &s.labels
                && l.root_span_id != 0
                && l.root_span_id != l.span_id
            {
                let key = Arc::as_ptr(l);
                let rooted = cache
                    .entry(key)
                    .or_insert_with(|| {
                        let mut r = (**l).clone();
                        r.span_id = r.root_span_id;
                        Arc::new(r)
                    })
                    .clone();
                s.labels = Some(rooted);
            }
        }
        self
    }

    /// Keeps only the samples for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(&ProfileSample) -> bool) {
        self.samples.retain(|s| keep(s));
    }

    /// Functions ordered by total time (then self time), at most `n` of them,
    /// leaving out the [spine](Profile::spine) and the bracketed stand-ins
    /// (`[libc.so.6]`: every unnamed function of a module in one, whose total means
    /// nothing): the code that did the work, outermost first.
    pub fn top_functions_by_total(&self, n: usize) -> Vec<FunctionCost> {
        let spine: HashSet<Arc<str>> = self.spine(97).into_iter().collect();
        self.top_by_total_without(n, &spine)
    }

    fn top_by_total_without(&self, n: usize, spine: &HashSet<Arc<str>>) -> Vec<FunctionCost> {
        let mut functions = self.top_functions(usize::MAX);
        functions.retain(|f| !spine.contains(&f.function) && !f.function.starts_with('['));
        functions.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(b.self_ns.cmp(&a.self_ns)));
        functions.truncate(n);
        functions
    }

    /// Functions ordered by self time (then total time), at most `n` of them.
    pub fn top_functions(&self, n: usize) -> Vec<FunctionCost> {
        let mut by_name: HashMap<Arc<str>, FunctionCost> = HashMap::new();
        for s in &self.samples {
            let mut seen: Vec<&Arc<str>> = Vec::with_capacity(s.stack.len());
            for (i, f) in s.stack.iter().enumerate() {
                let e = by_name
                    .entry(f.function.clone())
                    .or_insert_with(|| FunctionCost {
                        function: f.function.clone(),
                        self_ns: 0,
                        total_ns: 0,
                        samples: 0,
                    });
                if i == 0 {
                    e.self_ns += s.cpu_ns;
                }
                if !seen.contains(&&f.function) {
                    seen.push(&f.function);
                    e.total_ns += s.cpu_ns;
                    e.samples += s.count;
                }
            }
        }
        let mut v: Vec<FunctionCost> = by_name.into_values().collect();
        v.sort_by(|a, b| {
            b.self_ns
                .cmp(&a.self_ns)
                .then(b.total_ns.cmp(&a.total_ns))
                .then(a.function.cmp(&b.function))
        });
        v.truncate(n);
        v
    }

    /// Which span this CPU went to: the profile split by span (each sample's
    /// `span_id`; samples outside labelled work under `None`), heaviest first, each
    /// with its CPU time, samples and its top `top` functions by total time, leaving
    /// out the whole profile's [spine](Profile::spine) (as
    /// [`Profile::top_functions_by_total`] does for one profile: computed over the
    /// whole, so a span's own hot loop is never mistaken for spine).
    ///
    /// ```
    /// # fn show(profiler: &spanprof_core::Profiler) {
    /// let last_minute = profiler.store().process(std::time::Duration::from_secs(60));
    /// for span in last_minute.by_span(3).iter().take(5) {
    ///     let name = span.labels.as_ref().map_or("(unlabelled)", |l| &*l.span_name);
    ///     println!("{name}: {} µs", span.cpu_ns / 1000);
    ///     for f in &span.top_functions {
    ///         println!("    {} {} µs", f.function, f.total_ns / 1000);
    ///     }
    /// }
    /// # }
    /// ```
    pub fn by_span(&self, top: usize) -> Vec<SpanCost> {
        let spine: HashSet<Arc<str>> = self.spine(97).into_iter().collect();
        type Group = (Option<Arc<SampleLabels>>, Vec<ProfileSample>);
        let mut groups: HashMap<Option<u64>, Group> = HashMap::new();
        for s in &self.samples {
            let key = s.labels.as_ref().map(|l| l.span_id);
            let g = groups
                .entry(key)
                .or_insert_with(|| (s.labels.clone(), Vec::new()));
            g.1.push(s.clone());
        }
        let mut out: Vec<SpanCost> = groups
            .into_values()
            .map(|(labels, samples)| {
                let p = Profile {
                    samples,
                    start: self.start,
                    duration_ns: self.duration_ns,
                    period_ns: self.period_ns,
                };
                SpanCost {
                    labels,
                    samples: p.sample_count(),
                    cpu_ns: p.cpu_ns(),
                    top_functions: p.top_by_total_without(top, &spine),
                }
            })
            .collect();
        out.sort_by(|a, b| {
            b.cpu_ns.cmp(&a.cpu_ns).then_with(|| {
                a.labels
                    .as_ref()
                    .map(|l| l.span_id)
                    .cmp(&b.labels.as_ref().map(|l| l.span_id))
            })
        });
        out
    }

    /// CPU time of samples whose stack contains a function whose name contains `needle`.
    pub fn cpu_ns_in(&self, needle: &str) -> u64 {
        self.samples
            .iter()
            .filter(|s| s.stack.iter().any(|f| f.function.contains(needle)))
            .map(|s| s.cpu_ns)
            .sum()
    }
}

impl fmt::Display for Profile {
    /// Folded-stack text (`root;...;leaf <cpu_ns>`), one line per sample, as
    /// `inferno` and `flamegraph.pl` read it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.samples {
            let mut first = true;
            for fr in s.stack.iter().rev() {
                if !first {
                    f.write_str(";")?;
                }
                first = false;
                f.write_str(&fr.function)?;
            }
            writeln!(f, " {}", s.cpu_ns)?;
        }
        Ok(())
    }
}

impl crate::sys::record::LabelIds {
    /// The same identity with its names resolved to strings.
    pub(crate) fn resolve(&self, hot: Hotness) -> SampleLabels {
        SampleLabels {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent_span_id: self.parent_span_id,
            root_span_id: self.root_span_id,
            span_name: crate::intern::resolve(self.span_name),
            route: crate::intern::resolve(self.route),
            hot,
            latency: None,
        }
    }
}

impl crate::sys::record::LabelRecord {
    /// Raises the hotness to at least `why`; never lowers it, and does nothing once
    /// the span has ended. Returns the new state byte.
    #[inline(always)]
    pub(crate) fn promote(&self, why: Hotness) -> u8 {
        self.promote_to(why as u8)
    }
}

const _: () = assert!(Hotness::Slow as u8 == crate::sys::record::HOT_SLOW);

#[cfg(test)]
mod spine_tests {
    use super::*;

    fn frame(function: &str, address: u64) -> Frame {
        Frame {
            function: function.into(),
            file: None,
            line: 0,
            address,
            inlined: false,
        }
    }

    fn sample(stack: &[&str], truncated: bool, cpu_ns: u64) -> ProfileSample {
        let mut frames: Vec<Frame> = stack.iter().map(|f| frame(f, 1)).collect();
        if truncated {
            frames.push(frame(
                "[truncated: stack deeper than the unwind limit]",
                TRUNCATED_ADDR,
            ));
        }
        ProfileSample {
            stack: frames.into(),
            labels: None,
            count: 1,
            cpu_ns,
            wall_ns: 0,
        }
    }

    #[test]
    fn code_inside_the_labelled_future_is_never_spine() {
        // The culprit takes all of the request's time: it is still not spine,
        // being inside spanprof's wrapper; what is outside the wrapper is.
        let wrapper = "<spanprof_tower::layer::future::ResponseFuture<F> as Future>::poll";
        let p = Profile {
            samples: vec![
                sample(
                    &["load_attribute", "to_json", wrapper, "worker_run"],
                    false,
                    60,
                ),
                sample(&["to_json", wrapper, "worker_run"], false, 40),
            ],
            start: SystemTime::UNIX_EPOCH,
            duration_ns: 1,
            period_ns: 1,
        };
        let spine: Vec<String> = p.spine(97).iter().map(|f| f.to_string()).collect();
        assert_eq!(spine, [wrapper, "worker_run"]);
        let top: Vec<String> = p
            .top_functions_by_total(10)
            .iter()
            .map(|f| f.function.to_string())
            .collect();
        assert_eq!(top, ["to_json", "load_attribute"]);
    }

    #[test]
    fn cut_stacks_do_not_hide_the_spine() {
        // 30 % of the time in a deep recursion the unwinder cut short, 20 % in libc
        // code without frame pointers where unwinding broke: those stacks never
        // reach the runtime's frames, which are still the spine.
        let p = Profile {
            samples: vec![
                sample(&["handler", "worker_run", "thread_start"], false, 50),
                sample(&["deep", "deep", "handler"], true, 30),
                sample(&["[libc.so.6]", "handler"], false, 10),
                sample(&["[libc.so.6]"], false, 10),
            ],
            start: SystemTime::UNIX_EPOCH,
            duration_ns: 1,
            period_ns: 1,
        };
        assert!(p.samples[1].is_truncated() && !p.samples[0].is_truncated());
        let spine: Vec<String> = p.spine(97).iter().map(|f| f.to_string()).collect();
        assert_eq!(spine, ["handler", "thread_start", "worker_run"]);
    }
}
