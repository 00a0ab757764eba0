//! Time buckets: per route, what every sample cost, for route and process windows.

use crate::intern::NameId;

use super::*;

pub(super) struct Bucket {
    pub(super) start_ns: u64,
    /// Keyed by (route, labelled), then stack: a route's query touches its own
    /// entries only.
    pub(super) entries: FastMap<(NameId, bool), FastMap<u32, Counts>>,
}

impl State {
    pub(super) fn add_to_bucket(
        &mut self,
        time_ns: u64,
        key: (NameId, bool, u32),
        weight: u64,
        wall: bool,
    ) {
        let (route, labelled, stack) = key;
        let width = self.cfg.bucket_width.as_nanos() as u64;
        let start = time_ns - time_ns % width;
        let need_new = self.buckets.back().is_none_or(|b| b.start_ns < start);
        if need_new {
            self.buckets.push_back(Bucket {
                start_ns: start,
                entries: FastMap::default(),
            });
            while self.buckets.len() > self.cfg.buckets {
                self.drop_oldest_bucket();
            }
        }
        // Late samples (older than the newest bucket) go to the bucket they belong to
        // if it is still held, else to the oldest.
        let idx = self
            .buckets
            .iter()
            .rposition(|b| b.start_ns <= start)
            .unwrap_or(0);
        let stacks = self.buckets[idx]
            .entries
            .entry((route, labelled))
            .or_default();
        let is_new = !stacks.contains_key(&stack);
        stacks.entry(stack).or_default().add(weight, wall);
        if is_new {
            self.bytes += BUCKET_ENTRY_BYTES;
            self.stack_ref(stack);
        }
    }

    pub(super) fn drop_oldest_bucket(&mut self) {
        if let Some(b) = self.buckets.pop_front() {
            for stack in b.entries.into_values().flat_map(FastMap::into_keys) {
                self.bytes = self.bytes.saturating_sub(BUCKET_ENTRY_BYTES);
                self.stack_unref(stack);
            }
        }
    }
}
