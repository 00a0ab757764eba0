//! Workloads shared by spanprof's benchmarks, integration tests and comparison
//! programs (`benches/anchors`).
//!
//! The attribution workload: tasks in classes, each class burning CPU in its own
//! `#[inline(never)]` function and yielding about every millisecond, so tasks migrate
//! between the runtime's workers. A sample is *correct* when the class function on
//! its stack matches the class of the span labels it carries.

use std::collections::HashSet;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spanprof::{Hotness, Profile, SpanLabels, WithSpanLabels};

pub mod service;
/// A frozen copy of the checkout example's `shop.rs` and `discount_rules.json`
/// (`examples/checkout/src/`), the business logic the `overhead` benchmark's
/// checkout workload runs: copied, so that editing the example does not change
/// benchmark figures. `service` reaches it as `crate::shop`; the pyroscope-rs anchor
/// includes `service.rs` and `shop.rs` by path.
pub mod shop;
pub mod stacks;

macro_rules! burners {
    ($($name:ident = ($a:literal, $b:literal, $c:literal, $k:literal)),*) => {
        $(
            /// Burns CPU in a xorshift loop made of primitive operations only, so even
            /// an unoptimised build calls nothing from here: this function is the leaf.
            /// Each class has its own shifts and constant, so no two bodies are equal
            /// and the linker cannot fold them.
            #[inline(never)]
            pub fn $name(iters: u64) -> u64 {
                let mut x: u64 = $k;
                let mut i: u64 = 0;
                while i < iters {
                    x ^= x << $a;
                    x ^= x >> $b;
                    x ^= x << $c;
                    x ^= i;
                    i += 1;
                }
                black_box(x)
            }
        )*
        /// The burners, by class, with their names.
        pub const BURNERS: &[(&str, fn(u64) -> u64)] = &[$((stringify!($name), $name)),*];
    };
}

burners!(
    burn_class_0 = (13, 7, 17, 0x9e3779b97f4a7c15),
    burn_class_1 = (11, 9, 19, 0x2545f4914f6cdd1d),
    burn_class_2 = (5, 11, 23, 0xbf58476d1ce4e5b9),
    burn_class_3 = (7, 13, 29, 0x94d049bb133111eb),
    burn_class_4 = (17, 5, 11, 0xd6e8feb86659fd93),
    burn_class_5 = (19, 3, 13, 0xa0761d6478bd642f),
    burn_class_6 = (23, 17, 5, 0xe7037ed1a0b428db),
    burn_class_7 = (29, 19, 7, 0x8ebc6af09c88c6e3)
);

/// How labelled work reaches the burners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Each task is wrapped with its labels (`with_span_labels`); works without
    /// `tokio_unstable`.
    Wrapper,
    /// Each labelled task spawns a child task that does the burning; the child's
    /// labels come only from the tokio hooks (needs `tokio_unstable`).
    Inherit,
    /// Each task is one "request" joining two labelled futures of different classes.
    Joined,
}

/// Workload parameters.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Runtime worker threads.
    pub workers: usize,
    /// Concurrent tasks.
    pub tasks: usize,
    /// Classes (at most 8).
    pub classes: usize,
    /// How long each task burns (wall time).
    pub duration: Duration,
    /// CPU burned between two yields.
    pub slice: Duration,
    /// Whether the spans are hot (high rate).
    pub hot: bool,
    /// How labels reach the work.
    pub mode: Mode,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            workers: 2,
            tasks: 32,
            classes: 8,
            duration: Duration::from_secs(3),
            slice: Duration::from_millis(1),
            hot: true,
            mode: Mode::Wrapper,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Samples whose stack contains a class function.
    pub samples: u64,
    /// Of those, samples labelled with the span of the same class.
    pub correct: u64,
    /// Of those, samples labelled with another class's span.
    pub wrong: u64,
    /// Of those, samples with no labels.
    pub unlabeled: u64,
    /// Polls that ran on a different thread than the task's previous poll.
    pub migrated_polls: u64,
    /// All polls (yields) of class work.
    pub polls: u64,
    /// Tasks that ran on more than one thread.
    pub tasks_migrated: usize,
    /// Tasks in all.
    pub tasks: usize,
}

impl Outcome {
    /// A fraction of `samples`.
    pub fn frac(&self, n: u64) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            n as f64 / self.samples as f64
        }
    }
}

struct Migration {
    polls: AtomicU64,
    migrated: AtomicU64,
}

/// Burns `slice` of CPU in `burn` repeatedly for `duration`, yielding after each
/// slice, and records on which thread each slice ran.
async fn burn_loop(
    burn: fn(u64) -> u64,
    duration: Duration,
    slice: Duration,
    mig: Arc<Migration>,
) -> HashSet<std::thread::ThreadId> {
    let end = Instant::now() + duration;
    let mut threads = HashSet::new();
    let mut last = None;
    while Instant::now() < end {
        let here = std::thread::current().id();
        if last.is_some_and(|l| l != here) {
            mig.migrated.fetch_add(1, Ordering::Relaxed);
        }
        mig.polls.fetch_add(1, Ordering::Relaxed);
        last = Some(here);
        threads.insert(here);
        let t = Instant::now();
        while t.elapsed() < slice {
            burn(500);
        }
        tokio::task::yield_now().await;
    }
    threads
}

/// The labels of task `task` of class `class`.
pub fn class_labels(class: usize, task: usize, hot: bool) -> SpanLabels {
    SpanLabels::builder()
        .trace_id(0xC1A5_0000_0000_0000_0000_0000_0000_0000 | (task as u128))
        .span_id(0x5000 + (task as u64) * 16 + class as u64)
        .span_name(&format!("class-{class}"))
        .route(&format!("GET /class/{class}"))
        .hot(if hot { Hotness::Sampled } else { Hotness::Cold })
        .build()
}

impl Workload {
    /// Runs the workload on a fresh runtime with spanprof's hooks installed
    /// (`hooks == false`: no hooks at all, wrapper only).
    pub fn run(&self, hooks: bool) -> (usize, usize, u64, u64) {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if hooks {
            spanprof::install_runtime_hooks(&mut builder);
        } else {
            builder.on_thread_start(|| {
                spanprof::register_current_thread();
            });
        }
        let rt = builder
            .worker_threads(self.workers)
            .enable_all()
            .build()
            .expect("runtime");
        let mig = Arc::new(Migration {
            polls: AtomicU64::new(0),
            migrated: AtomicU64::new(0),
        });
        let tasks_migrated = rt.block_on(async {
            let mut handles = Vec::new();
            for task in 0..self.tasks {
                let class = task % self.classes.clamp(1, BURNERS.len());
                handles.push(self.spawn_task(class, task, mig.clone()));
            }
            let mut migrated = 0;
            for h in handles {
                migrated += h.await.expect("task panicked");
            }
            migrated
        });
        drop(rt);
        (
            tasks_migrated,
            self.tasks,
            mig.polls.load(Ordering::Relaxed),
            mig.migrated.load(Ordering::Relaxed),
        )
    }

    fn spawn_task(
        &self,
        class: usize,
        task: usize,
        mig: Arc<Migration>,
    ) -> tokio::task::JoinHandle<usize> {
        let (duration, slice, hot) = (self.duration, self.slice, self.hot);
        let labels = class_labels(class, task, hot);
        let burn = BURNERS[class].1;
        match self.mode {
            Mode::Wrapper => tokio::spawn(
                async move { usize::from(burn_loop(burn, duration, slice, mig).await.len() > 1) }
                    .with_span_labels(labels),
            ),
            Mode::Inherit => tokio::spawn(
                async move {
                    // The child gets no wrapper: only the hooks can label it.
                    let child = tokio::spawn(burn_loop(burn, duration, slice, mig));
                    usize::from(child.await.expect("child").len() > 1)
                }
                .with_span_labels(labels),
            ),
            Mode::Joined => {
                let other = (class + 1) % BURNERS.len();
                let other_labels = class_labels(other, task + 1000, hot);
                let other_burn = BURNERS[other].1;
                let mig2 = mig.clone();
                let request = SpanLabels::builder()
                    .trace_id(0xAB)
                    .span_id(0x9000 + task as u64)
                    .span_name("request")
                    .build();
                tokio::spawn(
                    async move {
                        let (a, b) = futures_util::future::join(
                            burn_loop(burn, duration, slice, mig).with_span_labels(labels),
                            burn_loop(other_burn, duration, slice, mig2)
                                .with_span_labels(other_labels),
                        )
                        .await;
                        usize::from(a.len() > 1 || b.len() > 1)
                    }
                    .with_span_labels(request),
                )
            }
        }
    }
}

/// Classifies every sample of `profile` whose stack contains a class function.
pub fn score(profile: &Profile, outcome: &mut Outcome) {
    for s in &profile.samples {
        let Some(class) = s.stack.iter().find_map(|f| {
            BURNERS
                .iter()
                .position(|(name, _)| f.function.ends_with(name))
        }) else {
            continue;
        };
        outcome.samples += s.count;
        match &s.labels {
            Some(l) if l.span_id != 0 && *l.span_name == *format!("class-{class}") => {
                outcome.correct += s.count
            }
            Some(l) if l.span_id != 0 => outcome.wrong += s.count,
            _ => outcome.unlabeled += s.count,
        }
    }
}

/// Runs the workload under `profiler` and scores the samples it took.
pub fn run_and_score(w: &Workload, profiler: &spanprof::Profiler, hooks: bool) -> Outcome {
    let (tasks_migrated, tasks, polls, migrated) = w.run(hooks);
    profiler.flush();
    let mut outcome = Outcome {
        tasks_migrated,
        tasks,
        polls,
        migrated_polls: migrated,
        ..Outcome::default()
    };
    score(
        &profiler.store().process(Duration::from_secs(3600)),
        &mut outcome,
    );
    outcome
}

/// Iterations of `BURNERS[class]` that take about one microsecond of CPU here.
pub fn iterations_per_us(class: usize) -> u64 {
    let n = 2_000_000;
    let start = spanprof::stats::thread_cpu_time();
    black_box(BURNERS[class].1(n));
    let ns = (spanprof::stats::thread_cpu_time() - start)
        .as_nanos()
        .max(1) as u64;
    (n * 1000 / ns).max(1)
}

/// Hot and cold work taking turns on one thread, and how well each span's CPU
/// estimate matches its CPU.
#[derive(Debug, Clone, Copy)]
pub struct Interleaving {
    /// CPU of one hot poll, µs.
    pub hot_poll_us: u64,
    /// CPU of one cold poll, µs.
    pub cold_poll_us: u64,
    /// CPU the hot span gets in all, ms.
    pub hot_cpu_ms: u64,
}

/// What [`Interleaving::run`] measured.
#[derive(Debug, Clone, Copy)]
pub struct InterleavingOutcome {
    /// The hot span's CPU estimate (`SpanLabels::cpu_ns`) over its CPU time.
    pub hot_ratio: f64,
    /// The same for the cold span.
    pub cold_ratio: f64,
    /// Samples of the hot span.
    pub hot_samples: u64,
    /// Samples of the cold span.
    pub cold_samples: u64,
}

impl Interleaving {
    /// Runs it on a new registered thread: each poll burns a fixed number of
    /// iterations with no system call inside (nothing jitters the sampler's phase),
    /// the thread's CPU time is read between polls.
    pub fn run(&self, profiler: &spanprof::Profiler, span_base: u64) -> InterleavingOutcome {
        let hot = SpanLabels::builder()
            .span_id(span_base)
            .span_name("interleaved-hot")
            .route("/hot")
            .hot(Hotness::Sampled)
            .build();
        let cold = SpanLabels::builder()
            .span_id(span_base + 1)
            .span_name("interleaved-cold")
            .route("/cold")
            .build();
        let (hot_ns, cold_ns) = std::thread::scope(|s| {
            s.spawn(|| {
                spanprof::register_current_thread();
                let iters = [
                    iterations_per_us(0) * self.hot_poll_us,
                    iterations_per_us(1) * self.cold_poll_us,
                ];
                let mut spent = [0u64; 2];
                while spent[0] < self.hot_cpu_ms * 1_000_000 {
                    for (i, labels) in [&hot, &cold].into_iter().enumerate() {
                        let start = spanprof::stats::thread_cpu_time();
                        {
                            let _poll = labels.enter();
                            black_box(BURNERS[i].1(iters[i]));
                        }
                        spent[i] += (spanprof::stats::thread_cpu_time() - start).as_nanos() as u64;
                    }
                }
                (spent[0], spent[1])
            })
            .join()
            .expect("interleaving thread")
        });
        profiler.flush();
        InterleavingOutcome {
            hot_ratio: hot.cpu_ns() as f64 / hot_ns as f64,
            cold_ratio: cold.cpu_ns() as f64 / cold_ns as f64,
            hot_samples: hot.cpu_samples(),
            cold_samples: cold.cpu_samples(),
        }
    }
}
