//! A sequence's cached prefix copied out of a stage and back: the rows of its first positions in every
//! layer that keeps rows per position, and (for hybrid models) the recurrent state of its linear layers
//! after exactly those positions. The prompt cache keeps such copies of conversations whose slot a later
//! request took, in memory and on disk, and writes one back into a slot when that conversation returns.
//!
//! A copy is only this stage's part; it fits the same stage of the same model again (same layers, rank
//! and KV type), which the caller checks. A stage with sliding-window layers (a ring, not a prefix) or a
//! tensor-parallel rank (its group's ranks would each need theirs) saves nothing.

use super::{EngineError, Stage};

impl Stage {
    /// Why this stage cannot save prefixes, if it cannot.
    pub fn saves_prefixes(&self) -> Result<(), String> {
        if self.group().is_some() {
            return Err("a tensor-parallel rank saves no prefixes".into());
        }
        if self.config().sliding_window.is_some() {
            return Err("sliding-window layers keep a ring, not a prefix".into());
        }
        Ok(())
    }

    /// Bytes of a saved prefix of `positions` positions of this stage.
    pub fn prefix_bytes(&self, positions: usize) -> usize {
        self.cache.copy_bytes(positions) + self.state.sequence_bytes()
    }

    /// A copy of what sequence `seq` holds at positions `0..positions`. For a hybrid model the sequence
    /// must hold exactly those positions (its recurrent state cannot be cut back).
    pub fn save_prefix(&self, seq: usize, positions: usize) -> Result<Vec<u8>, EngineError> {
        self.saves_prefixes().map_err(EngineError::Unsupported)?;
        if positions > self.len(seq) || (self.state.is_present() && positions != self.len(seq)) {
            return Err(EngineError::Unsupported(format!(
                "sequence {seq} holds {} positions; a prefix of {positions} cannot be saved",
                self.len(seq)
            )));
        }
        let mut out = Vec::with_capacity(self.prefix_bytes(positions));
        self.cache.copy_out(seq, positions, &mut out).map_err(EngineError::Unsupported)?;
        if self.state.is_present() {
            self.state.copy_out(seq, &mut out).map_err(EngineError::Unsupported)?;
        }
        Ok(out)
    }

    /// Writes the first `positions` positions of a copy [`Stage::save_prefix`] made of `saved` positions
    /// back into sequence `seq`, which then holds those positions. A hybrid model's copy serves only
    /// whole (its recurrent state is the one after all `saved` positions). `data` must be exactly such a
    /// copy's size.
    pub fn restore_prefix(
        &mut self,
        seq: usize,
        saved: usize,
        positions: usize,
        data: &[u8],
    ) -> Result<(), EngineError> {
        self.saves_prefixes().map_err(EngineError::Unsupported)?;
        let whole = self.prefix_bytes(saved);
        let state = self.state.sequence_bytes();
        if data.len() != whole || positions > saved || (state > 0 && positions != saved) {
            return Err(EngineError::Unsupported(format!(
                "a saved prefix of {saved} positions of this stage is {whole} bytes (given {}) and gives back \
                 {} positions (asked {positions})",
                data.len(),
                if state > 0 { "all its" } else { "at most its" }
            )));
        }
        self.truncate(seq, 0);
        let read = self.cache.copy_in(seq, saved, positions, data).map_err(EngineError::Unsupported)?;
        if state > 0 {
            self.state.copy_in(seq, &data[read..]).map_err(EngineError::Unsupported)?;
        }
        Ok(())
    }
}
