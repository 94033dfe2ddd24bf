//! Several stages in one process, chained exactly as stages on different machines are: each boundary's
//! hidden states are encoded to bytes and decoded again, so `--split` exercises the wire format.

use super::hidden::{HiddenStates, WireFormat};
use super::stage::{Segment, Stage, StageInput, StageOptions};
use super::EngineError;
use crate::model::Model;
use std::ops::Range;

/// The layer ranges `[0, s1), [s1, s2), …, [sn, layers)` for split points `s1 < s2 < … < sn`.
pub fn split_ranges(layers: usize, splits: &[usize]) -> Result<Vec<Range<usize>>, EngineError> {
    let mut bounds = vec![0];
    bounds.extend_from_slice(splits);
    bounds.push(layers);
    if bounds.windows(2).any(|w| w[0] >= w[1]) {
        return Err(EngineError::InvalidSplit { splits: splits.to_vec(), layers });
    }
    Ok(bounds.windows(2).map(|w| w[0]..w[1]).collect())
}

/// Stages covering the whole model, run one after the other.
pub struct LocalPipeline {
    stages: Vec<Stage>,
    format: WireFormat,
    wire: Vec<u8>,
    hidden: HiddenStates,
    boundary_bytes: u64,
}

impl LocalPipeline {
    /// Loads one stage per range of [`split_ranges`]`(splits)`.
    pub fn load(
        model: &Model,
        splits: &[usize],
        options: &StageOptions,
        format: WireFormat,
    ) -> Result<LocalPipeline, EngineError> {
        let stages = split_ranges(model.config().layers, splits)?
            .into_iter()
            .map(|range| Stage::load(model, range, options.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LocalPipeline { stages, format, wire: Vec::new(), hidden: HiddenStates::default(), boundary_bytes: 0 })
    }

    /// Chains stages loaded elsewhere (each from its own file, say): they must cover the model's layers
    /// in order, without gaps.
    pub fn from_stages(stages: Vec<Stage>, format: WireFormat) -> Result<LocalPipeline, EngineError> {
        let Some(last) = stages.last() else { return Err(EngineError::BadInput("a pipeline needs a stage".into())) };
        let layers = last.config().layers;
        let starts = std::iter::once(0).chain(stages.iter().map(|s| s.layers().end));
        if stages.iter().zip(starts).any(|(s, start)| s.layers().start != start) || last.layers().end != layers {
            let splits: Vec<usize> = stages.iter().map(|s| s.layers().start).skip(1).collect();
            return Err(EngineError::InvalidSplit { splits, layers });
        }
        Ok(LocalPipeline { stages, format, wire: Vec::new(), hidden: HiddenStates::default(), boundary_bytes: 0 })
    }

    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// Bytes of hidden states that crossed stage boundaries so far.
    pub fn boundary_bytes(&self) -> u64 {
        self.boundary_bytes
    }

    pub fn context(&self) -> usize {
        self.stages[0].context()
    }

    pub fn batch(&self) -> usize {
        self.stages[0].options().batch
    }

    /// Forgets sequence `seq` from position `len` on, in every stage.
    pub fn truncate(&mut self, seq: usize, len: usize) {
        self.stages.iter_mut().for_each(|s| s.truncate(seq, len));
    }

    /// Runs `tokens` at positions `start..` of `seq` through every stage; returns the last token's logits.
    pub fn forward(&mut self, seq: usize, start: usize, tokens: &[u32]) -> Result<&[f32], EngineError> {
        self.forward_batch(&[Segment { seq, start, tokens: tokens.len(), logits: true }], tokens)
    }

    /// Runs one batched step of several sequences (see [`Stage::forward_batch`]) through every stage;
    /// returns the logits of each segment that asks for them, one row after another.
    pub fn forward_batch(&mut self, segments: &[Segment], tokens: &[u32]) -> Result<&[f32], EngineError> {
        let count = self.stages.len();
        let (format, wire, hidden) = (self.format, &mut self.wire, &mut self.hidden);
        for (i, stage) in self.stages.iter_mut().enumerate() {
            let input = if i == 0 {
                StageInput::Tokens(tokens)
            } else {
                hidden.decode_from(wire).map_err(|e| EngineError::BadInput(e.to_string()))?;
                StageInput::Hidden { values: &hidden.values, tokens: hidden.tokens }
            };
            let width = stage.config().embedding;
            let out = stage.forward_batch(segments, input)?;
            if i + 1 < count {
                HiddenStates::encode(width, out.len() / width, out, format, wire);
                self.boundary_bytes += wire.len() as u64;
            }
        }
        Ok(self.stages[count - 1].last_output())
    }
}
