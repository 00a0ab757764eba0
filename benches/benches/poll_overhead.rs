//! The cost of spanprof's label push+pop around a poll, against a bare poll.
//!
//! `cargo bench -p spanprof-bench --bench poll_overhead [--features otel-thread-ctx]`
//! (with the feature the slot is the exported `otel_thread_ctx_v1` and each label
//! record carries its OpenTelemetry thread context record).

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use spanprof::{SpanLabels, WithSpanLabels};

/// A future that is never ready: every poll does the same tiny amount of work.
struct Spin(u64);

impl Future for Spin {
    type Output = ();
    fn poll(mut self: std::pin::Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        self.0 = black_box(self.0.wrapping_add(1));
        Poll::Pending
    }
}

fn bench(c: &mut Criterion) {
    let labels = SpanLabels::builder()
        .trace_id(1)
        .span_id(2)
        .span_name("bench")
        .build();
    let mut cx = Context::from_waker(Waker::noop());
    let mut g = c.benchmark_group("poll");
    g.bench_function("bare", |b| {
        let mut f = pin!(Spin(0));
        b.iter(|| black_box(f.as_mut().poll(&mut cx)))
    });
    g.bench_function("labelled", |b| {
        let mut f = pin!(Spin(0).with_span_labels(labels.clone()));
        b.iter(|| black_box(f.as_mut().poll(&mut cx)))
    });
    g.bench_function("push_pop", |b| {
        b.iter(|| {
            let _g = black_box(&labels).enter();
        })
    });
    // Labels whose span has ended (a task that outlived its request): the poll path
    // reads the same state byte, so this should cost what a live span costs.
    let ended = SpanLabels::builder()
        .trace_id(1)
        .span_id(3)
        .span_name("ended")
        .build();
    ended.end();
    g.bench_function("labelled_ended", |b| {
        let mut f = pin!(Spin(0).with_span_labels(ended.clone()));
        b.iter(|| black_box(f.as_mut().poll(&mut cx)))
    });
    g.finish();
    // What a request pays once for its record (the OpenTelemetry thread context
    // record is filled here, not per poll).
    let route = spanprof::NameId::intern("/api/orders");
    let name = spanprof::NameId::intern("POST /api/orders");
    c.bench_function("labels/build", |b| {
        let mut id = 1u64;
        b.iter(|| {
            id += 1;
            black_box(
                SpanLabels::builder()
                    .trace_id(u128::from(id))
                    .span_id(id)
                    .trace_flags(1)
                    .span_name_id(name)
                    .route_id(route)
                    .build(),
            )
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
