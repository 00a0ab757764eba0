//! The pyroscope-rs mode of spanprof's `overhead` benchmark: the same service and the
//! same "user's existing stack" as `spanprof-bench`'s `overhead serve --mode stack`
//! (the same source files of `spanprof-workloads`, included by path), plus pyroscope-rs 2.1.5's agent with
//! its pprof-rs backend at 100 Hz, each request tagged with its route through
//! `PyroscopeAgent::tag_wrapper` (set as the handler starts, removed as it ends: its
//! documented per-request use), pushing to the sink given with `--sink` every 10 s.
//!
//! Run by `overhead` (it reads `port N` from standard output, then asks for the CPU
//! time with one line on standard input per reading); built with
//! `cd benches/anchors/pyroscope-overhead && cargo build --release`.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use pyroscope::backend::{BackendConfig, PprofConfig, pprof_backend};
use pyroscope::pyroscope::PyroscopeAgentBuilder;
use tower_http::trace::TraceLayer;
use tracing_subscriber::prelude::*;

#[path = "../../../../workloads/src/shop.rs"]
#[allow(dead_code)]
mod shop;

#[path = "../../../../workloads/src/service.rs"]
#[allow(dead_code)]
mod service;

fn process_cpu_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .expect("process CPU clock");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sink = args
        .iter()
        .position(|a| a == "--sink")
        .and_then(|i| args.get(i + 1))
        .expect("--sink URL")
        .clone();

    let agent = PyroscopeAgentBuilder::new(
        &sink,
        "overhead-anchor",
        100,
        "pyroscope-rs",
        "2.1.5",
        pprof_backend(PprofConfig { sample_rate: 100 }, BackendConfig::default()),
    )
    .build()
    .expect("pyroscope agent")
    .start()
    .expect("start the pyroscope agent");
    let (add, remove) = agent.tag_wrapper();
    let hooks = service::RequestHooks {
        enter: Box::new(move |route| {
            let _ = add("route".to_owned(), route.to_owned());
        }),
        exit: Box::new(move |route| {
            let _ = remove("route".to_owned(), route.to_owned());
        }),
    };
    let _ = service::REQUEST_HOOKS.set(hooks);

    let provider = SdkTracerProvider::builder()
        .with_span_processor(service::batch_processor())
        .build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("overhead")))
        .init();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    service::serve(
        &rt,
        service::routes().layer(TraceLayer::new_for_http()),
        process_cpu_ns,
    );
    drop(provider);
    let _ = agent.stop();
}
