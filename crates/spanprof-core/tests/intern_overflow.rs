//! The name interner at its bound: names past it read `(other)`, every one is
//! counted, and the first one logs one warning that names the fix. Its own test
//! binary: it lowers the process-wide bound and installs a global subscriber.

use std::sync::{Arc, Mutex};

use spanprof_core::{OVERFLOW_NAME, SpanLabels, intern_stats, set_max_names};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Keeps the message of every warning.
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Warnings {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() == Level::WARN {
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0.lock().unwrap().push(m.0);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn a_full_interner_counts_every_overflow_and_warns_once() {
    let warnings = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::set_global_default(Warnings(warnings.clone())).unwrap();
    let before = intern_stats();
    set_max_names(before.names + 10);
    let labels: Vec<SpanLabels> = (0..50)
        .map(|i| {
            SpanLabels::builder()
                .span_id(i + 1)
                .span_name(&format!("GET /user/{i}"))
                .build()
        })
        .collect();
    let stats = intern_stats();
    assert_eq!(stats.names, before.names + 10, "{stats:?}");
    assert_eq!(stats.overflowed, 40, "{stats:?}");
    assert_eq!(&*labels[0].span_name(), "GET /user/0");
    assert_eq!(&*labels[49].span_name(), OVERFLOW_NAME);
    let warnings = warnings.lock().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("templates") && warnings[0].contains("set_max_names"),
        "the warning names the fix: {}",
        warnings[0]
    );
}
