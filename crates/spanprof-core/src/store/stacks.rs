//! The stack table: each distinct stack once, by id, with a reference count so
//! that evicting spans and buckets frees the stacks only they used.

use crate::profile::Stack;

use super::*;

pub(super) struct StackEntry {
    pub(super) addrs: Box<[u64]>,
    pub(super) frames: Stack,
    pub(super) refs: u32,
}

impl State {
    pub(super) fn stack_id(
        &mut self,
        addrs: &[u64],
        frames_of: &mut impl FnMut(&[u64]) -> Stack,
    ) -> u32 {
        if let Some(&id) = self.stack_ids.get(addrs) {
            return id;
        }
        if self.stack_ids.len() >= self.cfg.max_stacks {
            self.stats.stacks_dropped += 1;
            return OVERFLOW_STACK;
        }
        let frames = frames_of(addrs);
        self.bytes += STACK_BYTES + 8 * addrs.len() + FRAME_BYTES * frames.len();
        let entry = StackEntry {
            addrs: addrs.into(),
            frames,
            refs: 0,
        };
        let id = match self.free_stacks.pop() {
            Some(id) => {
                self.stacks[id as usize] = Some(entry);
                id
            }
            None => {
                self.stacks.push(Some(entry));
                (self.stacks.len() - 1) as u32
            }
        };
        self.stack_ids.insert(addrs.into(), id);
        id
    }

    pub(super) fn stack_ref(&mut self, id: u32) {
        if let Some(Some(e)) = self.stacks.get_mut(id as usize) {
            e.refs = e.refs.saturating_add(1);
        }
    }

    pub(super) fn stack_unref(&mut self, id: u32) {
        let Some(Some(e)) = self.stacks.get_mut(id as usize) else {
            return;
        };
        e.refs = e.refs.saturating_sub(1);
        if e.refs == 0 && id != OVERFLOW_STACK {
            let e = self.stacks[id as usize].take().expect("checked above");
            self.stack_ids.remove(&e.addrs);
            self.bytes = self
                .bytes
                .saturating_sub(STACK_BYTES + 8 * e.addrs.len() + FRAME_BYTES * e.frames.len());
            self.free_stacks.push(id);
        }
    }
}
