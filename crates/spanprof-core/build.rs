//! Decides whether the CPU sampler and the OpenTelemetry thread context are
//! compiled in, and notes which environment variable (if any) gave the build its
//! rustc flags.
//!
//! The sampler (timers, perf events, the signal handler) is Linux-only. It is
//! compiled in as `cfg(spanprof_sampler)` on Linux, unless the build sets
//! `--cfg spanprof_force_unsupported`: that builds the stand-in used on every other
//! target, so CI can compile and test it on the only target installed here.
//!
//! The thread context (feature `otel-thread-ctx`) is `cfg(spanprof_otel_ctx)`: Linux
//! on x86_64 only, where the slot is the exported TLS variable `otel_thread_ctx_v1`
//! (`src/sys/thread_ctx.rs`); elsewhere the feature logs that it does nothing.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(spanprof_sampler)");
    println!("cargo::rustc-check-cfg=cfg(spanprof_force_unsupported)");
    println!("cargo::rustc-check-cfg=cfg(spanprof_otel_ctx)");
    println!("cargo::rerun-if-changed=build.rs");
    // Which environment variable gave this build its rustc flags, if one did (the
    // set-up warnings name it: it replaces `.cargo/config.toml`'s `build.rustflags`).
    // RUSTFLAGS and CARGO_ENCODED_RUSTFLAGS are read by the crate itself
    // (`option_env!`: cargo hides RUSTFLAGS from build scripts); the target's own
    // variable is named here, where the target is known.
    if let Ok(target) = std::env::var("TARGET") {
        let var = format!(
            "CARGO_TARGET_{}_RUSTFLAGS",
            target.to_uppercase().replace(['-', '.'], "_")
        );
        println!("cargo::rerun-if-env-changed={var}");
        if std::env::var_os(&var).is_some() {
            println!("cargo::rustc-env=SPANPROF_TARGET_RUSTFLAGS_VAR={var}");
        }
    }
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let x86_64 = std::env::var("CARGO_CFG_TARGET_ARCH").is_ok_and(|a| a == "x86_64");
    let forced = std::env::var_os("CARGO_CFG_SPANPROF_FORCE_UNSUPPORTED").is_some();
    if linux && !forced {
        println!("cargo::rustc-cfg=spanprof_sampler");
    }
    let otel = std::env::var_os("CARGO_FEATURE_OTEL_THREAD_CTX").is_some();
    if otel && linux && x86_64 && !forced {
        println!("cargo::rustc-cfg=spanprof_otel_ctx");
    }
}
