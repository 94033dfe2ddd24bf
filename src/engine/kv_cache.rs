//! A stage's key/value cache: for each of its layers, the keys and values of every position of every
//! sequence it serves, in F16 as llama.cpp keeps them.

use super::EngineError;
use crate::ggml::{DType, GraphBuilder, SetTensor, SetTensorRef, Tensor, TensorSet};

/// Positions in the cache are counted in blocks of this many, so a decode graph keeps the same shape
/// (and can be reused) for that many tokens. llama.cpp pads the same way.
pub const CACHE_BLOCK: usize = 256;

pub struct KvCache {
    set: TensorSet,
    keys: Vec<SetTensorRef>,
    values: Vec<SetTensorRef>,
    /// Positions per sequence (a multiple of [`CACHE_BLOCK`]).
    context: usize,
    sequences: usize,
    /// Row width: kv_heads × head_dim.
    width: usize,
    /// Filled positions of each sequence.
    lengths: Vec<usize>,
}

impl KvCache {
    /// A zeroed cache for `layers` layers of rows `width` wide, `context` positions (rounded up to a
    /// whole block) for each of `sequences` sequences.
    pub fn new(layers: usize, width: usize, context: usize, sequences: usize) -> Result<KvCache, EngineError> {
        let context = context.max(1).div_ceil(CACHE_BLOCK) * CACHE_BLOCK;
        let sequences = sequences.max(1);
        let shape = [width as u64, (context * sequences) as u64];
        let names: Vec<(String, String)> =
            (0..layers).map(|l| (format!("cache_k_{l}"), format!("cache_v_{l}"))).collect();
        let specs: Vec<SetTensor<'_>> = names
            .iter()
            .flat_map(|(k, v)| [k, v])
            .map(|name| SetTensor { name, dtype: DType::F16, shape: &shape })
            .collect();
        let set = TensorSet::allocate(&specs).map_err(|e| EngineError::OutOfMemory(format!("KV cache: {e}")))?;
        let keys = names.iter().map(|(k, _)| set.get(k).expect("allocated")).collect();
        let values = names.iter().map(|(_, v)| set.get(v).expect("allocated")).collect();
        Ok(KvCache { set, keys, values, context, sequences, width, lengths: vec![0; sequences] })
    }

    /// Bytes of the cache.
    pub fn bytes(&self) -> u64 {
        self.set.data_bytes()
    }

    pub fn context(&self) -> usize {
        self.context
    }

    pub fn sequences(&self) -> usize {
        self.sequences
    }

    pub fn len(&self, seq: usize) -> usize {
        self.lengths[seq]
    }

    pub fn is_empty(&self, seq: usize) -> bool {
        self.lengths[seq] == 0
    }

    /// Forgets positions `len..` of `seq` (they will be overwritten).
    pub fn truncate(&mut self, seq: usize, len: usize) {
        self.lengths[seq] = self.lengths[seq].min(len);
    }

    pub(super) fn set_len(&mut self, seq: usize, len: usize) {
        self.lengths[seq] = len;
    }

    /// Cache rows a graph for `seq` attends over when its last position is `end - 1`: whole blocks.
    pub fn attended(&self, end: usize) -> usize {
        end.div_ceil(CACHE_BLOCK).max(1).min(self.context / CACHE_BLOCK) * CACHE_BLOCK
    }

    /// Global cache row of position `pos` of `seq`.
    pub fn row(&self, seq: usize, pos: usize) -> i64 {
        (seq * self.context + pos) as i64
    }

    /// Adds to the graph the writes of this step's keys and values ([width, tokens]) of `layer` into
    /// rows `rows` (I64 [tokens]).
    pub(super) fn store<'g>(&self, g: &'g GraphBuilder, layer: usize, k: Tensor<'g>, v: Tensor<'g>, rows: Tensor<'g>) {
        let k_cache = g.stored(&self.keys[layer]);
        let v_cache = g.stored(&self.values[layer]);
        g.expand(g.set_rows(k_cache, k, rows));
        g.expand(g.set_rows(v_cache, v, rows));
    }

    /// Views of `layer`'s keys and values of `seq`, the first `attended` positions, shaped
    /// [head_dim, kv_heads, attended].
    pub(super) fn view<'g>(
        &self,
        g: &'g GraphBuilder,
        layer: usize,
        seq: usize,
        attended: usize,
        head_dim: usize,
    ) -> (Tensor<'g>, Tensor<'g>) {
        let row_bytes = self.width * 2;
        let shape = [head_dim as i64, (self.width / head_dim) as i64, attended as i64];
        let strides = [head_dim * 2, row_bytes];
        let offset = seq * self.context * row_bytes;
        let k = g.view(g.stored(&self.keys[layer]), &shape, &strides, offset);
        let v = g.view(g.stored(&self.values[layer]), &shape, &strides, offset);
        (k, v)
    }
}
