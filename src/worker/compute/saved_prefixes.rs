//! The compute thread's part in the saved prefixes: stage 0 keeps what a finished request's slot holds
//! and writes a saved prefix back into a new request's slot ([`super::prefix_index`] decides which),
//! doing each on its own stage at once and sending it along the ring for the others
//! ([`super::prefix_store`] on every stage does it). A restore that fails on any stage comes back to
//! stage 0, which forgets that prefix everywhere and prefills the prompt from its start instead.

use super::{schedule, Compute};
use crate::transport::{PrefixOp, RingFrame};
use crate::util::LockExt;

impl Compute {
    /// Does `op` to `slot` on this stage and sends it along the ring (stage 0).
    fn prefix_everywhere(&mut self, request: u64, slot: u32, op: PrefixOp) {
        if let Some(store) = self.prefixes.as_mut() {
            if let Err(reason) = store.apply(&mut self.stage, slot, &op) {
                tracing::warn!("the prompt cache could not {op:?} on stage 0: {reason}");
            }
        }
        if self.stages > 1 {
            self.send(&RingFrame::Prefix { request, slot, op });
        }
    }

    /// Stage 0, admitting a request into `slot` that reuses `cached` of its tokens: what the slot's last
    /// conversation left is saved first, unless the request goes on with all of it.
    pub(super) fn save_before_reuse(&mut self, slot: u32, cached: usize) {
        let Some(head) = self.head.as_mut() else { return };
        let unsaved = std::mem::replace(&mut head.unsaved[slot as usize], false);
        if unsaved && cached < head.history.held(slot).len() {
            self.keep_saved(slot);
        }
    }

    /// Whether stage 0 has free slots whose rows are not saved yet.
    pub(super) fn has_unsaved(&self) -> bool {
        self.head.as_ref().is_some_and(|h| h.saved.is_some() && h.unsaved.iter().any(|&u| u))
    }

    /// Stage 0, idle (or stopping): saves every slot whose last request ended since, so that a
    /// conversation resumed later, or after a relaunch, finds its prefix on disk.
    pub(super) fn save_idle(&mut self) {
        let Some(head) = self.head.as_mut() else { return };
        let slots: Vec<u32> = (0..head.unsaved.len() as u32).filter(|&s| head.unsaved[s as usize]).collect();
        for slot in slots {
            self.head.as_mut().expect("stage 0").unsaved[slot as usize] = false;
            self.keep_saved(slot);
        }
    }

    /// Stage 0 before the worker exits: saves what is unsaved and waits (at most `within`) for this
    /// stage's disk to have it. The other stages do theirs if they are still there.
    pub(super) fn flush_saved(&mut self, within: std::time::Duration) {
        self.save_idle();
        if let Some(store) = &self.prefixes {
            store.wait_for_disk(within);
        }
    }

    /// Stage 0: what `slot` holds is saved, as the index decides.
    fn keep_saved(&mut self, slot: u32) {
        let Some(head) = self.head.as_mut() else { return };
        let held = head.history.held(slot).to_vec();
        let Some(index) = head.saved.as_mut() else { return };
        for op in index.keep(&held) {
            self.prefix_everywhere(0, slot, op);
        }
        self.record_saved();
    }

    /// Stage 0, admitting request `id` into `slot`: when a saved prefix gives back more of `prompt`
    /// than the slot's `cached` tokens, writes it into the slot (here at once, along the ring after)
    /// and raises `cached`; whether the request waits for the other stages to have done so.
    pub(super) fn restore_saved(&mut self, id: u64, slot: u32, prompt: &[u32], cached: &mut usize) -> bool {
        let Some(head) = self.head.as_mut() else { return false };
        let Some(found) = head.saved.as_mut().and_then(|index| index.best(prompt, *cached)) else { return false };
        let op = PrefixOp::Restore {
            key: found.key,
            saved: found.saved as u32,
            positions: found.positions as u32,
            failed: None,
        };
        let here = match self.prefixes.as_mut() {
            Some(store) => store.apply(&mut self.stage, slot, &op),
            None => Err("this stage keeps no saved prefixes".into()),
        };
        let head = self.head.as_mut().expect("stage 0");
        if let Err(reason) = here {
            tracing::warn!("a saved prefix could not be restored, the prompt is prefilled instead: {reason}");
            head.history.forget(slot);
            *cached = 0;
            let forget = head.saved.as_mut().expect("found there").failed(found.key);
            self.prefix_everywhere(0, slot, forget);
            return false;
        }
        head.history.restored(slot, &prompt[..found.positions]);
        *cached = found.positions;
        self.stats.locked().restored_prefixes += 1;
        if self.stages == 1 {
            return false;
        }
        self.send(&RingFrame::Prefix { request: id, slot, op });
        true
    }

    /// Stage 0: the restore of `key` for request `id` came back around the ring, `failed` if a stage
    /// could not; then the request prefills its whole prompt.
    pub(super) fn restored(&mut self, id: u64, key: u64, failed: Option<String>) {
        let stages = self.stages;
        let batch = self.stage.options().batch;
        let Some(head) = self.head.as_mut() else { return };
        let pipeline = if head.pipelined_prefill { stages } else { 1 };
        let Some(a) = head.find(id) else { return };
        a.restoring = false;
        let Some(reason) = failed else { return };
        tracing::warn!("a saved prefix could not be restored, the prompt is prefilled instead: {reason}");
        (a.prefilled, a.cached) = (0, 0);
        a.chunk = schedule::prompt_chunk(a.prompt.len(), pipeline, batch);
        let slot = a.slot;
        head.history.forget(slot);
        if let Some(forget) = head.saved.as_mut().map(|index| index.failed(key)) {
            self.prefix_everywhere(0, slot, forget);
        }
    }

    /// Stages after the first: does a prefix operation and passes it on; a restore goes on to stage 0
    /// with the first failure.
    pub(super) fn on_prefix(&mut self, request: u64, slot: u32, mut op: PrefixOp) {
        let outcome = match self.prefixes.as_mut() {
            Some(store) => store.apply(&mut self.stage, slot, &op),
            None => Err("this stage keeps no saved prefixes".into()),
        };
        match (&mut op, outcome) {
            (PrefixOp::Restore { failed, .. }, Err(reason)) => {
                let layers = self.stage.layers();
                failed.get_or_insert_with(|| {
                    format!("the stage of layers {}–{}: {reason}", layers.start, layers.end - 1)
                });
            }
            (PrefixOp::Restore { .. }, Ok(())) => {}
            (_, Err(reason)) => tracing::debug!("the prompt cache could not {op:?}: {reason}"),
            (_, Ok(())) => {}
        }
        // Saves and forgets end at the last stage; a restore goes back to stage 0.
        if !self.stage.is_last() || matches!(op, PrefixOp::Restore { .. }) {
            self.send(&RingFrame::Prefix { request, slot, op });
        }
    }

    /// The index's sizes, for the stage's statistics.
    fn record_saved(&self) {
        let Some(index) = self.head.as_ref().and_then(|h| h.saved.as_ref()) else { return };
        let (memory, disk) = index.held();
        let mut s = self.stats.locked();
        s.saved_prefix_positions = memory as u64;
        s.saved_prefix_positions_on_disk = disk as u64;
    }
}
