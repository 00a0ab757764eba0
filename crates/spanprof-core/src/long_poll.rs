//! The long-poll warning and stack, and where a long poll of hot work spent its
//! time: the poller hands the report over ([`defer`]) and the collector, once the
//! poll's wall-clock and CPU samples are in the store ([`emit_ready`]), keeps the
//! top frames of the span's heaviest stack for the span's `spanprof.long_poll` event
//! ([`stack`]) and logs the warning, naming the top frame of the span's own code.
//! Cold work, and a profiler with no wall-clock samples, are logged at once, without
//! a frame or stack.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::profile::{Frame, Profile};
use crate::store::SpanProfileStore;

/// A long poll, as the warning names it.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    /// The span whose labels were pushed (its tree holds the poll's samples).
    pub(crate) span_id: u64,
    pub(crate) name: String,
    pub(crate) route: String,
    pub(crate) ns: u64,
    /// Mostly blocked (`Some(true)`), mostly on CPU, or unknown (cold work).
    pub(crate) off_cpu: Option<bool>,
    pub(crate) thread: String,
    /// When the poll ended (`sys::monotonic_now_ns`).
    pub(crate) at_ns: u64,
    /// Whether to log it at warn (past twice the threshold), not only keep its stack.
    pub(crate) warn: bool,
}

/// Reports waiting for their samples; past this many, a report is logged at once.
const MAX_PENDING: usize = 64;

static PENDING: Mutex<VecDeque<Report>> = Mutex::new(VecDeque::new());

/// Frames kept per long poll's stack, leaf first.
const STACK_FRAMES: usize = 8;

/// Stacks kept for spans not exported yet; past it the oldest goes. A batching span
/// pipeline exports within seconds; this holds a minute of long polls at 17 a second.
const MAX_STACKS: usize = 1024;

/// The top frames of each recent long poll's span, oldest first.
static STACKS: Mutex<VecDeque<(u64, Arc<[String]>)>> = Mutex::new(VecDeque::new());

/// Queues `report` for the collector, or logs it now when the queue is full.
pub(crate) fn defer(report: Report) {
    let mut q = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    if q.len() >= MAX_PENDING {
        drop(q);
        if report.warn {
            warn(&report, None);
        }
        return;
    }
    q.push_back(report);
}

/// The top frames ([`STACK_FRAMES`], leaf first, each `function (file:line)`) of the
/// heaviest stack sampled in span `span_id`'s tree by the time its long poll was
/// taken in by the collector: wall-clock time for a poll that blocked, else CPU and
/// wall-clock time. `None` while the poll's samples are on their way, for cold work
/// (no wall-clock samples) and for a span with no long poll.
#[doc(hidden)]
pub fn stack(span_id: u64) -> Option<Arc<[String]>> {
    let g = STACKS.lock().unwrap_or_else(|e| e.into_inner());
    g.iter()
        .rev()
        .find(|(id, _)| *id == span_id)
        .map(|(_, s)| s.clone())
}

/// Whether a long poll of one of `span_ids` waits for its samples ([`stack`] has
/// nothing for it yet; [`crate::Profiler::flush`] takes them in).
#[doc(hidden)]
pub fn stack_pending(span_ids: &[u64]) -> bool {
    let q = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    !q.is_empty() && q.iter().any(|r| span_ids.contains(&r.span_id))
}

fn keep_stack(span_id: u64, frames: Arc<[String]>) {
    let mut g = STACKS.lock().unwrap_or_else(|e| e.into_inner());
    if g.len() >= MAX_STACKS {
        g.pop_front();
    }
    g.push_back((span_id, frames));
}

/// Logs every report of a poll that ended before `cutoff_ns` (all its samples are
/// in `store` then), with the top user frame of its span tree's heaviest stack.
pub(crate) fn emit_ready(store: &SpanProfileStore, cutoff_ns: u64) {
    let ready: Vec<Report> = {
        let mut q = PENDING.lock().unwrap_or_else(|e| e.into_inner());
        if q.is_empty() {
            return;
        }
        let (ready, waiting): (VecDeque<Report>, VecDeque<Report>) =
            q.drain(..).partition(|r| r.at_ns < cutoff_ns);
        *q = waiting;
        ready.into()
    };
    for r in ready {
        let profile = store.span_tree(r.span_id);
        let heaviest = profile
            .as_ref()
            .and_then(|p| heaviest(p, r.off_cpu == Some(true)));
        if let Some(stack) = heaviest {
            let frames: Arc<[String]> = stack.iter().take(STACK_FRAMES).map(describe).collect();
            keep_stack(r.span_id, frames);
        }
        if r.warn {
            let frame = heaviest.and_then(|s| s.iter().find(|f| f.is_own_code()));
            warn(&r, frame.map(describe).as_deref());
        }
    }
}

/// The heaviest stack: by wall-clock time for a poll that blocked, else by CPU and
/// wall-clock time.
fn heaviest(profile: &Profile, off_cpu: bool) -> Option<&[Frame]> {
    let weight = |s: &crate::profile::ProfileSample| {
        if off_cpu {
            s.wall_ns
        } else {
            s.cpu_ns + s.wall_ns
        }
    };
    profile
        .samples
        .iter()
        .filter(|s| weight(s) > 0)
        .max_by_key(|s| weight(s))
        .map(|s| &s.stack[..])
}

/// A frame as the event and the warning name it: `function (file:line)`, or the
/// function alone where debug info has no file.
fn describe(f: &Frame) -> String {
    match f.file.as_deref() {
        Some(file) => format!("{} ({file}:{})", f.function, f.line),
        None => f.function.to_string(),
    }
}

/// The first frame of the service's own code (not the standard library, a crate
/// from a registry, or a C library) in the heaviest stack.
#[cfg(test)]
fn top_frame(profile: &Profile, off_cpu: bool) -> Option<String> {
    heaviest(profile, off_cpu)?
        .iter()
        .find(|f| f.is_own_code())
        .map(describe)
}

/// Rate limit of the long-poll warning: the first, then at most one a minute, saying
/// how many were not logged in between.
struct WarnLimit {
    state: Mutex<(Option<Instant>, u64)>,
}

impl WarnLimit {
    /// Whether to log now, and how many were held back since the last one logged.
    fn admit(&self) -> Option<u64> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (last, held) = &mut *g;
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(60)) {
            *held += 1;
            return None;
        }
        *last = Some(Instant::now());
        Some(std::mem::take(held))
    }
}

static LONG_POLL_WARNINGS: WarnLimit = WarnLimit {
    state: Mutex::new((None, 0)),
};

/// Logs `r` at warn (rate limited), with the frame where its time went when known.
pub(crate) fn warn(r: &Report, frame: Option<&str>) {
    let Some(more) = LONG_POLL_WARNINGS.admit() else {
        return;
    };
    let what = match r.off_cpu {
        Some(true) => "blocked off CPU (a blocking call inside an async poll)",
        Some(false) => "on CPU (heavy work inside an async poll)",
        None => "on or off CPU",
    };
    let at = frame.map_or_else(String::new, |f| format!(", in {f}"));
    let more = if more > 0 {
        format!(" ({more} more long polls since the last warning)")
    } else {
        String::new()
    };
    let (name, route, thread) = (&r.name, &r.route, &r.thread);
    tracing::warn!(
        span = %name,
        route = %route,
        thread = %thread,
        "spanprof: a poll of `{name}` ({route}) held its worker for {:.1} ms, {what}{at}; \
         every task queued on that worker waited. Move it to spawn_blocking \
         (spanprof::spawn_blocking keeps its labels){more}",
        r.ns as f64 / 1e6
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::ProfileSample;

    fn frame(function: &str, file: Option<&str>) -> Frame {
        Frame {
            function: function.into(),
            file: file.map(Into::into),
            line: 7,
            address: 1,
            inlined: false,
        }
    }

    fn sample(stack: Vec<Frame>, cpu_ns: u64, wall_ns: u64) -> ProfileSample {
        ProfileSample {
            stack: stack.into(),
            labels: None,
            count: u64::from(cpu_ns > 0),
            cpu_ns,
            wall_ns,
        }
    }

    #[test]
    fn the_top_frame_is_the_services_own_code_in_the_heaviest_stack() {
        let blocked = vec![
            frame("__GI___clock_nanosleep", Some("clock_nanosleep.c")),
            frame("std::sys::thread::unix::sleep::nanosleep", Some("unix.rs")),
            frame(
                "<F as core::future::future::Future>::poll",
                Some("future.rs"),
            ),
            frame("checkout::legacy_review", Some("src/payments.rs")),
            frame(
                "tokio::runtime::task::poll",
                Some("/root/.cargo/registry/src/index/tokio-1/src/runtime/task.rs"),
            ),
        ];
        let busy = vec![frame("checkout::score", Some("/srv/app/src/fraud.rs"))];
        let p = Profile {
            samples: vec![
                sample(blocked, 0, 40_000_000),
                sample(busy, 9_000_000, 10_000_000),
            ],
            ..Profile::empty(1)
        };
        assert_eq!(
            top_frame(&p, true).as_deref(),
            Some("checkout::legacy_review (src/payments.rs:7)")
        );
        // On CPU: by CPU and wall time together.
        let p2 = Profile {
            samples: vec![
                sample(vec![frame("a::light", Some("src/a.rs"))], 1, 1),
                sample(vec![frame("a::heavy", Some("src/a.rs"))], 30, 0),
            ],
            ..Profile::empty(1)
        };
        assert_eq!(
            top_frame(&p2, false).as_deref(),
            Some("a::heavy (src/a.rs:7)")
        );
        // A trait impl of the service's own type is its code.
        let p4 = Profile {
            samples: vec![sample(
                vec![
                    frame(
                        "<alloc::vec::Vec<T> as core::clone::Clone>::clone",
                        Some("vec.rs"),
                    ),
                    frame("<app::Cart as core::fmt::Display>::fmt", Some("cart.rs")),
                ],
                5,
                0,
            )],
            ..Profile::empty(1)
        };
        assert_eq!(
            top_frame(&p4, false).as_deref(),
            Some("<app::Cart as core::fmt::Display>::fmt (cart.rs:7)")
        );
        // Nothing of the service's own: no frame named.
        let p3 = Profile {
            samples: vec![sample(vec![frame("clock_nanosleep", None)], 0, 5)],
            ..Profile::empty(1)
        };
        assert_eq!(top_frame(&p3, true), None);
    }
}
