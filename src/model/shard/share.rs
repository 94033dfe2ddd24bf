//! What of a model one stage reads, as byte ranges of its files: a pipeline stage's layers whole, or a
//! tensor-parallel rank's slice of every layer. A fetch asks for these ranges, and a node checks that
//! they are present before a stage maps them.

use super::ShardError;
use crate::model::Model;
use std::ops::Range;

/// A tensor split by columns gives a rank a piece of every row: hundreds of pieces a few kilobytes
/// long with the other ranks' pieces between them. Pieces closer than this are fetched as one run with
/// what lies between (for such a tensor, the whole of it), which costs a few bytes more where fetching
/// each piece alone would cost a round trip each.
pub const PIECE_GAP: u64 = 64 << 10;

/// The part of a model one stage reads.
#[derive(Clone, Debug, PartialEq)]
pub enum StageShare {
    /// Layers [a, b) whole, with the token embedding on the first stage and the head on the last
    /// ([`Model::stage_tensors`]).
    Layers(Range<usize>),
    /// Rank `rank` of a tensor-parallel group whose ranks hold `shares` of the model (relative): its
    /// slice of every layer ([`crate::model::slice`]), planned from the model's header; of `layers` only
    /// when the group is chained with others as pipeline stages.
    Rank { rank: usize, shares: Vec<f64>, layers: Option<Range<usize>> },
}

impl StageShare {
    /// The byte ranges of each file of `model` (one, or each part of a split set) the stage reads,
    /// sorted and merged (a tied output head's rows are the token embedding's, read once). Of a rank's
    /// slice, pieces less than [`PIECE_GAP`] apart are merged with what lies between them.
    pub fn ranges(&self, model: &Model) -> Result<Vec<Vec<Range<u64>>>, ShardError> {
        let gap = match self {
            StageShare::Layers(_) => 0,
            StageShare::Rank { .. } => PIECE_GAP,
        };
        let mut by_part = self.unmerged(model)?;
        by_part.iter_mut().for_each(|ranges| super::record::merge(ranges, gap));
        Ok(by_part)
    }

    fn unmerged(&self, model: &Model) -> Result<Vec<Vec<Range<u64>>>, ShardError> {
        match self {
            StageShare::Layers(layers) => {
                let model_layers = model.config().layers;
                if layers.is_empty() || layers.end > model_layers {
                    return Err(ShardError::LayersOutside { layers: layers.clone(), model_layers });
                }
                let by_part = model.stage_tensors_by_part(layers.clone());
                Ok(by_part
                    .iter()
                    .map(|tensors| tensors.iter().map(|t| t.offset..t.offset + t.bytes).collect())
                    .collect())
            }
            StageShare::Rank { rank, shares, layers } => {
                let unplanned = |reason: String| ShardError::Slice { label: self.label(), reason };
                let slices = crate::model::slice::plan(model, shares).map_err(unplanned)?;
                let slice = slices
                    .get(*rank)
                    .ok_or_else(|| unplanned(format!("a group of {} has no rank {rank}", shares.len())))?;
                let model_layers = model.config().layers;
                let layers = layers.clone().unwrap_or(0..model_layers);
                if layers.is_empty() || layers.end > model_layers {
                    return Err(ShardError::LayersOutside { layers, model_layers });
                }
                crate::model::slice::rank_ranges_in(model, slice, layers).map_err(unplanned)
            }
        }
    }

    /// How a shard's record and messages name it: `layers 10-19`, `rank 1 of 2`.
    pub fn label(&self) -> String {
        match self {
            StageShare::Layers(layers) => format!("layers {}-{}", layers.start, layers.end.saturating_sub(1)),
            StageShare::Rank { rank, shares, layers: None } => format!("rank {rank} of {}", shares.len()),
            StageShare::Rank { rank, shares, layers: Some(l) } => {
                format!("rank {rank} of {} of layers {}-{}", shares.len(), l.start, l.end.saturating_sub(1))
            }
        }
    }
}
