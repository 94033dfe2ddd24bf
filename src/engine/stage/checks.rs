//! The checks a step passes before a stage runs it: a batch of one to `batch` tokens whose segments are
//! each a different sequence, positions that follow what each sequence holds (and that its sliding ring
//! or recurrent state can still continue from, or go back to) within the context, and an input of the stage's kind.

use super::{Segment, Stage, StageInput};
use crate::engine::EngineError;

impl Stage {
    /// Checks a batched step: one to `batch` tokens in all, as many as the input has, each segment a
    /// different sequence, each a valid step of its own.
    pub(super) fn check_batch(&self, segments: &[Segment], input: &StageInput<'_>) -> Result<(), EngineError> {
        let total: usize = segments.iter().map(|s| s.tokens).sum();
        if segments.is_empty() || total != input.tokens() {
            return Err(EngineError::BadInput(format!(
                "a step's {} segments hold {total} tokens but its input has {}",
                segments.len(),
                input.tokens()
            )));
        }
        for (i, s) in segments.iter().enumerate() {
            if segments[..i].iter().any(|o| o.seq == s.seq) {
                return Err(EngineError::BadInput(format!("sequence {} appears twice in one step", s.seq)));
            }
            self.check_segment(s)?;
        }
        if total > self.options.batch {
            return Err(EngineError::BadInput(format!("a step takes 1 to {} tokens, not {total}", self.options.batch)));
        }
        self.check_input(input)
    }

    /// Whether one sequence's part of a step can run: an existing sequence, positions that follow
    /// what it holds and fit its context.
    pub fn check_segment(&self, s: &Segment) -> Result<(), EngineError> {
        let (seq, start, tokens) = (s.seq, s.start, s.tokens);
        if s.drafted >= tokens || (s.drafted > 0 && !s.logits) {
            return Err(EngineError::BadInput(format!(
                "a segment of {tokens} tokens cannot verify {} drafted ones",
                s.drafted
            )));
        }
        if seq >= self.cache.sequences() {
            return Err(EngineError::BadInput(format!(
                "sequence {seq} does not exist (this stage holds {})",
                self.cache.sequences()
            )));
        }
        if tokens == 0 || tokens > self.options.batch {
            return Err(EngineError::BadInput(format!(
                "a step takes 1 to {} tokens, not {tokens}",
                self.options.batch
            )));
        }
        if start > self.cache.len(seq) {
            return Err(EngineError::BadInput(format!(
                "position {start} skips ahead of the {} positions sequence {seq} holds",
                self.cache.len(seq)
            )));
        }
        self.cache.check_resume(seq, start).map_err(EngineError::BadInput)?;
        if self.state.is_present() && !self.can_start_at(seq, start) {
            return Err(EngineError::BadInput(format!(
                "cannot go back to position {start} of sequence {seq}: this stage's linear-attention layers keep \
                 one recurrent state per sequence, after its position {}, and checkpoints at {:?}; continue from \
                 one of those or start the sequence again from 0",
                self.cache.len(seq),
                self.checkpoints(seq)
            )));
        }
        if start + tokens > self.cache.context() {
            return Err(EngineError::ContextFull { needed: start + tokens, context: self.cache.context() });
        }
        Ok(())
    }

    fn check_input(&self, input: &StageInput<'_>) -> Result<(), EngineError> {
        match input {
            StageInput::Tokens(ids) => {
                if !self.is_first() {
                    return Err(EngineError::BadInput(format!(
                        "stage {:?} takes hidden states, not tokens",
                        self.layers
                    )));
                }
                if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.config.vocabulary) {
                    return Err(EngineError::BadInput(format!(
                        "token id {bad} is outside the vocabulary of {}",
                        self.config.vocabulary
                    )));
                }
            }
            StageInput::Hidden { values, tokens } => {
                if self.is_first() {
                    return Err(EngineError::BadInput("the first stage takes tokens, not hidden states".into()));
                }
                let width = self.config.hidden_width(self.layers.start);
                if values.len() != tokens * width {
                    return Err(EngineError::BadInput(format!(
                        "hidden states hold {} values; {tokens} tokens of width {width} need {}",
                        values.len(),
                        tokens * width
                    )));
                }
            }
        }
        Ok(())
    }
}
