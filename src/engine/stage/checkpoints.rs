//! Checkpoints of a hybrid model's recurrent state, so that a sequence can go back. A linear-attention
//! layer keeps one state per sequence, after its last position, which cannot be cut back the way rows
//! per position can; an agent's next turn, whose prompt re-renders the previous reply differently (a
//! chat template drops the reasoning, say), leaves what the slot ran just after the previous prompt.
//! So after every prefill chunk that is not a prompt's last (a segment that asks for no logits), the
//! stage copies each such sequence's state aside, with its position; a later step that starts at
//! exactly such a position writes the copy back and cuts the other layers' rows there.
//!
//! Every stage and every rank of a group sees the same segments and keeps the same checkpoints, so stage
//! 0 (which decides where a request starts) can read its own to know what the others hold. Stage 0 ends
//! a prompt's next-to-last chunk a few tokens before its end, where the next turn's prompt most often
//! departs from it (see `worker::compute`).

use super::{Segment, Stage};
use crate::engine::EngineError;
use std::collections::VecDeque;

/// Checkpoints kept per sequence, newest last: placement counts this many more states per sequence.
pub const STATE_CHECKPOINTS: usize = 3;

/// A checkpoint closer than this to the newest one replaces it rather than pushing an older one out.
const MIN_SPACING: usize = 256;

/// Per sequence, `(position, its recurrent state after that position)`, oldest first.
#[derive(Default)]
pub(in crate::engine) struct StateCheckpoints {
    held: Vec<VecDeque<(usize, Vec<u8>)>>,
}

impl StateCheckpoints {
    pub fn new(sequences: usize) -> StateCheckpoints {
        StateCheckpoints { held: (0..sequences).map(|_| VecDeque::new()).collect() }
    }

    /// Forgets the checkpoints of `seq` past position `len`.
    pub fn cut(&mut self, seq: usize, len: usize) {
        if let Some(held) = self.held.get_mut(seq) {
            held.retain(|(position, _)| *position <= len);
        }
    }

    fn push(&mut self, seq: usize, position: usize, state: Vec<u8>) {
        let held = &mut self.held[seq];
        held.retain(|(p, _)| *p < position);
        if held.back().is_some_and(|(p, _)| position - p < MIN_SPACING) {
            held.pop_back();
        }
        if held.len() >= STATE_CHECKPOINTS {
            held.pop_front();
        }
        held.push_back((position, state));
    }

    fn at(&self, seq: usize, position: usize) -> Option<&[u8]> {
        self.held.get(seq)?.iter().find(|(p, _)| *p == position).map(|(_, state)| state.as_slice())
    }
}

impl Stage {
    /// The positions of `seq` this stage can go back to (besides 0), oldest first.
    pub fn checkpoints(&self, seq: usize) -> Vec<usize> {
        self.checkpoints.held.get(seq).map_or_else(Vec::new, |h| h.iter().map(|(p, _)| *p).collect())
    }

    /// Whether `seq` can start a step at `start`: it holds exactly that many positions, or starts again,
    /// or has a checkpoint there.
    pub(super) fn can_start_at(&self, seq: usize, start: usize) -> bool {
        start == 0 || start == self.cache.len(seq) || self.checkpoints.at(seq, start).is_some()
    }

    /// Before a step: each segment that goes back to a checkpoint gets its state written back and the
    /// rows past it cut; the checkpoints past where a segment starts are forgotten.
    pub(super) fn go_back_to_checkpoints(&mut self, segments: &[Segment]) -> Result<(), EngineError> {
        if !self.state.is_present() {
            return Ok(());
        }
        for s in segments {
            if s.start != 0 && s.start < self.cache.len(s.seq) {
                let state = self.checkpoints.at(s.seq, s.start).ok_or_else(|| {
                    EngineError::BadInput(format!("sequence {} has no checkpoint at position {}", s.seq, s.start))
                })?;
                self.state.copy_in(s.seq, state).map_err(EngineError::Unsupported)?;
                self.cache.truncate(s.seq, s.start);
            }
            self.checkpoints.cut(s.seq, s.start);
        }
        Ok(())
    }

    /// After a step: the state of each sequence whose prefill goes on (its segment asked no logits).
    pub(super) fn take_checkpoints(&mut self, segments: &[Segment]) -> Result<(), EngineError> {
        if !self.state.is_present() {
            return Ok(());
        }
        for s in segments.iter().filter(|s| !s.logits) {
            let mut state = Vec::with_capacity(self.state.sequence_bytes());
            self.state.copy_out(s.seq, &mut state).map_err(EngineError::Unsupported)?;
            self.checkpoints.push(s.seq, s.start + s.tokens, state);
        }
        Ok(())
    }

    /// Bytes the checkpoints may take at most.
    pub(super) fn checkpoint_bytes(&self) -> u64 {
        (self.state.sequence_bytes() * STATE_CHECKPOINTS * self.cache.sequences()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_are_kept_and_close_ones_replace_each_other() {
        let mut c = StateCheckpoints::new(2);
        for position in [512, 1024, 1536, 2048] {
            c.push(0, position, vec![position as u8]);
        }
        let positions = |c: &StateCheckpoints| c.held[0].iter().map(|(p, _)| *p).collect::<Vec<_>>();
        assert_eq!(positions(&c), [1024, 1536, 2048]);
        c.push(0, 2100, vec![1]);
        assert_eq!(positions(&c), [1024, 1536, 2100], "a close one replaces the newest");
        c.push(0, 1500, vec![2]);
        assert_eq!(positions(&c), [1024, 1500], "a sequence that went back forgets what lay beyond");
        assert_eq!(c.at(0, 1500), Some(&[2u8][..]));
        assert_eq!(c.at(1, 1500), None);
        c.cut(0, 1400);
        assert_eq!(positions(&c), [1024]);
        assert_eq!(c.at(7, 0), None, "a sequence that does not exist has none");
    }
}
