//! How a tensor-parallel group divides a model: which attention heads, feed-forward columns, experts
//! and vocabulary rows each rank holds, and where a rank's share of each tensor lies in the file.
//!
//! Each architecture declares how its tensors split ([`Split`] on each [`ExpectedTensor`]): Q, K and V
//! by rows of whole heads, the output projection by the matching input columns, the feed-forward's gate
//! and up by rows and its down projection by columns, experts whole, the output head by vocabulary rows;
//! everything else (norms, the router, the token embeddings) every rank holds whole. The plan here gives
//! each rank, in proportion to its share, query heads (with the key/value heads they read: a group
//! whose query heads two ranks divide is held by both), whole experts, the feed-forward's columns (cut
//! only where the quantization blocks of the tensors split by columns allow) and rows of the output head.

mod divide;

pub use divide::{plan, rank_bytes, rank_bytes_in, rank_ranges, rank_ranges_in, Divider};

use super::gguf::TensorInfo;
use super::layout::{Part, Split};
use std::ops::Range;

/// Most ranks a tensor-parallel group is planned with (a Thunderbolt mesh links at most 8 Macs).
pub const MAX_GROUP: usize = 8;

/// Every part a group divides.
pub const PARTS: [Part; 6] =
    [Part::QueryHeads, Part::KvHeads, Part::FeedForward, Part::SharedFeedForward, Part::Experts, Part::Vocabulary];

/// One rank's share of a model: for each part, the units it holds (heads, columns, experts, rows) of
/// how many there are.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, ts_rs::TS)]
pub struct TensorSlice {
    pub rank: usize,
    pub ranks: usize,
    /// Query heads, by share.
    pub query_heads: Range<usize>,
    /// The key/value heads its query heads read: a group whose query heads two ranks divide is held
    /// by both.
    pub kv_heads: Range<usize>,
    /// Columns of the dense feed-forward's inner width.
    pub feed_forward: Range<usize>,
    /// Columns of the shared experts' inner width.
    pub shared_feed_forward: Range<usize>,
    /// Routed experts.
    pub experts: Range<usize>,
    /// Rows of the output head.
    pub vocabulary: Range<usize>,
    /// How many units of each part the model has, in [`PARTS`] order.
    pub totals: [usize; 6],
}

/// Where a rank's share of one tensor lies: byte ranges of the file (one when contiguous), and its shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceSource {
    pub shape: Vec<u64>,
    /// (absolute file offset, bytes), in the order the share's bytes follow each other.
    pub pieces: Vec<(u64, u64)>,
}

impl SliceSource {
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.1).sum()
    }
}

impl TensorSlice {
    /// The units of `part` this rank holds.
    pub fn range(&self, part: Part) -> Range<usize> {
        match part {
            Part::QueryHeads => self.query_heads.clone(),
            Part::KvHeads => self.kv_heads.clone(),
            Part::FeedForward => self.feed_forward.clone(),
            Part::SharedFeedForward => self.shared_feed_forward.clone(),
            Part::Experts => self.experts.clone(),
            Part::Vocabulary => self.vocabulary.clone(),
        }
    }

    pub fn total(&self, part: Part) -> usize {
        self.totals[PARTS.iter().position(|p| *p == part).expect("every part is listed")]
    }

    /// This rank's query heads in runs that attend alike: (query heads, the key/value heads they read),
    /// both counted from the rank's first, with as many query heads per key/value head throughout a run.
    /// A rank holding whole groups has one run; one holding part of a group at either end has a run for
    /// that part.
    pub fn head_runs(&self) -> Vec<(Range<usize>, Range<usize>)> {
        let (heads, kv_heads) = (self.total(Part::QueryHeads), self.total(Part::KvHeads).max(1));
        let group = (heads / kv_heads).max(1);
        let (q, kv) = (&self.query_heads, &self.kv_heads);
        let mut runs: Vec<(Range<usize>, Range<usize>)> = Vec::new();
        for j in kv.clone() {
            let held = q.start.max(j * group)..q.end.min((j + 1) * group);
            let local = (held.start - q.start..held.end - q.start, j - kv.start..j - kv.start + 1);
            match runs.last_mut() {
                Some((rq, rkv)) if rq.len() / rkv.len() == held.len() => {
                    rq.end = local.0.end;
                    rkv.end = local.1.end;
                }
                _ => runs.push(local),
            }
        }
        runs
    }

    /// Whether this rank holds everything (a group of one).
    pub fn is_whole(&self) -> bool {
        self.ranks == 1
    }

    /// Elements of a dimension of `length` elements that split by `part` (each unit of the part is
    /// `length / total` of them) this rank holds.
    fn elements(&self, part: Part, length: u64) -> Range<u64> {
        let total = self.total(part).max(1) as u64;
        let per_unit = length / total;
        let r = self.range(part);
        r.start as u64 * per_unit..r.end as u64 * per_unit
    }

    /// This rank's share of tensor `info`, split as `split` says: its shape and the byte ranges it reads.
    /// Fails when the share does not fall on whole quantization blocks (the plan avoids that).
    pub fn source(&self, info: &TensorInfo, split: Split) -> Result<SliceSource, String> {
        let (dim, part) = match split {
            Split::Whole => {
                return Ok(SliceSource { shape: info.shape.clone(), pieces: vec![(info.offset, info.bytes)] })
            }
            Split::Along { dim, part } => (dim, part),
            Split::AfterWhole { whole, part } => return self.source_after_whole(info, whole, part),
        };
        let shape = &info.shape;
        if dim >= shape.len() {
            return Err(format!("{} has no dimension {dim} to split", info.name));
        }
        let total = self.total(part).max(1) as u64;
        if !shape[dim].is_multiple_of(total) {
            return Err(format!("{}'s dimension {dim} ({}) does not divide into {total} parts", info.name, shape[dim]));
        }
        let elements = self.elements(part, shape[dim]);
        let mut local = shape.clone();
        local[dim] = elements.end - elements.start;
        let dtype = info.dtype;
        let unsplit = |e: u64| {
            dtype.row_bytes(e).ok_or_else(|| {
                format!(
                    "{} ({}, blocks of {} values) cannot be split at value {e}",
                    info.name,
                    dtype.name(),
                    dtype.block_elements()
                )
            })
        };
        let row = unsplit(shape[0])?;
        // Bytes of one step along `dim`, and of the whole extent of `dim` (which the outer dimensions repeat).
        let (start, len, extent) = if dim == 0 {
            (unsplit(elements.start)?, unsplit(elements.end)? - unsplit(elements.start)?, row)
        } else {
            let step: u64 = row * shape[1..dim].iter().product::<u64>();
            (elements.start * step, (elements.end - elements.start) * step, step * shape[dim])
        };
        let outer: u64 = shape[dim + 1..].iter().product();
        let pieces = if outer == 1 || len == extent {
            vec![(info.offset + start, len * if len == extent { outer } else { 1 })]
        } else {
            (0..outer).map(|o| (info.offset + o * extent + start, len)).collect()
        };
        Ok(SliceSource { shape: local, pieces })
    }

    /// [`TensorSlice::source`] of a tensor whose first `whole` rows every rank holds and whose other
    /// rows `part` divides: the leading rows, then the rank's.
    fn source_after_whole(&self, info: &TensorInfo, whole: u64, part: Part) -> Result<SliceSource, String> {
        let shape = &info.shape;
        let rows = *shape.last().ok_or_else(|| format!("{} has no rows", info.name))?;
        let divided = rows.checked_sub(whole).ok_or_else(|| format!("{} has fewer than {whole} rows", info.name))?;
        let total = self.total(part).max(1) as u64;
        if !divided.is_multiple_of(total) {
            return Err(format!(
                "{}'s {divided} rows after the first {whole} do not divide into {total} parts",
                info.name
            ));
        }
        let row_bytes = info.bytes / rows.max(1);
        let elements = self.elements(part, divided);
        let mut local = shape.clone();
        let last = local.len() - 1;
        local[last] = whole + elements.end - elements.start;
        let leading = (info.offset, whole * row_bytes);
        let own = (info.offset + (whole + elements.start) * row_bytes, (elements.end - elements.start) * row_bytes);
        Ok(SliceSource { shape: local, pieces: vec![leading, own] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(query_heads: Range<usize>, kv_heads: Range<usize>, totals: (usize, usize)) -> TensorSlice {
        TensorSlice {
            rank: 0,
            ranks: 2,
            query_heads,
            kv_heads,
            feed_forward: 0..0,
            shared_feed_forward: 0..0,
            experts: 0..0,
            vocabulary: 0..0,
            totals: [totals.0, totals.1, 0, 0, 0, 0],
        }
    }

    #[test]
    fn query_heads_attend_in_runs_of_whole_and_partial_groups() {
        // 9 heads in 3 groups of 3, divided 5:4: the first rank holds group 0 whole and 2 heads of group 1.
        assert_eq!(slice(0..5, 0..2, (9, 3)).head_runs(), vec![(0..3, 0..1), (3..5, 1..2)]);
        assert_eq!(slice(5..9, 1..3, (9, 3)).head_runs(), vec![(0..1, 0..1), (1..4, 1..2)]);
        // Whole groups: one run.
        assert_eq!(slice(3..9, 1..3, (9, 3)).head_runs(), vec![(0..6, 0..2)]);
        // Fewer key/value heads than ranks: part of one group.
        assert_eq!(slice(4..8, 0..1, (8, 1)).head_runs(), vec![(0..4, 0..1)]);
        // A partial group at both ends, whole ones between.
        assert_eq!(slice(2..14, 0..4, (16, 4)).head_runs(), vec![(0..2, 0..1), (2..10, 1..3), (10..12, 3..4)]);
        // Without grouping (as many key/value heads as query heads): one run.
        assert_eq!(slice(3..7, 3..7, (8, 8)).head_runs(), vec![(0..4, 0..4)]);
    }
}
