//! `checkout`: spanprof's example shop.
//!
//! ```text
//! checkout [--listen ADDR] [--load DURATION]     run the shop (and load it for DURATION, default 20s)
//! checkout load --target URL [--duration D]      drive another instance
//! ```

use std::process::ExitCode;
use std::time::Duration;

use checkout::{ShopConfig, load, telemetry};
use spanprof::Profiler;
use spanprof::export::{
    OtlpProfilesConfig, OtlpProfilesExporter, ProfileSource, PyroscopeConfig, PyroscopeExporter,
};
use spanprof_viewer::RecentSpans;

const USAGE: &str = "usage:
  checkout [--listen ADDR] [--load DURATION]   run the shop on ADDR (default 127.0.0.1:3000);
                                               load it for DURATION (default 20s, 0 for none)
  checkout load --target URL [--duration D] [--concurrency N]
                                               drive another instance (default 20s, 4 clients)";

fn duration(flag: &str, v: &str) -> Result<Duration, String> {
    spanprof::tower::parse_duration(v).map_err(|e| format!("{flag}: {e}"))
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
        let r = rt.block_on(load::run(&target, dur, conc.max(1), true));
        println!(
            "{} requests, {} errors, {} large carts",
            r.requests, r.errors, r.large_carts
        );
        return Ok(());
    }
    let mut cfg = ShopConfig::default();
    let mut load_for = Duration::from_secs(20);
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value"))
        };
        match a.as_str() {
            "--listen" => {
                let v = val()?;
                cfg.listen = v.parse().map_err(|_| {
                    format!("--listen: `{v}` is not an address like 127.0.0.1:3000")
                })?;
            }
            "--load" => load_for = duration("--load", &val()?)?,
            "-h" | "--help" => return Err("help".into()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }

    let profiler = Profiler::builder().start().map_err(|e| e.to_string())?;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    spanprof::install_runtime_hooks(&mut builder);
    let rt = builder.enable_all().build().map_err(|e| e.to_string())?;
    let handle = profiler.clone();
    rt.block_on(async move {
        let spans = RecentSpans::new(spanprof_viewer::DEFAULT_MAX_TRACES);
        let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "checkout".into());
        let provider = telemetry::init(&spans, &service, true);
        let mut sinks = Vec::new();
        match PyroscopeConfig::from_env() {
            Ok(Some(c)) => {
                println!("profiles: Pyroscope at {}", c.server);
                let e = PyroscopeExporter::start(c, ProfileSource::profiler(&profiler, false))
                    .map_err(|e| e.to_string())?;
                sinks.push(Box::new(move || {
                    let _ = e.shutdown(Duration::from_secs(5));
                }) as Box<dyn FnOnce() + Send>);
            }
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        // Traces go over OTLP/gRPC here (opentelemetry-otlp's tonic exporter); unless
        // told otherwise, profiles use the same protocol and endpoint.
        let otlp_profiles = OtlpProfilesConfig::from_lookup(|k| {
            std::env::var(k)
                .ok()
                .or_else(|| (k == "OTEL_EXPORTER_OTLP_PROTOCOL").then(|| "grpc".to_owned()))
        });
        match otlp_profiles {
            Ok(Some(c)) => {
                println!("profiles: OTLP (experimental) to {}", c.endpoint);
                let e = OtlpProfilesExporter::start(c, ProfileSource::profiler(&profiler, false))
                    .map_err(|e| e.to_string())?;
                sinks.push(Box::new(move || {
                    let _ = e.shutdown(Duration::from_secs(5));
                }));
            }
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        let shop = checkout::start(&cfg, profiler.clone(), spans)
            .await
            .map_err(|e| format!("--listen {}: {e}", cfg.listen))?;
        let caps = profiler.capabilities();
        println!(
            "checkout API  http://{}  (inventory gRPC {}, payments http://{})",
            shop.api, shop.inventory, shop.payments
        );
        println!(
            "profiler      {} Hz baseline, {} Hz for hot requests via {}",
            caps.baseline_hz,
            caps.effective_high_hz,
            caps.mechanism.as_str()
        );
        if !load_for.is_zero() {
            println!(
                "load          {}s of mixed traffic (a few large carts are slow on purpose)",
                load_for.as_secs()
            );
            let r = load::run(&format!("http://{}", shop.api), load_for, 4, true).await;
            println!(
                "load done     {} requests, {} errors, {} large carts",
                r.requests, r.errors, r.large_carts
            );
        }
        println!("\nviewer        {}\n", shop.viewer_url());
        println!("open it, pick the slowest POST /checkout trace, then its span. Ctrl-C to stop.");
        let _ = tokio::signal::ctrl_c().await;
        for stop in sinks {
            tokio::task::spawn_blocking(stop).await.ok();
        }
        let _ = provider.shutdown();
        Ok(())
    })?;
    handle.stop();
    Ok(())
}
