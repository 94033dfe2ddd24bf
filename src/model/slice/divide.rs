//! Dividing a model among a group's ranks by share, without the file at hand: a [`Divider`] keeps what
//! the plan needs of a model (its parts' sizes, where cuts may fall, the bytes of what every rank holds
//! whole and of each part), so that placement can try any shares a group's nodes call for and know each
//! rank's exact bytes before anything is loaded.
//!
//! A rank's bytes are linear in the units it holds: a tensor split along a part is cut only on whole
//! quantization blocks, so a share of `u` of its `total` units is exactly `bytes * u / total` of it.
//! [`rank_bytes`] reads the same from the file, tensor by tensor; the tests hold the two equal.

use super::{TensorSlice, PARTS};
use crate::model::gguf::TensorInfo;
use crate::model::layout::{self, ExpectedTensor, Part, Split};
use crate::model::{Model, ModelConfig};
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// What dividing one model takes: its parts, where they may be cut, and their bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Divider {
    /// How many units of each part the model has, in [`PARTS`] order.
    totals: [usize; 6],
    /// Values along each part's split columns a cut must fall on (the quantization blocks of the
    /// tensors split by columns), in [`PARTS`] order.
    align: [usize; 6],
    /// Query heads a cut between two ranks must fall on a multiple of: where every tensor split by
    /// columns of whole heads (the attention output, the query bias) starts a quantization block.
    heads_unit: usize,
    /// Bytes of the tensors held whole and split along each part, by where they are held (a group
    /// may run some of the layers when groups are chained as pipeline stages): each layer's, and those
    /// outside the layers ([`layout::GlobalPlace`]).
    by_layer: Vec<Held>,
    first: Held,
    last: Held,
    every: Held,
}

/// Bytes of some tensors: those every rank holds whole, and those split along each part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Held {
    whole: u64,
    parts: [u64; 6],
}

impl Held {
    /// Adds a tensor of `bytes` whose last dimension is `rows` long.
    fn add(&mut self, split: Split, bytes: u64, rows: u64) {
        match split {
            Split::Whole => self.whole += bytes,
            Split::Along { part, .. } => self.parts[index(part)] += bytes,
            Split::AfterWhole { whole, part } => {
                let held = bytes * whole / rows.max(1);
                self.whole += held;
                self.parts[index(part)] += bytes - held;
            }
        }
    }

    /// A rank's bytes of these tensors: the whole ones, and its units' share of each part (exact:
    /// every tensor is cut on whole quantization blocks).
    fn of(&self, slice: &TensorSlice, totals: &[usize; 6]) -> u64 {
        let shares: u128 = PARTS
            .iter()
            .enumerate()
            .map(|(p, part)| self.parts[p] as u128 * slice.range(*part).len() as u128 / totals[p].max(1) as u128)
            .sum();
        self.whole + shares as u64
    }
}

impl Divider {
    /// How `model` divides, or why it cannot be divided at all: an architecture whose graph has no
    /// tensor-parallel form, or a tensor whose split dimension does not divide into its part's units.
    pub fn of(model: &Model) -> Result<Divider, String> {
        let config = model.config();
        config.architecture.declaration().splits_across_ranks(config)?;
        let declared = declared_tensors(model);
        let totals = totals(config, &declared);
        let mut align = [1usize; 6];
        let mut heads_unit = 1;
        let (mut by_layer, mut first, mut last, mut every) =
            (vec![Held::default(); config.layers], Held::default(), Held::default(), Held::default());
        for (t, info) in &declared {
            let held = match layer_of(&t.name) {
                Some(l) if l < config.layers => &mut by_layer[l],
                _ => match layout::global_place(&t.name) {
                    layout::GlobalPlace::First => &mut first,
                    layout::GlobalPlace::Last => &mut last,
                    layout::GlobalPlace::Every => &mut every,
                },
            };
            held.add(t.split, info.bytes, info.shape.last().copied().unwrap_or(1));
            let (dim, part, whole) = match t.split {
                Split::Whole => continue,
                Split::Along { dim, part } => (dim, part, 0),
                Split::AfterWhole { whole, part } => (info.shape.len().saturating_sub(1), part, whole),
            };
            let p = index(part);
            let total = totals[p].max(1) as u64;
            let length =
                info.shape.get(dim).copied().ok_or_else(|| format!("{} has no dimension {dim} to split", info.name))?;
            let length =
                length.checked_sub(whole).ok_or_else(|| format!("{} has fewer than {whole} rows", info.name))?;
            if !length.is_multiple_of(total) {
                return Err(format!("{}'s dimension {dim} ({length}) does not divide into {total} parts", info.name));
            }
            // Values along a dimension split by columns must start on a quantization block: the
            // columns a part is cut at must be multiples of its tensors' block sizes.
            if dim == 0 && part == Part::QueryHeads {
                // A head's columns: DeepSeek's latent attention has value heads narrower than its keys.
                let width = (length / total).max(1) as usize;
                heads_unit = lcm(heads_unit, lcm(width, info.dtype.block_elements() as usize) / width);
            } else if dim == 0 {
                align[p] = lcm(align[p], info.dtype.block_elements() as usize);
            }
        }
        Ok(Divider { totals, align, heads_unit, by_layer, first, last, every })
    }

    /// Each rank's slice of a group whose ranks hold parts in proportion to `shares` (one per rank).
    /// Fails, saying why, for a group the model cannot be divided among: fewer attention heads than
    /// ranks, or quantization blocks that do not fall between heads often enough.
    pub fn plan(&self, shares: &[f64]) -> Result<Vec<TensorSlice>, String> {
        let ranks = shares.len();
        if ranks == 0 || shares.iter().any(|s| !s.is_finite() || *s <= 0.0) {
            return Err("a tensor-parallel group needs one positive share per node".into());
        }
        let heads = self.totals[index(Part::QueryHeads)];
        if heads < ranks {
            return Err(format!(
                "the model has {heads} attention heads, fewer than the {ranks} nodes of the group: each node needs at least one"
            ));
        }
        // Query heads are cut where the attention output's quantization blocks fall between heads.
        let heads_unit = self.heads_unit;
        if heads_unit * ranks > heads {
            return Err(format!(
                "the attention output's quantization blocks fall between its heads only every {heads_unit} heads, \
                 too seldom to divide {heads} heads among {ranks} nodes"
            ));
        }
        // Query heads by share; each rank holds the key/value heads its query heads read, so a group
        // shared by two ranks is computed and cached on both (as it must be when there are fewer
        // key/value heads than ranks).
        let query = proportional(heads, shares, heads_unit);
        let group = heads / self.totals[index(Part::KvHeads)].max(1);
        let kv: Vec<Range<usize>> = query.iter().map(|q| q.start / group..q.end.div_ceil(group)).collect();
        // Each part by share on its own, not evened out in bytes: the ranks wait for each other at every
        // sum, after attention and after the feed-forward, so each part between two sums must be split as
        // evenly as it can be (an uneven split of the heads cannot be made up for in the feed-forward).
        let by_share = |part: Part| proportional(self.totals[index(part)], shares, self.align[index(part)]);
        let (feed_forward, shared, experts) =
            (by_share(Part::FeedForward), by_share(Part::SharedFeedForward), by_share(Part::Experts));
        // Output rows: 32 at a time, so that each share starts on an aligned byte.
        let vocabulary = proportional(self.totals[index(Part::Vocabulary)], shares, 32);
        Ok((0..ranks)
            .map(|rank| TensorSlice {
                rank,
                ranks,
                query_heads: query[rank].clone(),
                kv_heads: kv[rank].clone(),
                feed_forward: feed_forward[rank].clone(),
                shared_feed_forward: shared[rank].clone(),
                experts: experts[rank].clone(),
                vocabulary: vocabulary[rank].clone(),
                totals: self.totals,
            })
            .collect())
    }

    /// [`Divider::plan`], with each rank's exact bytes ([`Divider::bytes`]).
    pub fn plan_with_bytes(&self, shares: &[f64]) -> Result<Vec<(TensorSlice, u64)>, String> {
        Ok(self
            .plan(shares)?
            .into_iter()
            .map(|s| {
                let bytes = self.bytes(&s);
                (s, bytes)
            })
            .collect())
    }

    /// Exact bytes of the tensors a rank holding `slice` (of this model's plan) maps: what every rank
    /// holds whole and its units' share of each part.
    pub fn bytes(&self, slice: &TensorSlice) -> u64 {
        self.bytes_in(slice, 0..self.by_layer.len())
    }

    /// Exact bytes a rank holding `slice` maps of a group over `layers` only (groups chained as
    /// pipeline stages): those layers' tensors, the token embeddings on the first layers' ranks, the
    /// head on the last layers' ([`rank_bytes_in`] reads the same from the file).
    pub fn bytes_in(&self, slice: &TensorSlice, layers: Range<usize>) -> u64 {
        let held = |h: &Held| h.of(slice, &self.totals);
        let mut total: u64 = self.by_layer.get(layers.clone()).unwrap_or_default().iter().map(held).sum();
        total += held(&self.every);
        if layers.start == 0 {
            total += held(&self.first);
        }
        if layers.end == self.by_layer.len() {
            total += held(&self.last);
        }
        total
    }

    /// Bytes every rank holds whole, whatever its share (norms, routers, the token embeddings).
    pub fn whole_bytes(&self) -> u64 {
        self.all().map(|h| h.whole).sum()
    }

    /// Bytes of everything the ranks divide among themselves.
    pub fn divided_bytes(&self) -> u64 {
        self.all().flat_map(|h| h.parts).sum()
    }

    /// Every place's bytes.
    fn all(&self) -> impl Iterator<Item = &Held> {
        self.by_layer.iter().chain([&self.first, &self.last, &self.every])
    }
}

/// The slices of a group whose ranks hold parts in proportion to `shares` (one per rank; equal shares
/// for a group of equal nodes), or why `model` cannot be divided so (see [`Divider`]).
pub fn plan(model: &Model, shares: &[f64]) -> Result<Vec<TensorSlice>, String> {
    Divider::of(model)?.plan(shares)
}

/// Exact bytes of the tensors a rank holding `slice` maps of the whole model (every layer, the
/// embeddings whole, and its share of the output head: of the embeddings' rows, when tied to them),
/// read tensor by tensor from the file.
pub fn rank_bytes(model: &Model, slice: &TensorSlice) -> Result<u64, String> {
    rank_bytes_in(model, slice, 0..model.config().layers)
}

/// [`rank_bytes`] of a rank of a group over `layers` only (groups chained as pipeline stages): the
/// embeddings only on the first layers' ranks, the output head only on the last layers'.
pub fn rank_bytes_in(model: &Model, slice: &TensorSlice, layers: Range<usize>) -> Result<u64, String> {
    let mut total = 0;
    for (t, info) in declared_tensors_in(model, layers) {
        total += slice.source(info, t.split)?.bytes();
    }
    Ok(total)
}

/// The byte ranges of each file of `model` (its one file, or each part of a split set, in order) that a
/// rank holding `slice` reads: what a node fetches for that rank, and checks is present before mapping.
pub fn rank_ranges(model: &Model, slice: &TensorSlice) -> Result<Vec<Vec<Range<u64>>>, String> {
    rank_ranges_in(model, slice, 0..model.config().layers)
}

/// [`rank_ranges`] of a rank of a group over `layers` only.
pub fn rank_ranges_in(
    model: &Model,
    slice: &TensorSlice,
    layers: Range<usize>,
) -> Result<Vec<Vec<Range<u64>>>, String> {
    let mut by_part = vec![Vec::new(); model.parts().len()];
    for (t, info) in declared_tensors_in(model, layers) {
        let part = model.parts().iter().position(|p| p.tensor(&info.name).is_some()).unwrap_or(0);
        let source = slice.source(info, t.split)?;
        by_part[part].extend(source.pieces.iter().map(|&(offset, bytes)| offset..offset + bytes));
    }
    Ok(by_part)
}

/// The layer a tensor named `blk.N.…` belongs to.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

fn index(part: Part) -> usize {
    PARTS.iter().position(|p| *p == part).unwrap_or(0)
}

/// The parts of a model a tensor-parallel group divides, and their sizes.
fn totals(config: &ModelConfig, declared: &[(ExpectedTensor, &TensorInfo)]) -> [usize; 6] {
    // The shared experts' width is that of their tensors.
    let shared = declared
        .iter()
        .find(|(t, _)| t.split == Split::Along { dim: 1, part: Part::SharedFeedForward })
        .map_or(0, |(t, _)| t.shape[1] as usize);
    [
        config.heads,
        config.kv_heads,
        config.feed_forward,
        shared,
        config.moe.as_ref().map_or(0, |m| m.experts),
        config.vocabulary,
    ]
}

/// Every tensor of the model whole, as declared, with its file entry (the output head: the token
/// embedding's, read as the head, when tied).
fn declared_tensors(model: &Model) -> Vec<(ExpectedTensor, &TensorInfo)> {
    declared_tensors_in(model, 0..model.config().layers)
}

/// [`declared_tensors`] of a stage of `layers` ([`layout::stage_tensors`]).
fn declared_tensors_in(model: &Model, layers: Range<usize>) -> Vec<(ExpectedTensor, &TensorInfo)> {
    let tied = model.layout().tied_output;
    layout::stage_tensors(model.config(), layers)
        .into_iter()
        .filter_map(|t| {
            let name = if tied && t.name == layout::OUTPUT { layout::TOKEN_EMBEDDING } else { t.name.as_str() };
            let info = model.tensor(name)?;
            Some((t, info))
        })
        .collect()
}

/// Divides `count` units into shares proportional to `shares`, each a multiple of `align` (the last
/// takes what is left) and at least `align` when `count` allows.
fn proportional(count: usize, shares: &[f64], align: usize) -> Vec<Range<usize>> {
    let align = align.max(1);
    let units = count / align;
    let sum: f64 = shares.iter().sum();
    let mut ranges = Vec::with_capacity(shares.len());
    let mut start = 0;
    let mut before = 0.0;
    for (i, share) in shares.iter().enumerate() {
        before += share;
        let left = shares.len() - i - 1;
        let end = if left == 0 {
            count
        } else {
            let ideal = (units as f64 * before / sum).round() as usize;
            // Leave at least one unit for each rank after this one, and take at least one.
            (ideal.clamp(start / align + 1, units.saturating_sub(left).max(start / align + 1))) * align
        };
        ranges.push(start..end.min(count));
        start = end.min(count);
    }
    ranges
}

fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportional_shares_are_aligned_and_cover_everything() {
        assert_eq!(proportional(9, &[1.0, 1.0], 1), vec![0..5, 5..9]);
        assert_eq!(proportional(3, &[1.0, 1.0], 1), vec![0..2, 2..3]);
        assert_eq!(proportional(1536, &[1.0, 1.0, 1.0], 256), vec![0..512, 512..1024, 1024..1536]);
        assert_eq!(proportional(49152, &[2.0, 1.0], 32), vec![0..32768, 32768..49152]);
        // Every rank gets at least one step, whatever its share.
        assert_eq!(proportional(4, &[100.0, 1.0, 1.0], 1), vec![0..2, 2..3, 3..4]);
        assert_eq!(proportional(64, &[1.0, 0.0001], 1), vec![0..63, 63..64]);
    }

    #[test]
    fn tensors_name_their_layer() {
        assert_eq!(layer_of("blk.12.ffn_down_exps.weight"), Some(12));
        assert_eq!(layer_of("blk.0.attn_q.weight"), Some(0));
        assert_eq!(layer_of("token_embd.weight"), None);
        assert_eq!(layer_of("blk.x.attn_q.weight"), None);
    }

    #[test]
    fn least_common_multiples() {
        assert_eq!(lcm(1, 32), 32);
        assert_eq!(lcm(32, 256), 256);
        assert_eq!(lcm(32, 48), 96);
    }
}
