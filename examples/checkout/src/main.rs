//! `checkout`: spanprof's example shop.
//!
//! ```text
//! checkout [--listen ADDR] [--viewer ADDR] [--load DURATION] [--stop-deadline D]
//!                                                run the shop (and load it for DURATION, default 20s)
//! checkout load --target URL [--duration D]      drive another instance
//! ```
//!
//! SIGINT (Ctrl-C) or SIGTERM, at any time: stop sending load, stop accepting, finish
//! the requests in flight, flush the last profile interval and the spans, exit 0. A
//! second signal exits at once.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use checkout::stop::Stop;
use checkout::telemetry::{self, Telemetry};
use checkout::{ShopConfig, load, stop};
use spanprof::Profiler;
use spanprof::export::{
    OtlpProfilesConfig, OtlpProfilesExporter, ProfileSource, PyroscopeConfig, PyroscopeExporter,
    Sinks, redact_url,
};
use spanprof_viewer::RecentSpans;
use tokio::signal::unix::{Signal, SignalKind, signal};

const USAGE: &str = "usage:
  checkout [--listen ADDR] [--viewer ADDR] [--load DURATION] [--stop-deadline D]
      run the shop: its API on ADDR (default 127.0.0.1:3000; inventory and payments on
      loopback), the viewer on --viewer (loopback only, default 127.0.0.1:6060);
      load it for DURATION (default 20s, 0 for none); after a signal, stop within D
      (default 8s: inside docker stop's 10 s)
  checkout load --target URL [--duration D] [--concurrency N]
      drive another instance (default 20s, 4 clients)
SIGINT (Ctrl-C) or SIGTERM stops it cleanly, during the load too.";

/// How long a stop may take in all, from the signal to the exit, unless
/// `--stop-deadline` says otherwise: inside `docker stop`'s default grace period of
/// 10 s (and Kubernetes' 30 s). Requests in flight may take half of it to finish (open
/// profile captures answer at once); the profile sinks and the spans then share what
/// is left, flushing at the same time.
const STOP_DEADLINE: Duration = Duration::from_secs(8);

fn duration(flag: &str, v: &str) -> Result<Duration, String> {
    spanprof::tower::parse_duration(v).map_err(|e| format!("{flag}: {e}"))
}

fn address(flag: &str, v: &str) -> Result<std::net::SocketAddr, String> {
    v.parse()
        .map_err(|_| format!("{flag}: `{v}` is not an address like 127.0.0.1:3000"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("checkout: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// SIGINT and SIGTERM, listened for from the start.
struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    fn listen() -> Result<Signals, String> {
        let on = |kind| signal(kind).map_err(|e| format!("cannot listen for signals: {e}"));
        Ok(Signals {
            int: on(SignalKind::interrupt())?,
            term: on(SignalKind::terminate())?,
        })
    }

    /// The next signal's name.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }

    /// A stop signal fired by the first of them; after it, a second one exits at
    /// once.
    fn into_stop(mut self) -> (Stop, tokio::sync::oneshot::Receiver<&'static str>) {
        let (trigger, stop) = stop::channel();
        let (name_tx, name_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let first = self.next().await;
            trigger.stop();
            let _ = name_tx.send(first);
            let second = self.next().await;
            eprintln!("checkout: {second} again, exiting without waiting");
            std::process::exit(130);
        });
        (stop, name_rx)
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let mut it = args.iter();
    if args.first().map(String::as_str) == Some("load") {
        it.next();
        let (mut target, mut dur, mut conc) = (None, Duration::from_secs(20), 4usize);
        while let Some(a) = it.next() {
            let mut val = || {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{a} needs a value"))
            };
            match a.as_str() {
                "--target" => target = Some(val()?),
                "--duration" => dur = duration("--duration", &val()?)?,
                "--concurrency" => {
                    conc = val()?
                        .parse()
                        .map_err(|_| "--concurrency: not a number".to_owned())?
                }
                "-h" | "--help" => return Err("help".into()),
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        let target = target.ok_or("load needs --target URL")?;
        let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
        let r = rt.block_on(async {
            let (stop, _) = Signals::listen()?.into_stop();
            Ok::<_, String>(load::run(&target, dur, conc.max(1), true, stop).await)
        })?;
        println!(
            "{} requests, {} errors, {} large carts",
            r.requests, r.errors, r.large_carts
        );
        return Ok(());
    }
    let mut cfg = ShopConfig::default();
    let mut load_for = Duration::from_secs(20);
    let mut stop_deadline = STOP_DEADLINE;
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value"))
        };
        match a.as_str() {
            "--listen" => cfg.listen = address("--listen", &val()?)?,
            "--viewer" => {
                cfg.viewer = address("--viewer", &val()?)?;
                if !cfg.viewer.ip().is_loopback() {
                    return Err(format!(
                        "--viewer: {} is not a loopback address; the viewer and the profile \
                         endpoint show code, routes and timings, so they stay on loopback \
                         (from another machine: ssh -L 6060:127.0.0.1:6060 this-host)",
                        cfg.viewer
                    ));
                }
            }
            "--load" => load_for = duration("--load", &val()?)?,
            "--stop-deadline" => {
                stop_deadline = duration("--stop-deadline", &val()?)?;
                if stop_deadline < Duration::from_secs(1) {
                    return Err("--stop-deadline: at least 1s, to flush the last spans".into());
                }
            }
            "-h" | "--help" => return Err("help".into()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }

    let profiler = Profiler::builder().start().map_err(|e| e.to_string())?;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder.enable_all().build().map_err(|e| e.to_string())?;
    let handle = profiler.clone();
    rt.block_on(serve(cfg, load_for, stop_deadline, profiler))?;
    handle.stop();
    Ok(())
}

async fn serve(
    cfg: ShopConfig,
    load_for: Duration,
    stop_deadline: Duration,
    profiler: Profiler,
) -> Result<(), String> {
    // From the very start, so a signal during the start-up or the load is not lost.
    let (stop, signal_name) = Signals::listen()?.into_stop();
    let spans = RecentSpans::new(spanprof_viewer::DEFAULT_MAX_TRACES);
    let t = Telemetry::from_env()?;
    let telemetry::Tracing { provider, exports } = telemetry::init(&spans, &t)?;
    let mut sinks = Sinks::new();
    match PyroscopeConfig::from_env() {
        Ok(Some(c)) => {
            // The configuration prints its endpoint with any credentials redacted.
            println!("profiles      {c}");
            sinks.push(
                PyroscopeExporter::start(c, ProfileSource::profiler(&profiler))
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok(None) => {}
        Err(e) => return Err(e.to_string()),
    }
    // Unless told otherwise, profiles use the traces' protocol and endpoint.
    let traces_protocol = t.otlp_protocol.as_str().to_owned();
    let otlp_profiles = OtlpProfilesConfig::from_lookup(|k| {
        std::env::var(k)
            .ok()
            .or_else(|| (k == "OTEL_EXPORTER_OTLP_PROTOCOL").then(|| traces_protocol.clone()))
    });
    match otlp_profiles {
        Ok(Some(c)) => {
            println!("profiles      {c} (experimental)");
            sinks.push(
                OtlpProfilesExporter::start(c, ProfileSource::profiler(&profiler))
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok(None) => {}
        Err(e) => return Err(e.to_string()),
    }
    if let Some(endpoint) = &t.otlp_endpoint {
        println!(
            "traces        OTLP ({}) to {} ({})",
            t.otlp_protocol.as_str(),
            redact_url(endpoint),
            t.trace_filter
        );
    }
    let shop = checkout::start(&cfg, profiler.clone(), spans)
        .await
        .map_err(|e| format!("--listen {} / --viewer {}: {e}", cfg.listen, cfg.viewer))?;
    let caps = profiler.capabilities();
    println!(
        "checkout API  http://{}  (inventory gRPC {}, payments http://{})",
        shop.api, shop.inventory, shop.payments
    );
    println!("viewer        {}", shop.viewer_url());
    println!(
        "profiler      {} Hz baseline, {} Hz for hot requests via {}",
        caps.baseline_hz,
        caps.effective_high_hz,
        caps.mechanism.as_str()
    );
    if !shop.api.ip().is_loopback() {
        tracing::warn!(
            "the checkout API listens on {}, reachable from other machines; the viewer ({}), \
             /debug/spanprof/profile, inventory ({}) and payments ({}) stay on loopback",
            shop.api,
            shop.viewer,
            shop.inventory,
            shop.payments
        );
    }
    if !load_for.is_zero() {
        println!(
            "load          {}s of mixed traffic (a few large carts are slow on purpose)",
            load_for.as_secs()
        );
        let r = load::run(
            &format!("http://{}", shop.api),
            load_for,
            4,
            true,
            stop.clone(),
        )
        .await;
        println!(
            "load {}  {} requests, {} errors, {} large carts",
            if stop.is_stopped() {
                "stopped"
            } else {
                "done   "
            },
            r.requests,
            r.errors,
            r.large_carts
        );
    }
    if !stop.is_stopped() {
        println!(
            "\nopen the viewer, pick the slowest POST /checkout trace, then its span. Ctrl-C to stop."
        );
    }
    stop.stopped().await;
    let end = Instant::now() + stop_deadline;
    let name = signal_name.await.unwrap_or("signal");

    let drained = shop.shutdown(stop_deadline / 2).await;
    let flushed = tokio::task::spawn_blocking(move || {
        let left = move || end.saturating_duration_since(Instant::now());
        profiler.flush();
        // The spans' flush ends a little before the provider stops waiting for it.
        if let Some(spans) = &exports {
            spans.shutdown_by(end - Duration::from_millis(200).min(left()));
        }
        // Every sink sends its last interval while the spans flush: one deadline.
        let sinks = std::thread::spawn(move || sinks.shutdown(left()));
        let result = provider.shutdown_with_timeout(left());
        let profiles: Vec<String> = sinks
            .join()
            .unwrap_or_default()
            .into_iter()
            .map(|(name, s)| format!("{name}: {} sent, {} dropped", s.sent, s.dropped()))
            .collect();
        // "Flushed" only if every span ended was sent.
        let spans = match (result, exports.map(|h| h.stats())) {
            (Ok(()), None) => "spans kept in the viewer only".to_owned(),
            (Ok(()), Some(s)) if s.dropped() == 0 && s.pending == 0 => {
                format!("spans flushed ({} sent)", s.sent)
            }
            (result, Some(s)) => format!(
                "spans: {} sent, {} lost{}",
                s.sent,
                s.dropped() + s.pending,
                result.err().map(|e| format!(" ({e})")).unwrap_or_default()
            ),
            (Err(e), None) => format!("spans not flushed: {e}"),
        };
        (profiles, spans)
    })
    .await
    .map_err(|e| e.to_string())?;
    let (profiles, spans) = flushed;
    println!(
        "stopped       {name}: requests {} in {:.1} s; profiles {}; {spans}",
        if drained.in_time {
            "drained"
        } else {
            "cut at the deadline"
        },
        drained.took.as_secs_f64(),
        if profiles.is_empty() {
            "kept in the viewer only".to_owned()
        } else {
            format!("flushed ({})", profiles.join(", "))
        }
    );
    Ok(())
}
