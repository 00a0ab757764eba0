//! What a service with the feature `otel-thread-ctx` adds: its executables export
//! the OpenTelemetry thread context's TLS variable (docs/ebpf-profiler.md).
fn main() {
    println!("cargo::rustc-link-arg=-Wl,--export-dynamic-symbol=otel_thread_ctx_v1");
}
