//! Stack-quality workloads: work that spends its time in library code (Rust's
//! formatting machinery, glibc's `memmove` and allocator, `serde_json`, `regex`, the
//! C zlib), each called from a caller function of its own. A sample's stack is
//! *whole* when it holds that caller (so the flamegraph blames the right function)
//! and reaches the thread's first frame (`start_thread`).
//!
//! `stack_quality` measures the shares per pattern; the `stacks` integration tests
//! hold the allocation-heavy ones to 99 %.

use std::fmt;
use std::hint::black_box;
use std::time::Duration;

use spanprof::{Hotness, Profile, SpanLabels};

/// One pattern: its name, the caller function its samples must hold, and one unit
/// of its work (a few tens of microseconds).
#[derive(Debug, Clone, Copy)]
pub struct StackPattern {
    /// Short name (`small_allocations`).
    pub name: &'static str,
    /// The caller function's name as the symbolizer prints it, without the crate path.
    pub caller: &'static str,
    /// One unit of work, through the caller.
    pub run: fn(u64) -> u64,
}

/// Every pattern, in the order the benchmark prints them.
pub const STACK_PATTERNS: &[StackPattern] = &[
    StackPattern {
        name: "display_via_format",
        caller: "stack_caller_display",
        run: stack_caller_display,
    },
    StackPattern {
        name: "copy_from_slice",
        caller: "stack_caller_copy",
        run: stack_caller_copy,
    },
    StackPattern {
        name: "small_allocations",
        caller: "stack_caller_allocations",
        run: stack_caller_allocations,
    },
    StackPattern {
        name: "serde_json",
        caller: "stack_caller_serde_json",
        run: stack_caller_serde_json,
    },
    StackPattern {
        name: "regex_new",
        caller: "stack_caller_regex",
        run: stack_caller_regex,
    },
    StackPattern {
        name: "zlib_c_library",
        caller: "stack_caller_zlib",
        run: stack_caller_zlib,
    },
];

/// The pattern named `name`.
pub fn pattern(name: &str) -> Option<&'static StackPattern> {
    STACK_PATTERNS.iter().find(|p| p.name == name)
}

struct Money(u64, &'static str);

impl fmt::Display for Money {
    #[inline(never)]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for i in 0..8 {
            write!(f, "{}.{:02} {} ", self.0 / 100 + i, self.0 % 100, self.1)?;
        }
        Ok(())
    }
}

/// Work inside a `Display` impl, reached through `format!`.
#[inline(never)]
pub fn stack_caller_display(n: u64) -> u64 {
    let mut len = 0;
    for i in 0..n * 20 {
        len += format!("{}", Money(black_box(i * 7919), "EUR")).len();
    }
    black_box(len as u64)
}

/// Large `copy_from_slice` (glibc's `memmove`).
#[inline(never)]
pub fn stack_caller_copy(n: u64) -> u64 {
    thread_local! {
        static BUFS: std::cell::RefCell<(Vec<u8>, Vec<u8>)> =
            std::cell::RefCell::new((vec![7; 1 << 20], vec![0; 1 << 20]));
    }
    BUFS.with(|b| {
        let (src, dst) = &mut *b.borrow_mut();
        for _ in 0..n {
            dst.copy_from_slice(black_box(src));
        }
        u64::from(dst[dst.len() / 2])
    })
}

/// Many small `Vec` allocations (glibc's `malloc` and `free`).
#[inline(never)]
pub fn stack_caller_allocations(n: u64) -> u64 {
    let mut total = 0u64;
    for round in 0..n * 4 {
        let mut keep: Vec<Vec<u8>> = Vec::with_capacity(64);
        for i in 0..64u64 {
            keep.push(vec![(round + i) as u8; 16 + (i as usize * 37) % 200]);
        }
        total += keep.iter().map(|v| v.len() as u64).sum::<u64>();
        black_box(&keep);
    }
    black_box(total)
}

/// `serde_json` building and printing documents.
#[inline(never)]
pub fn stack_caller_serde_json(n: u64) -> u64 {
    let mut len = 0;
    for i in 0..n * 4 {
        let lines: Vec<serde_json::Value> = (0..16)
            .map(|j| {
                serde_json::json!({
                    "sku": format!("SKU-{i}-{j}"),
                    "qty": j,
                    "price": { "amount": i * 100 + j, "currency": "EUR" },
                    "tags": ["a", "b", "c"],
                })
            })
            .collect();
        let doc = serde_json::json!({ "order": i, "lines": lines });
        len += serde_json::to_string(black_box(&doc)).map_or(0, |s| s.len());
    }
    black_box(len as u64)
}

/// `Regex::new` (compiling a regular expression).
#[inline(never)]
pub fn stack_caller_regex(n: u64) -> u64 {
    let mut states = 0;
    for i in 0..n {
        let re = regex::Regex::new(&format!(r"^(SKU|sku)-{}-(\d+)[a-z]{{2,5}}$", i % 97));
        states += re.map_or(0, |r| r.captures_len());
    }
    black_box(states as u64)
}

/// Compressing with the C zlib (flate2 with its `zlib` backend: the system's
/// `libz.so.1`, built without frame pointers, where one is installed).
#[inline(never)]
pub fn stack_caller_zlib(n: u64) -> u64 {
    use std::io::Write;
    thread_local! {
        static INPUT: Vec<u8> = (0..64 * 1024u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8 % 16)
            .collect();
    }
    INPUT.with(|input| {
        let mut total = 0;
        for _ in 0..n {
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
            let _ = z.write_all(input);
            total += z.finish().map_or(0, |out| out.len() as u64);
        }
        black_box(total)
    })
}

/// How a pattern's samples fared.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StackQuality {
    /// Samples of the pattern's span.
    pub samples: u64,
    /// Of those, samples whose stack holds the caller.
    pub with_caller: u64,
    /// Of those, samples whose stack reaches the thread's first frame.
    pub rooted: u64,
    /// Samples whose stack both holds the caller and is rooted.
    pub whole: u64,
    /// Mean frames per stack.
    pub mean_depth: f64,
}

impl StackQuality {
    /// `n` as a share of the samples.
    pub fn share(&self, n: u64) -> f64 {
        n as f64 / self.samples.max(1) as f64
    }
}

/// Whether a frame's function is where a thread's stack starts: glibc's
/// `start_thread` (or the `clone3` below it) for a spawned thread, `__libc_start_main`
/// or `_start` for the main one.
pub fn is_thread_root(function: &str) -> bool {
    [
        "start_thread",
        "clone3",
        "__clone",
        "__libc_start_main",
        "_start",
    ]
    .iter()
    .any(|r| function == *r || function.starts_with(&format!("{r}@")))
}

/// Scores the samples of `profile` for a pattern whose caller is `caller`.
pub fn score(profile: &Profile, caller: &str) -> StackQuality {
    let mut q = StackQuality::default();
    let mut frames = 0u64;
    for s in &profile.samples {
        let n = s.count;
        let has_caller = s.stack.iter().any(|f| f.function.contains(caller));
        let rooted = s
            .stack
            .iter()
            .rev()
            .take(3)
            .any(|f| is_thread_root(&f.function));
        q.samples += n;
        frames += n * s.stack.len() as u64;
        q.with_caller += if has_caller { n } else { 0 };
        q.rooted += if rooted { n } else { 0 };
        q.whole += if has_caller && rooted { n } else { 0 };
    }
    q.mean_depth = frames as f64 / q.samples.max(1) as f64;
    q
}

/// Runs `pattern` on a new registered thread inside hot labels of span `span_id`
/// until the thread has used `cpu` of CPU time; returns the CPU it used.
pub fn run_labelled(pattern: &StackPattern, span_id: u64, cpu: Duration) -> Duration {
    let pattern = *pattern;
    std::thread::spawn(move || {
        spanprof::register_current_thread();
        let labels = SpanLabels::builder()
            .span_id(span_id)
            .span_name(pattern.name)
            .hot(Hotness::Sampled)
            .build();
        let _g = labels.enter();
        let start = spanprof::stats::thread_cpu_time();
        while spanprof::stats::thread_cpu_time() - start < cpu {
            // About a millisecond of work between two reads of the clock, so the
            // loop's own code is a negligible share of the samples.
            for _ in 0..8 {
                (pattern.run)(black_box(4));
            }
        }
        spanprof::stats::thread_cpu_time() - start
    })
    .join()
    .expect("pattern thread")
}
