//! Spans: each span's samples by stack, oldest evicted first.

use std::sync::Arc;

use crate::profile::{Hotness, SampleLabels};

use super::*;

pub(super) struct SpanEntry {
    pub(super) labels: Arc<SampleLabels>,
    pub(super) seq: u64,
    pub(super) first_ns: u64,
    pub(super) last_ns: u64,
    pub(super) samples: u64,
    pub(super) cpu_ns: u64,
    pub(super) max_hot: Hotness,
    pub(super) stacks: FastMap<(u32, Hotness), Counts>,
}

impl State {
    pub(super) fn add_to_span(
        &mut self,
        l: &IncomingLabels,
        stack: u32,
        time_ns: u64,
        weight: u64,
        wall: bool,
    ) {
        if !self.spans.contains_key(&l.ids.span_id) {
            let seq = self.next_seq;
            self.next_seq += 1;
            self.span_order.push_back((l.ids.span_id, seq));
            self.bytes += SPAN_BYTES;
            self.spans.insert(
                l.ids.span_id,
                SpanEntry {
                    // Its `hot` is the first sample's; queries report `max_hot`.
                    labels: l.resolved.clone(),
                    seq,
                    first_ns: time_ns,
                    last_ns: time_ns,
                    samples: 0,
                    cpu_ns: 0,
                    max_hot: Hotness::Cold,
                    stacks: FastMap::default(),
                },
            );
        }
        let e = self.spans.get_mut(&l.ids.span_id).expect("inserted above");
        e.first_ns = e.first_ns.min(time_ns);
        e.last_ns = e.last_ns.max(time_ns);
        if !wall {
            e.samples += 1;
            e.cpu_ns += weight;
        }
        if (l.hot as u8) > (e.max_hot as u8) {
            e.max_hot = l.hot;
        }
        let key = (stack, l.hot);
        let is_new = !e.stacks.contains_key(&key);
        e.stacks.entry(key).or_default().add(weight, wall);
        if is_new {
            self.bytes += SPAN_STACK_BYTES;
            self.stack_ref(stack);
        }
    }

    pub(super) fn evict_oldest_span(&mut self) -> bool {
        while let Some((id, seq)) = self.span_order.pop_front() {
            if self.spans.get(&id).is_some_and(|e| e.seq == seq) {
                let e = self.spans.remove(&id).expect("checked");
                self.bytes = self
                    .bytes
                    .saturating_sub(SPAN_BYTES + SPAN_STACK_BYTES * e.stacks.len());
                for (stack, _) in e.stacks.into_keys() {
                    self.stack_unref(stack);
                }
                self.stats.spans_evicted += 1;
                return true;
            }
        }
        false
    }
}
