//! The command line. Without a subcommand, a measuring run ([`RunArgs`]); `serve`,
//! `load` and `handler-cost` are what a run starts in processes of their own, and
//! what the scripts under `benches/scripts/` call.

use clap::{Args, Parser, Subcommand};

/// The modes, in the JSON's order; `stack` is the reference of every ratio.
pub const MODES: [&str; 5] = ["none", "stack", "baseline", "hot10", "pyroscope"];
/// Ablations of `baseline`, for `--modes` (where spanprof's cost per request goes):
/// without the tracing integration (`SpanProfileLayer` and `SpanProfileProcessor`),
/// without `SpanProfileLayer` only, without `SpanProfileProcessor` only, and without
/// the runtime hooks; and `baseline-sampling`, the profiler (99 Hz, hooks, Pyroscope
/// push) with none of the per-request integration: what sampling alone costs.
/// `baseline-passthrough` is `baseline-sampling` with a layer that does nothing in
/// the correlation layer's place (it wraps the response body as that one does).
/// `baseline-sampling-noperf` is `baseline-sampling` without the per-thread perf
/// events (the CPU timer alone). `baseline-disabled` is `baseline-nospans` with every route disabled (the layer
/// names each request and looks up its policy, then labels nothing).
/// `baseline-49hz` and `baseline-19hz` are `baseline` at a lower baseline rate: what
/// the rate, the one setting that scales sampling's cost, buys.
/// `baseline-twolayers` is `baseline` with `TraceLayer` and the correlation layer in
/// two `Router::layer` calls instead of one `tower::ServiceBuilder` (axum boxes each
/// route's service once per call: three allocations a request).
/// `hot100` is `hot10` with every request hot: a hot request's own cost, ten times
/// the share it has in `hot10`.
/// `stack-again` is a second server identical to `stack`: an A/A control of the method.
/// `labels-only` is `baseline` without spanprof's sampler (`Sampling::LabelsOnly`, no
/// push): what a service profiled from outside pays (build with `--features
/// otel-thread-ctx` to include OpenTelemetry's thread context).
pub const ABLATIONS: [&str; 14] = [
    "hot100",
    "labels-only",
    "baseline-sampling",
    "baseline-passthrough",
    "baseline-sampling-noperf",
    "baseline-disabled",
    "baseline-nospans",
    "baseline-nolayer",
    "baseline-noprocessor",
    "baseline-nohooks",
    "baseline-49hz",
    "baseline-19hz",
    "baseline-twolayers",
    "stack-again",
];

/// What spanprof costs a service, next to what the service already runs.
#[derive(Debug, Parser)]
#[command(name = "overhead", args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// A process of a run; none: the run itself.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The run's settings.
    #[command(flatten)]
    pub run: RunArgs,
}

/// The processes a run starts.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// One server of `--mode`, pushing profiles to `--sink`: prints `port N`, then
    /// answers each `cpu` line on stdin with its process CPU time (ns).
    Serve {
        /// One of the modes or ablations.
        #[arg(long)]
        mode: String,
        /// The Pyroscope sink's URL.
        #[arg(long)]
        sink: String,
    },
    /// The load generator: prints `requests p50_us p99_us errors skipped`.
    Load(LoadArgs),
    /// The JSON handler's own CPU time per call, without HTTP or tracing.
    HandlerCost,
}

/// `load --url U --workload W --secs S (--rate R | --concurrency C)`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// The server's base URL.
    #[arg(long)]
    pub url: String,
    /// `json` or `checkout`.
    #[arg(long)]
    pub workload: String,
    /// How long to send, in seconds.
    #[arg(long)]
    pub secs: f64,
    /// Open-loop rate, requests per second (0: closed loop, `--concurrency`).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Closed-loop connections.
    #[arg(long, default_value_t = 0)]
    pub concurrency: usize,
}

/// A measuring run's settings.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Rounds of every mode.
    #[arg(long, default_value_t = 15)]
    pub rounds: usize,
    /// Seconds of load per round and server.
    #[arg(long = "round-secs", default_value_t = 2.0)]
    pub round_secs: f64,
    /// The open-loop rate, as a fraction of the `stack` server's saturation.
    #[arg(long = "load", default_value_t = 0.6)]
    pub load_fraction: f64,
    /// Workloads, comma-separated: `json`, `checkout`.
    #[arg(long, value_delimiter = ',', default_value = "json,checkout")]
    pub workloads: Vec<String>,
    /// pyroscope-rs's server (`benches/anchors/pyroscope-overhead`); the mode
    /// `pyroscope` is left out when the file does not exist.
    #[arg(long)]
    pub anchor: Option<String>,
    /// Another build of this binary, serving `--compare-mode` as one more mode,
    /// `compare`: a before/after in one run.
    #[arg(long)]
    pub compare: Option<String>,
    /// The mode `--compare` (and `--after`) serve.
    #[arg(long = "compare-mode", default_value = "baseline")]
    pub compare_mode: String,
    /// The build that serves `--compare-mode` itself (default: this binary), so that a
    /// before/after can be run again with the two builds' places swapped.
    #[arg(long)]
    pub after: Option<String>,
    /// Print only the JSON (no progress on stderr).
    #[arg(long)]
    pub json: bool,
    /// Every server at once, each at 1/n of the rate (default: in turn).
    #[arg(long)]
    pub concurrent: bool,
    /// Sets of fresh server processes the rounds are split over.
    #[arg(long, default_value_t = 1)]
    pub restarts: usize,
    /// Modes to run besides `stack`, comma-separated (`ablations`: every ablation).
    #[arg(long)]
    pub modes: Option<String>,
    /// Run every server from the files given, not from a copy of its own.
    #[arg(long = "shared-binary")]
    pub shared_binary: bool,
    /// Draw the per-round ratios into this PNG.
    #[arg(long)]
    pub plot: Option<String>,
}

impl RunArgs {
    /// The modes to run, `stack` first of the list's order (every ratio's reference).
    /// A name that is no mode is an error, not a mode left out; so is `--after`
    /// without `--compare` and its mode. Exits 2 on either.
    pub fn picked_modes(&self) -> Vec<&'static str> {
        let picked: Vec<&'static str> = match &self.modes {
            None => MODES.to_vec(),
            Some(list) => {
                let asked = |m: &str| {
                    list.split(',')
                        .any(|x| x == m || (x == "ablations" && ABLATIONS.contains(&m)))
                };
                if let Some(bad) = list
                    .split(',')
                    .find(|x| *x != "ablations" && !MODES.contains(x) && !ABLATIONS.contains(x))
                {
                    eprintln!(
                        "overhead: --modes: no mode {bad:?}; the modes are {MODES:?}, the \
                         ablations {ABLATIONS:?} (or `ablations` for all of them)"
                    );
                    std::process::exit(2);
                }
                MODES
                    .iter()
                    .chain(&ABLATIONS)
                    .copied()
                    .filter(|m| *m == "stack" || asked(m))
                    .collect()
            }
        };
        if self.after.is_some()
            && (self.compare.is_none() || !picked.contains(&self.compare_mode.as_str()))
        {
            eprintln!(
                "overhead: --after serves --compare-mode ({}) against --compare's build: \
                 give --compare, and that mode in --modes",
                self.compare_mode
            );
            std::process::exit(2);
        }
        picked
    }
}
