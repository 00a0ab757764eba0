//! pyroscope-rs 2.x on spanprof's attribution workload: 32 tasks in 8 classes on a
//! 2-worker tokio runtime, each class burning CPU in its own function and yielding
//! every ~1 ms so tasks migrate. The class tag is set and cleared around every poll
//! (pyroscope's most favourable use: a per-request tag set once would be wrong as
//! soon as two requests share a worker). Reports the share of class samples that
//! carry the right tag, and the cost of each tag change. Prints one JSON object.
//!
//! `cd benches/anchors/pyroscope-attribution && cargo run --release -- --json [--seconds 10]`
//!
//! The backend is driven directly (what `PyroscopeAgent::tag_wrapper` does: lock the
//! backend, add or remove the thread tag), and its report is read in-process instead
//! of being pushed to a server.

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use pyroscope::ThreadId;
use pyroscope::backend::{Backend, BackendConfig, Pprof, PprofConfig, ReportData, Tag, ThreadTag};

macro_rules! burners {
    ($($name:ident = ($a:literal, $b:literal, $c:literal, $k:literal)),*) => {
        $(
            #[inline(never)]
            fn $name(iters: u64) -> u64 {
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
        const BURNERS: &[(&str, fn(u64) -> u64)] = &[$((stringify!($name), $name)),*];
    };
}

// The same bodies as spanprof-workloads' burners.
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

type Shared = Arc<Mutex<Box<dyn Backend>>>;

static TAG_CALLS: AtomicU64 = AtomicU64::new(0);
static TAG_NS: AtomicU64 = AtomicU64::new(0);

fn tag(backend: &Shared, class: usize, add: bool) {
    let t = Instant::now();
    let rule = ThreadTag::new(ThreadId::pthread_self(), Tag::new("class".into(), class.to_string()));
    let b = backend.lock().unwrap();
    if add {
        b.add_tag(rule).unwrap();
    } else {
        b.remove_tag(rule).unwrap();
    }
    drop(b);
    TAG_NS.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    TAG_CALLS.fetch_add(1, Ordering::Relaxed);
}

/// Sets the class tag around every poll of the inner future.
struct Tagged<F> {
    inner: Pin<Box<F>>,
    class: usize,
    backend: Shared,
}

impl<F: Future> Future for Tagged<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let (class, backend) = (self.class, self.backend.clone());
        tag(&backend, class, true);
        let out = self.inner.as_mut().poll(cx);
        tag(&backend, class, false);
        out
    }
}

async fn burn_loop(burn: fn(u64) -> u64, duration: Duration) {
    let end = Instant::now() + duration;
    while Instant::now() < end {
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(1) {
            burn(500);
        }
        tokio::task::yield_now().await;
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: u64 = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .map_or(10, |s| s.parse().expect("--seconds N"));
    let mut pprof: Box<dyn Backend> = Box::new(Pprof::new(PprofConfig { sample_rate: 100 }, BackendConfig::default()));
    pprof.initialize().expect("start pyroscope's pprof backend");
    let backend: Shared = Arc::new(Mutex::new(pprof));

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let wall = Instant::now();
    rt.block_on(async {
        let mut handles = Vec::new();
        for task in 0..32 {
            let class = task % 8;
            handles.push(tokio::spawn(Tagged {
                inner: Box::pin(burn_loop(BURNERS[class].1, Duration::from_secs(seconds))),
                class,
                backend: backend.clone(),
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
    });
    let wall = wall.elapsed().as_secs_f64();
    let batch = backend.lock().unwrap().report().expect("report");
    let ReportData::Reports(reports) = batch.data else {
        panic!("expected stack reports");
    };
    let (mut samples, mut correct, mut wrong, mut unlabeled) = (0usize, 0usize, 0usize, 0usize);
    for report in &reports {
        let tag = report
            .metadata
            .tags
            .iter()
            .find(|t| t.key == "class")
            .map(|t| t.value.parse::<usize>().unwrap());
        for (stack, count) in &report.data {
            let Some(class) = stack.frames.iter().find_map(|f| {
                let name = f.name.as_deref()?;
                BURNERS.iter().position(|(n, _)| name.contains(n))
            }) else {
                continue;
            };
            samples += count;
            match tag {
                Some(t) if t == class => correct += count,
                Some(_) => wrong += count,
                None => unlabeled += count,
            }
        }
    }
    let calls = TAG_CALLS.load(Ordering::Relaxed);
    let frac = |n: usize| if samples == 0 { 0.0 } else { n as f64 / samples as f64 };
    println!(
        "{}",
        serde_json::json!({
            "profiler": "pyroscope 2.1.5 (pprof-rs backend), tags set around every poll",
            "samples": samples,
            "correct": frac(correct),
            "wrong": frac(wrong),
            "unlabeled": frac(unlabeled),
            "tag_changes": calls,
            "tag_changes_per_second": calls as f64 / wall,
            "us_per_tag_change": TAG_NS.load(Ordering::Relaxed) as f64 / calls.max(1) as f64 / 1e3,
            "seconds": wall,
        })
    );
}
