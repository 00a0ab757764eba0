//! What spanprof costs a service, next to what the service already runs.
//!
//! One run starts one server **process** per mode, each on a 2-worker tokio runtime
//! serving the same routes (`spanprof_workloads::service`): a light JSON API handler
//! (`POST /api/orders`: parse, validate, price, serialize; about 50 µs of CPU) and the
//! checkout example's handler mix (`GET /checkout`, `GET /cart/{id}`). The modes:
//!
//! - `none`: the bare router;
//! - `stack`: the user's existing stack, tower-http's `TraceLayer` and
//!   `tracing-opentelemetry` with the SDK's batch span processor in front of an
//!   in-process exporter that discards (spans are built, queued and batched; no
//!   encoding, no network);
//! - `baseline`: the stack plus spanprof as its docs set it up (`SpanProfileLayer`,
//!   `SpanProfileProcessor`, `ProfileCorrelationLayer` in one `ServiceBuilder` with
//!   `TraceLayer`, sample rate 0, the 99 Hz baseline, the runtime hooks, a Pyroscope
//!   push every 10 s to a local sink);
//! - `hot10`: the same with 10 % of requests hot at 1 kHz;
//! - `pyroscope`: the stack plus pyroscope-rs 2.1.5's agent at 100 Hz, tagging each
//!   request with `tag_wrapper` and pushing to the same sink (its own package,
//!   `benches/anchors/pyroscope-overhead`, given with `--anchor BINARY`).
//!
//! The load comes from a separate process (this binary, `load`), at a fixed
//! **open-loop** rate: a fraction (`--load`, default 0.6) of the saturation
//! throughput of the `stack` server, measured at start with a closed-loop load. Each
//! round sends that load to every server in turn (the order rotates from round to
//! round) and reads each server's process CPU time before and after; the metric is
//! server CPU time per request, with p50/p99 latency (measured from each request's
//! scheduled send time) beside it. Ratios are paired within a round (mode / stack);
//! the JSON reports their median over rounds and a 95 % bootstrap interval of it.
//!
//! With `--concurrent`, each round loads every server at the same time instead, each
//! at 1/n of the rate (n servers): the machine's other load then falls on every mode
//! alike within a round, which narrows the paired ratios (docs/performance.md).
//!
//! With `--restarts K`, the rounds are split into K segments, each on freshly started
//! server processes (the stack's rate is calibrated once): two identical server
//! processes differ by up to ~1.5 % for their whole life, so a single set of
//! processes biases every round alike. The interval then resamples segments, then
//! rounds within them, and the JSON lists each segment's median
//! (`ratio_MODE_segments`).
//!
//! Every server runs from a copy of its executable of its own (in a temporary
//! directory, removed at the end): processes running one file share its code's pages
//! and cache lines, which biased modes sharing the load generator's file against the
//! others by up to 5 % (`Copies`). `--shared-binary` runs them from the files given,
//! as before.
//!
//! With `--compare BINARY` another build of this binary (an earlier commit's) serves
//! `--compare-mode` (default `baseline`) as one more mode, `compare`: a before/after
//! measured side by side, in the same rounds. `--after BINARY` has another build
//! serve `--compare-mode` itself, so that the same two builds can be run again with
//! their places swapped (the servers' places carry a bias of about 1 %). The JSON then has
//! `after_over_before`: per round, that mode's ratio to the stack over `compare`'s,
//! its median and interval (`_lo`, `_hi`) and each set's median (`_segments`).
//!
//! With `--modes baseline,baseline-nospans,baseline-nohooks` it runs `stack` and the
//! listed modes only (`--modes ablations`: every ablation; an unknown name is an error), including ablations of `baseline` (no tracing integration, no
//! `SpanProfileLayer`, no `SpanProfileProcessor`, no runtime hooks) that show where
//! spanprof's cost per request goes; `benches/scripts/callgrind_servers.py` counts the same
//! servers' instructions per function.
//!
//! `cargo run --release -p spanprof-bench --bin overhead -- --json --anchor benches/anchors/pyroscope-overhead/target/release/anchor-pyroscope-overhead [--rounds 15] [--round-secs 2] [--workloads json,checkout] [--plot docs/overhead.png]`

mod cli;
mod load;
mod plot;
mod serve;
mod stats;

use std::process::Command;

use bytes::Bytes;
use clap::Parser as _;
use spanprof_bench::print_json;

use cli::{Cli, RunArgs};
use load::{LoadOutcome, run_load};
use serve::{Copies, Server};
use stats::{Series, median, median_ci_segments};

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Some(cli::Command::Serve { mode, sink }) => serve::serve(&mode, &sink),
        Some(cli::Command::Load(args)) => load::load(&args),
        Some(cli::Command::HandlerCost) => serve::handler_cost(),
        None => run(&cli.run),
    }
}

/// The sink both profilers push to: answers everything 200 and forgets it. Returns
/// its URL; it serves from a thread of its own until the run exits.
fn start_sink() -> String {
    let sink_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = sink_rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(|_body: Bytes| async { "" });
    std::thread::spawn(move || {
        sink_rt.block_on(async move { axum::serve(listener, app).await.unwrap() })
    });
    url
}

fn run(args: &RunArgs) {
    let rounds = args.rounds;
    let secs = args.round_secs;
    let load_frac = args.load_fraction;
    let workloads = args.workloads.clone();
    let anchor = args
        .anchor
        .clone()
        .filter(|p| std::path::Path::new(p).exists());
    let compare = args.compare.clone();
    let compare_mode = args.compare_mode.clone();
    let after = args.after.clone();
    let quiet = args.json;
    let concurrent = args.concurrent;
    let restarts = args.restarts;
    assert!(
        (1..=rounds).contains(&restarts),
        "--restarts must be 1 to --rounds"
    );
    let exe = std::env::current_exe().unwrap();
    let sink = start_sink();
    let picked = args.picked_modes();
    // Each server runs from a file of its own (see `Copies`), unless `--shared-binary`.
    let copies = Copies::new(!args.shared_binary);
    let stack_at = picked.iter().position(|m| *m == "stack").unwrap();
    assert_eq!(stack_at, usize::from(picked[0] == "none"));
    // Every mode's server, started afresh for each of the `--restarts` segments.
    let start_servers = || -> Vec<Server> {
        let mut servers: Vec<Server> = picked
            .iter()
            .filter_map(|&mode| {
                if mode == "pyroscope" {
                    let path = anchor.as_ref()?;
                    let mut cmd = Command::new(copies.of(mode, path.as_ref()));
                    cmd.args(["--sink", &sink]);
                    return Some(Server::start(mode, cmd));
                }
                let path = match &after {
                    Some(after) if mode == compare_mode => std::path::Path::new(after),
                    _ => exe.as_path(),
                };
                let mut cmd = Command::new(copies.of(mode, path));
                cmd.args(["serve", "--mode", mode, "--sink", &sink]);
                Some(Server::start(mode, cmd))
            })
            .collect();
        if let Some(path) = &compare {
            let mut cmd = Command::new(copies.of("compare", path.as_ref()));
            cmd.args(["serve", "--mode", &compare_mode, "--sink", &sink]);
            servers.push(Server::start("compare", cmd));
        }
        servers
    };
    let warm_up = |servers: &[Server]| {
        for w in &workloads {
            for s in servers {
                run_load(&exe, &s.url, w, 1.0, ("--concurrency", 8.0));
            }
        }
    };
    let mut servers = start_servers();
    if anchor.is_none() {
        eprintln!("no --anchor binary: the pyroscope-rs mode is left out");
    }

    // Warm every server up, then find the stack server's saturation per workload.
    warm_up(&servers);
    let mut rates = Vec::new();
    for w in &workloads {
        let sat = run_load(
            &exe,
            &servers[stack_at].url,
            w,
            3.0,
            ("--concurrency", 32.0),
        );
        let saturation = sat.requests / 3.0;
        let rate = (saturation * load_frac).max(1.0);
        if !quiet {
            eprintln!(
                "{w}: stack saturates at {saturation:.0} req/s; open-loop rate {rate:.0} req/s"
            );
        }
        rates.push((saturation, rate));
    }

    let mut series: Vec<Vec<Series>> =
        vec![vec![Series::default(); servers.len()]; workloads.len()];
    // Which segment (set of server processes) each round ran on.
    let segment_of = |round: usize| round * restarts / rounds;
    for round in 0..rounds {
        if round > 0 && segment_of(round) != segment_of(round - 1) {
            // Fresh processes: two identical servers differ by up to ~1.5 % for as
            // long as they live (layout, placement), so one set of processes biases
            // every round alike; several sets average that out.
            drop(std::mem::take(&mut servers));
            servers = start_servers();
            warm_up(&servers);
        }
        for (wi, w) in workloads.iter().enumerate() {
            let n = servers.len();
            if concurrent {
                // Every server at once, each at 1/n of the rate: whatever else the
                // machine does in this window, every mode shares it.
                let before: Vec<_> = servers
                    .iter_mut()
                    .map(|s| (s.cpu_by_thread(), s.cpu_ns()))
                    .collect();
                let rate = rates[wi].1 / n as f64;
                let outcomes: Vec<LoadOutcome> = std::thread::scope(|scope| {
                    let loads: Vec<_> = servers
                        .iter()
                        .map(|s| {
                            let (exe, url) = (&exe, &s.url);
                            scope.spawn(move || run_load(exe, url, w, secs, ("--rate", rate)))
                        })
                        .collect();
                    loads.into_iter().map(|h| h.join().unwrap()).collect()
                });
                for (si, (o, b)) in outcomes.into_iter().zip(before).enumerate() {
                    let e = &mut series[wi][si];
                    e.record(&mut servers[si], b, o, round, w, quiet);
                }
                continue;
            }
            for k in 0..n {
                let si = (round + k) % n;
                let s = &mut servers[si];
                let before = (s.cpu_by_thread(), s.cpu_ns());
                let o = run_load(&exe, &s.url, w, secs, ("--rate", rates[wi].1));
                series[wi][si].record(s, before, o, round, w, quiet);
            }
        }
    }

    // The median of per-round values `v` as `key`, its interval as `key_lo` and
    // `key_hi`, and each set of processes' median as `key_segments`.
    let insert_median_ci =
        |m: &mut serde_json::Map<String, serde_json::Value>, key: &str, v: &[f64]| {
            let segments: Vec<usize> = (0..v.len()).map(segment_of).collect();
            let (med, lo, hi) = median_ci_segments(v, &segments);
            let per_segment: Vec<f64> = (0..restarts)
                .map(|k| {
                    let in_k: Vec<f64> = v
                        .iter()
                        .zip(&segments)
                        .filter(|(_, sg)| **sg == k)
                        .map(|(x, _)| *x)
                        .collect();
                    median(&in_k)
                })
                .collect();
            m.insert(format!("{key}_segments"), per_segment.into());
            m.insert(key.into(), med.into());
            m.insert(format!("{key}_lo"), lo.into());
            m.insert(format!("{key}_hi"), hi.into());
            (med, lo, hi)
        };
    let mut out = serde_json::Map::new();
    let mut plot_rows = Vec::new();
    for (wi, w) in workloads.iter().enumerate() {
        let mut m = serde_json::Map::new();
        m.insert("saturation_rps".into(), rates[wi].0.into());
        m.insert("rate_rps".into(), rates[wi].1.into());
        let stack = series[wi][stack_at].cpu_us_per_req.clone();
        let mut ratios = Vec::new();
        for (si, s) in servers.iter().enumerate() {
            let e = &series[wi][si];
            let name = s.mode;
            m.insert(
                format!("cpu_per_req_{name}"),
                median(&e.cpu_us_per_req).into(),
            );
            m.insert(format!("p50_us_{name}"), median(&e.p50_us).into());
            m.insert(format!("p99_us_{name}"), median(&e.p99_us).into());
            m.insert(
                format!("requests_per_round_{name}"),
                median(&e.requests).into(),
            );
            m.insert(format!("errors_{name}"), e.errors.into());
            // Where the CPU per request went, by thread name (median over rounds).
            let by_thread: serde_json::Map<String, serde_json::Value> = e
                .by_thread
                .iter()
                .map(|(t, v)| (t.clone(), median(v).into()))
                .collect();
            m.insert(format!("cpu_per_req_by_thread_{name}"), by_thread.into());
            m.insert(format!("skipped_{name}"), e.skipped.into());
            if si == stack_at {
                continue;
            }
            let r: Vec<f64> = e
                .cpu_us_per_req
                .iter()
                .zip(&stack)
                .map(|(a, b)| a / b)
                .collect();
            let (med, lo, hi) = insert_median_ci(&mut m, &format!("ratio_{name}"), &r);
            m.insert(format!("ratio_{name}_rounds"), r.clone().into());
            ratios.push((name, med, lo, hi, r));
        }
        // A before/after run: per round, this build's ratio over the earlier build's,
        // so whatever the machine did in a round cancels out of the quotient.
        let rounds_of = |mode: &str| ratios.iter().find(|r| r.0 == mode).map(|r| &r.4);
        if let (Some(after), Some(before)) = (rounds_of(&compare_mode), rounds_of("compare")) {
            let q: Vec<f64> = after.iter().zip(before).map(|(a, b)| a / b).collect();
            insert_median_ci(&mut m, "after_over_before", &q);
        }
        plot_rows.push((w.clone(), ratios));
        out.insert(w.clone(), m.into());
    }
    // The JSON workload's figures also at the top level, as issue 12 names them.
    if let Some(serde_json::Value::Object(first)) = out.get("json").cloned() {
        for (k, v) in first {
            if (k.starts_with("ratio_")
                || k.starts_with("cpu_per_req_")
                || k.starts_with("after_over_before"))
                && !k.ends_with("_rounds")
            {
                out.insert(k, v);
            }
        }
    }
    out.insert("rounds".into(), rounds.into());
    out.insert("round_secs".into(), secs.into());
    out.insert("load_fraction".into(), load_frac.into());
    out.insert("concurrent".into(), concurrent.into());
    out.insert("restarts".into(), restarts.into());
    out.insert("own_copies".into(), copies.dir.is_some().into());
    // Which build served what, so that a run with the builds' places swapped reads
    // back unambiguously (`after_over_before` is then `--after`'s over `--compare`'s).
    let path_of = |p: Option<&str>| p.map_or(serde_json::Value::Null, |p| p.into());
    out.insert(
        "after_binary".into(),
        after
            .as_deref()
            .map_or_else(|| exe.display().to_string().into(), |p| p.into()),
    );
    out.insert("compare_binary".into(), path_of(compare.as_deref()));
    let ran: Vec<&str> = picked
        .iter()
        .copied()
        .filter(|m| *m != "pyroscope" || anchor.is_some())
        .collect();
    out.insert("modes".into(), ran.into());
    out.insert(
        "cpu_unit".into(),
        "µs of server process CPU per request".into(),
    );
    if let Some(path) = &args.plot {
        match plot::draw(path, &plot_rows) {
            Ok(()) => eprintln!("plot: {path}"),
            Err(e) => eprintln!("plot not drawn: {e}"),
        }
    }
    // Where each server's CPU went over the whole run (warm-up and calibration
    // included), by thread name.
    let threads: serde_json::Map<String, serde_json::Value> = servers
        .iter()
        .map(|s| {
            let by_name: serde_json::Map<String, serde_json::Value> = s
                .cpu_by_thread()
                .into_iter()
                .map(|(k, v)| (k, v.into()))
                .collect();
            (s.mode.to_owned(), by_name.into())
        })
        .collect();
    out.insert("cpu_seconds_by_thread".into(), threads.into());
    drop(servers);
    print_json(out.into());
}
