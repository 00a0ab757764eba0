//! The per-sample floor probes (`spanprof_core::testing::sample_floor`, used by
//! `rate_sweep --floor`) deliver samples: a busy thread at 1 kHz gets signals in the
//! empty handler (re-armed after each one), and records in the kernel ring. Counts,
//! not timings: each probe must see at least a fifth of the samples 150 ms of CPU
//! asks for (a handler that failed to re-arm would see one).
#![cfg(spanprof_sampler)]

use std::hint::black_box;
use std::time::Duration;

use spanprof_core::testing::sample_floor::{
    RingProbe, SignalProbe, install_empty_handler, uninstall_empty_handler,
};

const PERIOD_NS: u64 = 1_000_000;

/// Burns `cpu` of this thread's CPU time.
fn burn(cpu: Duration) -> u64 {
    let start = spanprof_core::thread_cpu_time();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while spanprof_core::thread_cpu_time() - start < cpu {
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        x = black_box(x);
    }
    x
}

#[test]
fn both_floor_probes_count_samples() {
    install_empty_handler().expect("install the empty handler");
    let signal = SignalProbe::start(PERIOD_NS).expect("perf event (perf_event_paranoid <= 2)");
    burn(Duration::from_millis(150));
    let signalled = signal.samples();
    drop(signal);
    uninstall_empty_handler();
    assert!(
        signalled >= 30,
        "the empty handler counted {signalled} signals in 150 ms of CPU at 1 kHz"
    );

    let ring = RingProbe::start(PERIOD_NS).expect("perf ring");
    burn(Duration::from_millis(150));
    let recorded = ring.samples();
    drop(ring);
    assert!(
        recorded >= 30,
        "the kernel ring recorded {recorded} samples in 150 ms of CPU at 1 kHz"
    );
}

#[test]
fn the_pause_resume_probe_enables_the_event_and_times_every_call() {
    // The probe fails if its ENABLE did nothing (the kernel reports the event's
    // enabled time); each figure is a mean over real calls, so none can be zero.
    let cost = spanprof_core::testing::sample_floor::pause_resume_cost(2_000)
        .expect("perf event (perf_event_paranoid <= 2)");
    for (name, us) in [
        ("enable_disable_pair_us", cost.enable_disable_pair_us),
        ("thread_cpu_clock_us", cost.thread_cpu_clock_us),
        ("plain_syscall_us", cost.plain_syscall_us),
    ] {
        assert!(us.is_finite() && us > 0.0, "{name} = {us}");
    }
}
