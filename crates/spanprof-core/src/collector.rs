//! The collector thread: drains every thread's sample ring, symbolizes new stacks
//! off the hot path and feeds the store.

use std::collections::HashMap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::intern::NameId;
use crate::profile::{Hotness, Stack};
use crate::store::{IncomingLabels, IncomingSample, SpanProfileStore};
use crate::symbolize::{AddressSymbolizer, TRUNCATED_ADDR};
use crate::sys::ring::{FLAG_LABELLED, FLAG_TRUNCATED, RawSample};

enum Command {
    Flush(mpsc::SyncSender<()>),
    Stop,
}

pub(crate) struct Collector {
    tx: mpsc::Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

impl Collector {
    pub(crate) fn start(store: SpanProfileStore, interval: Duration) -> Collector {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("spanprof-collector".into())
            .spawn(move || run(store, interval, rx))
            .expect("spawn the spanprof collector thread");
        Collector {
            tx,
            thread: Some(thread),
        }
    }

    pub(crate) fn flush(&self) {
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        if self.tx.send(Command::Flush(done_tx)).is_ok() {
            let _ = done_rx.recv();
        }
    }

    pub(crate) fn stop(mut self) {
        let _ = self.tx.send(Command::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.tx.send(Command::Stop);
    }
}

fn run(store: SpanProfileStore, interval: Duration, rx: mpsc::Receiver<Command>) {
    let mut state = CollectorState {
        symbolizer: AddressSymbolizer::new(),
        raw: Vec::with_capacity(1024),
        stacks: HashMap::new(),
    };
    loop {
        match rx.recv_timeout(interval) {
            Ok(Command::Flush(done)) => {
                state.drain(&store);
                let _ = done.send(());
            }
            Ok(Command::Stop) | Err(RecvTimeoutError::Disconnected) => {
                state.drain(&store);
                return;
            }
            Err(RecvTimeoutError::Timeout) => state.drain(&store),
        }
    }
}

struct CollectorState {
    symbolizer: AddressSymbolizer,
    raw: Vec<RawSample>,
    /// Symbolized stacks by raw addresses (bounded: cleared when large).
    stacks: HashMap<Box<[u64]>, Stack>,
}

const MAX_STACK_CACHE: usize = 100_000;

impl CollectorState {
    fn drain(&mut self, store: &SpanProfileStore) {
        self.raw.clear();
        {
            let mut reg = crate::sampler::registry();
            for t in &reg.threads {
                t.ring.drain(&mut self.raw);
            }
            crate::sampler::prune_retired(&mut reg);
        }
        if self.raw.is_empty() {
            return;
        }
        if self.stacks.len() > MAX_STACK_CACHE {
            self.stacks.clear();
        }
        let keys: Vec<Vec<u64>> = self
            .raw
            .iter()
            .map(|s| {
                let mut v = s.frames().to_vec();
                if s.flags & FLAG_TRUNCATED != 0 {
                    v.push(TRUNCATED_ADDR);
                }
                v
            })
            .collect();
        // Symbolize outside the store's lock, so queries never wait for DWARF parsing.
        for k in &keys {
            if !self.stacks.contains_key(k.as_slice()) {
                let s = self.symbolizer.stack(k);
                self.stacks.insert(k.as_slice().into(), s);
            }
        }
        let samples: Vec<IncomingSample<'_>> = self
            .raw
            .iter()
            .zip(&keys)
            .map(|(s, addrs)| IncomingSample {
                labels: (s.flags & FLAG_LABELLED != 0).then_some(IncomingLabels {
                    trace_id: s.trace_id,
                    span_id: s.span_id,
                    parent_span_id: s.parent_span_id,
                    root_span_id: s.root_span_id,
                    span_name: NameId(s.span_name),
                    route: NameId(s.route),
                    hot: Hotness::from_u8(s.hot),
                }),
                addrs,
                time_ns: s.time_ns,
                weight_ns: s.weight_ns,
            })
            .collect();
        let symbolizer = &mut self.symbolizer;
        let cache = &self.stacks;
        store.insert(&samples, |addrs| match cache.get(addrs) {
            Some(s) => s.clone(),
            None => symbolizer.stack(addrs),
        });
    }
}
