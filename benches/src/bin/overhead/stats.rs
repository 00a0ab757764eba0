//! Statistics of a run: medians, their bootstrap intervals, and the figures of one
//! mode over the rounds.

use crate::load::LoadOutcome;
use crate::serve::Server;

/// SplitMix64: a small deterministic generator for the bootstrap.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64 * n as f64) as usize
    }
}

pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if !n.is_multiple_of(2) {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The median of `v` and a 95 % bootstrap interval of it, resampling in two levels
/// when the rounds ran on several sets of server processes (`segment[i]` is round
/// i's): the segments with replacement, then the rounds within each. A process's own
/// bias is then part of the interval, not hidden in it. With one segment this is
/// [`median_ci`]. With few segments (five) such an interval is approximate (and
/// counts the rounds' own spread twice, so it errs wide); the JSON lists each
/// segment's median beside it, and the lowest and highest of five bound the median
/// with about 94 % confidence without any resampling.
pub fn median_ci_segments(v: &[f64], segment: &[usize]) -> (f64, f64, f64) {
    let k = segment.iter().max().map_or(1, |m| m + 1);
    if k == 1 {
        return median_ci(v);
    }
    const RESAMPLES: usize = 10_000;
    let by_segment: Vec<Vec<f64>> = (0..k)
        .map(|g| {
            v.iter()
                .zip(segment)
                .filter(|(_, s)| **s == g)
                .map(|(x, _)| *x)
                .collect()
        })
        .collect();
    let mut rng = SplitMix64(0x005e_ed0f_0e12_4ead);
    let mut meds: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let mut s = Vec::with_capacity(v.len());
            for _ in 0..k {
                let g = &by_segment[rng.below(k)];
                s.extend((0..g.len()).map(|_| g[rng.below(g.len())]));
            }
            median(&s)
        })
        .collect();
    meds.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| meds[((RESAMPLES - 1) as f64 * p).round() as usize];
    (median(v), q(0.025), q(0.975))
}

/// Median of `v` and the 95 % percentile-bootstrap interval of that median
/// (10 000 resamples of the rounds, with replacement; fixed seed).
fn median_ci(v: &[f64]) -> (f64, f64, f64) {
    const RESAMPLES: usize = 10_000;
    let mut rng = SplitMix64(0x005e_ed0f_0e12_4ead);
    let mut meds: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let s: Vec<f64> = (0..v.len()).map(|_| v[rng.below(v.len())]).collect();
            median(&s)
        })
        .collect();
    meds.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| meds[((RESAMPLES - 1) as f64 * p).round() as usize];
    (median(v), q(0.025), q(0.975))
}

/// Figures of one mode on one workload, one entry per round.
#[derive(Default, Clone)]
pub struct Series {
    pub cpu_us_per_req: Vec<f64>,
    pub p50_us: Vec<f64>,
    pub p99_us: Vec<f64>,
    pub requests: Vec<f64>,
    pub errors: f64,
    pub skipped: f64,
    /// Per thread name, the CPU per request each round spent on those threads.
    pub by_thread: std::collections::BTreeMap<String, Vec<f64>>,
}

impl Series {
    /// Adds one round of server `s`: its CPU (process and by thread) read `before`
    /// the load and now, divided by the requests the load `o` got answered.
    pub fn record(
        &mut self,
        s: &mut Server,
        before: (std::collections::BTreeMap<String, f64>, u64),
        o: LoadOutcome,
        round: usize,
        w: &str,
        quiet: bool,
    ) {
        let (threads0, cpu0) = before;
        let cpu = (s.cpu_ns() - cpu0) as f64 / 1e3;
        for (name, t1) in s.cpu_by_thread() {
            let t0 = threads0.get(&name).copied().unwrap_or(0.0);
            self.by_thread
                .entry(name)
                .or_default()
                .push((t1 - t0) * 1e6 / o.requests.max(1.0));
        }
        self.cpu_us_per_req.push(cpu / o.requests.max(1.0));
        self.p50_us.push(o.p50_us);
        self.p99_us.push(o.p99_us);
        self.requests.push(o.requests);
        self.errors += o.errors;
        self.skipped += o.skipped;
        if !quiet {
            eprintln!(
                "round {round:>2} {w:<8} {:<9} {:>7.1} µs CPU/req, p50 {:>6.0} µs, p99 {:>6.0} µs, {} req{}",
                s.mode,
                cpu / o.requests.max(1.0),
                o.p50_us,
                o.p99_us,
                o.requests,
                if o.errors + o.skipped > 0.0 {
                    format!(", {} errors, {} skipped", o.errors, o.skipped)
                } else {
                    String::new()
                }
            );
        }
    }
}
