//! The prompt cache at stage 0: every stage keeps, for each slot, the keys and values (or recurrent
//! state) of the tokens its last request ran, and stage 0 remembers those tokens. A new request goes to
//! the free slot that holds the longest prefix of its prompt and runs only the rest — so an agent's
//! next turn, which resends the whole conversation, prefills only what is new, and requests that share
//! a system prompt share its rows. Matching is by token ids, within one instance (a slot's rows are its
//! model's and stages' own); nothing is copied between slots.
//!
//! What a slot may give back depends on what its layers keep: rows per position can be cut back to any
//! prefix; a sliding-window ring only while it still holds the positions the next token sees; a
//! recurrent state (Qwen3.5's linear attention) whole, or as far as one of the checkpoints the stages
//! copied of it during the slot's last prefill (see `engine`'s `stage/checkpoints.rs`): a prompt's
//! next-to-last chunk ends [`CHECKPOINT_BEFORE_END`] tokens before its end, where the next turn's
//! prompt most often departs from what the slot ran (its template renders the reply anew).

use crate::engine::ring_positions;
use crate::model::ModelConfig;

/// What a slot's cache can give back to a new request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// Any prefix (rows per position).
    AnyPrefix,
    /// A prefix whose next token still finds its window in the ring of the last `ring` positions.
    Window { window: usize, ring: usize },
    /// Only everything the slot ran (a recurrent state).
    Whole,
    /// Nothing (the cache is turned off).
    Off,
}

impl Reuse {
    /// The rule for a model of `config` whose stages hold `context` positions and take steps of `batch`.
    pub fn of(config: &ModelConfig, context: usize, batch: usize) -> Reuse {
        if config.linear_attention.is_some() {
            return Reuse::Whole;
        }
        match &config.sliding_window {
            Some(w) => Reuse::Window { window: w.size, ring: ring_positions(w.size, context, batch) },
            None => Reuse::AnyPrefix,
        }
    }
}

/// How many tokens before a prompt's end a hybrid model's prefill stops once, so that the stages keep a
/// checkpoint of the state there: a chat template's generation prompt (`<|im_start|>assistant\n<think>\n`)
/// is what the next turn renders differently. llama.cpp's server stops at the same place.
pub const CHECKPOINT_BEFORE_END: usize = 4;

/// The tokens each slot's cache holds, in order from position 0.
pub struct SlotHistory {
    tokens: Vec<Vec<u32>>,
    /// For each slot, one past the highest position written since it last started at 0: a ring may
    /// hold later positions of an earlier request there (as the stages count it, `KvCache`).
    high_water: Vec<usize>,
    reuse: Reuse,
}

impl SlotHistory {
    pub fn new(slots: usize, reuse: Reuse) -> SlotHistory {
        SlotHistory { tokens: vec![Vec::new(); slots], high_water: vec![0; slots], reuse }
    }

    /// Whether slots give back a recurrent state (then at `checkpoints` too, and prompts stop once
    /// before their end for one).
    pub fn keeps_checkpoints(&self) -> bool {
        self.reuse == Reuse::Whole
    }

    /// How many of `prompt`'s first tokens `slot` can give back: at most all but the last (whose
    /// logits the request needs), and as its rule allows; a recurrent state also as far as one of the
    /// `checkpoints` the stages hold of it.
    pub fn reusable(&self, slot: u32, prompt: &[u32], checkpoints: impl Fn(u32) -> Vec<usize>) -> usize {
        let held = &self.tokens[slot as usize];
        let common = held.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len().saturating_sub(1));
        match self.reuse {
            Reuse::Off => 0,
            Reuse::AnyPrefix => common,
            Reuse::Window { window, ring } => {
                let sees_from = common.saturating_sub(window.saturating_sub(1));
                let holds_from = self.high_water[slot as usize].saturating_sub(ring);
                if sees_from >= holds_from {
                    common
                } else {
                    0
                }
            }
            Reuse::Whole if common == held.len() => common,
            Reuse::Whole => checkpoints(slot).into_iter().filter(|&at| at <= common).max().unwrap_or(0),
        }
    }

    /// Of the `free` slots, the one that gives back the most of `prompt` (the lowest of equals), and how
    /// much.
    pub fn best(&self, free: &[u32], prompt: &[u32], checkpoints: impl Fn(u32) -> Vec<usize>) -> Option<(u32, usize)> {
        free.iter()
            .map(|&slot| (slot, self.reusable(slot, prompt, &checkpoints)))
            .max_by_key(|&(slot, n)| (n, std::cmp::Reverse(slot)))
    }

    /// Records that a step ran `tokens` of `slot` from position `start` (later positions are gone).
    pub fn ran(&mut self, slot: u32, start: usize, tokens: &[u32]) {
        let held = &mut self.tokens[slot as usize];
        held.truncate(start);
        if held.len() == start {
            held.extend_from_slice(tokens);
            let end = start + tokens.len();
            let high = &mut self.high_water[slot as usize];
            *high = if start == 0 { end } else { (*high).max(end) };
        } else {
            // A step that does not follow what the slot holds: nothing it holds can be trusted.
            self.forget(slot);
        }
    }

    /// The tokens `slot` holds, from position 0.
    pub fn held(&self, slot: u32) -> &[u32] {
        &self.tokens[slot as usize]
    }

    /// Records that `slot` now holds `tokens` from position 0 (a saved prefix written back into it).
    pub fn restored(&mut self, slot: u32, tokens: &[u32]) {
        self.ran(slot, 0, tokens);
    }

    /// Forgets what `slot` holds (a step of it failed somewhere along the ring).
    pub fn forget(&mut self, slot: u32) {
        self.tokens[slot as usize].clear();
        self.high_water[slot as usize] = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(reuse: Reuse) -> SlotHistory {
        let mut h = SlotHistory::new(3, reuse);
        h.ran(0, 0, &[1, 2, 3, 4, 5]);
        h.ran(1, 0, &[1, 2, 9]);
        h
    }

    #[test]
    fn the_slot_with_the_longest_prefix_is_chosen_and_the_last_token_always_runs() {
        let h = history(Reuse::AnyPrefix);
        assert_eq!(h.best(&[0, 1, 2], &[1, 2, 3, 7], |_| Vec::new()), Some((0, 3)));
        assert_eq!(h.best(&[1, 2], &[1, 2, 3, 7], |_| Vec::new()), Some((1, 2)));
        assert_eq!(
            h.best(&[0, 1, 2], &[1, 2, 3, 4, 5], |_| Vec::new()),
            Some((0, 4)),
            "the prompt's last token runs again"
        );
        assert_eq!(h.best(&[0, 1, 2], &[8], |_| Vec::new()), Some((0, 0)), "no match: the lowest slot");
        assert_eq!(history(Reuse::Off).best(&[0, 1], &[1, 2, 3, 7], |_| Vec::new()), Some((0, 0)));
    }

    #[test]
    fn a_recurrent_state_is_given_back_whole_or_from_a_checkpoint() {
        let h = history(Reuse::Whole);
        assert_eq!(h.reusable(0, &[1, 2, 3, 4, 5, 6], |_| Vec::new()), 5);
        assert_eq!(h.reusable(0, &[1, 2, 3, 7], |_| Vec::new()), 0, "the state has passed position 3");
        assert_eq!(h.reusable(0, &[1, 2, 3, 7], |_| vec![1, 2, 4]), 2, "back to the last checkpoint before it departs");
        assert_eq!(h.reusable(0, &[1, 2, 3, 4, 5, 6], |_| vec![2]), 5, "whole still beats a checkpoint");
        assert_eq!(h.reusable(0, &[1, 9], |_| vec![2]), 0, "a checkpoint past where it departs is no use");
    }

    #[test]
    fn a_ring_gives_back_a_prefix_only_while_it_holds_the_window() {
        let mut h = SlotHistory::new(1, Reuse::Window { window: 4, ring: 8 });
        h.ran(0, 0, &(0..20).collect::<Vec<_>>());
        // The ring holds positions 12..20; the next token at 17 sees 14..17, at 10 it would see 7..10.
        assert_eq!(h.reusable(0, &(0..17).chain([99]).collect::<Vec<_>>(), |_| Vec::new()), 17);
        assert_eq!(h.reusable(0, &(0..10).chain([99]).collect::<Vec<_>>(), |_| Vec::new()), 0);
        // A shorter request from position 17 leaves the ring holding the earlier one's later positions.
        h.ran(0, 17, &[99]);
        assert_eq!(h.reusable(0, &(0..17).chain([99, 5]).collect::<Vec<_>>(), |_| Vec::new()), 18);
        assert_eq!(h.reusable(0, &(0..11).chain([98]).collect::<Vec<_>>(), |_| Vec::new()), 0);
    }

    #[test]
    fn steps_extend_or_cut_back_what_a_slot_holds() {
        let mut h = history(Reuse::AnyPrefix);
        h.ran(0, 2, &[7]);
        assert_eq!(h.tokens[0], [1, 2, 7]);
        h.ran(0, 9, &[1]);
        assert!(h.tokens[0].is_empty(), "a step beyond what the slot holds");
        h.forget(1);
        assert!(h.tokens[1].is_empty());
    }
}
