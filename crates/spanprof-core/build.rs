//! Decides whether the CPU sampler is compiled in.
//!
//! The sampler (timers, perf events, the signal handler) is Linux-only. It is
//! compiled in as `cfg(spanprof_sampler)` on Linux, unless the build sets
//! `--cfg spanprof_force_unsupported`: that builds the stand-in used on every other
//! target, so CI can compile and test it on the only target installed here.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(spanprof_sampler)");
    println!("cargo::rustc-check-cfg=cfg(spanprof_force_unsupported)");
    println!("cargo::rerun-if-changed=build.rs");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let forced = std::env::var_os("CARGO_CFG_SPANPROF_FORCE_UNSUPPORTED").is_some();
    if linux && !forced {
        println!("cargo::rustc-cfg=spanprof_sampler");
    }
}
