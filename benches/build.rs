//! With the feature `otel-thread-ctx`, the benches' executables export the
//! OpenTelemetry thread context's TLS variable, as a service must
//! (docs/ebpf-profiler.md).
fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_OTEL_THREAD_CTX").is_some() {
        println!("cargo::rustc-link-arg=-Wl,--export-dynamic-symbol=otel_thread_ctx_v1");
    }
}
