//! A stage's key/value cache: for each of its layers, the keys and values of every position of every
//! sequence it serves, in F16 as llama.cpp keeps them, each layer as wide as its architecture declares
//! (for DeepSeek's latent attention, one compressed latent per position that serves as keys and values).

use super::EngineError;
use crate::ggml::{DType, GraphBuilder, SetTensor, SetTensorRef, Tensor, TensorSet};
use crate::model::CacheRow;

/// Positions in the cache are counted in blocks of this many, so a decode graph keeps the same shape
/// (and can be reused) for that many tokens. llama.cpp pads the same way.
pub const CACHE_BLOCK: usize = 256;

pub struct KvCache {
    set: TensorSet,
    /// Each layer's keys and, unless they live in the keys, its values.
    keys: Vec<SetTensorRef>,
    values: Vec<Option<SetTensorRef>>,
    /// What each layer holds per position.
    rows: Vec<CacheRow>,
    /// Positions per sequence (a multiple of [`CACHE_BLOCK`]).
    context: usize,
    sequences: usize,
    /// Filled positions of each sequence.
    lengths: Vec<usize>,
}

impl KvCache {
    /// A zeroed cache for layers holding `rows` per position (one entry per layer), `context` positions
    /// (rounded up to a whole block) for each of `sequences` sequences.
    pub fn new(rows: &[CacheRow], context: usize, sequences: usize) -> Result<KvCache, EngineError> {
        let context = context.max(1).div_ceil(CACHE_BLOCK) * CACHE_BLOCK;
        let sequences = sequences.max(1);
        let positions = (context * sequences) as u64;
        let mut specs: Vec<(String, [u64; 2])> = Vec::new();
        for (l, row) in rows.iter().enumerate() {
            specs.push((format!("cache_k_{l}"), [row.key_width as u64, positions]));
            if !row.values_in_keys {
                specs.push((format!("cache_v_{l}"), [row.value_width as u64, positions]));
            }
        }
        let tensors: Vec<SetTensor<'_>> =
            specs.iter().map(|(name, shape)| SetTensor { name, dtype: DType::F16, shape }).collect();
        let set = TensorSet::allocate(&tensors).map_err(|e| EngineError::OutOfMemory(format!("KV cache: {e}")))?;
        let keys = (0..rows.len()).map(|l| set.get(&format!("cache_k_{l}")).expect("allocated")).collect();
        let values = (0..rows.len()).map(|l| set.get(&format!("cache_v_{l}"))).collect();
        Ok(KvCache { set, keys, values, rows: rows.to_vec(), context, sequences, lengths: vec![0; sequences] })
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

    /// Adds to the graph the writes of this step's keys ([key_width, tokens]) and values ([value_width,
    /// tokens]; None when they live in the keys) of `layer` into rows `rows` (I64 [tokens]).
    pub(super) fn store<'g>(
        &self,
        g: &'g GraphBuilder,
        layer: usize,
        k: Tensor<'g>,
        v: Option<Tensor<'g>>,
        rows: Tensor<'g>,
    ) {
        g.expand(g.set_rows(g.stored(&self.keys[layer]), k, rows));
        if let (Some(v_cache), Some(v)) = (&self.values[layer], v) {
            g.expand(g.set_rows(g.stored(v_cache), v, rows));
        }
    }

    /// Views of `layer`'s keys and values of `seq`, the first `attended` positions, shaped
    /// [key_head, heads, attended] and [value_head, heads, attended]. Values that live in the keys are
    /// the first `value_head` of each key row.
    pub(super) fn view<'g>(
        &self,
        g: &'g GraphBuilder,
        layer: usize,
        seq: usize,
        attended: usize,
        key_head: usize,
        value_head: usize,
    ) -> (Tensor<'g>, Tensor<'g>) {
        let row = self.rows[layer];
        let key_row_bytes = row.key_width * 2;
        let heads = (row.key_width / key_head) as i64;
        let k_cache = g.stored(&self.keys[layer]);
        let k = g.view(
            k_cache,
            &[key_head as i64, heads, attended as i64],
            &[key_head * 2, key_row_bytes],
            seq * self.context * key_row_bytes,
        );
        let v = match &self.values[layer] {
            Some(v_cache) => {
                let value_row_bytes = row.value_width * 2;
                g.view(
                    g.stored(v_cache),
                    &[value_head as i64, (row.value_width / value_head) as i64, attended as i64],
                    &[value_head * 2, value_row_bytes],
                    seq * self.context * value_row_bytes,
                )
            }
            None => g.view(
                k_cache,
                &[value_head as i64, heads, attended as i64],
                &[key_head * 2, key_row_bytes],
                seq * self.context * key_row_bytes,
            ),
        };
        (k, v)
    }
}
