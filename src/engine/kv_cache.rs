//! A stage's key/value cache: for each of its layers, the keys and values of every position of every
//! sequence it serves, in F16 as llama.cpp keeps them (or quantized to Q8_0 or Q4_0 on request, as
//! llama.cpp's `-ctk`/`-ctv` do: see [`KvType`]), each layer as wide as its architecture declares
//! (for DeepSeek's latent attention, one compressed latent per position that serves as keys and values).
//! A sliding-window layer keeps only a ring of the last positions it can still see.

use super::EngineError;
use crate::ggml::{DType, Device, GraphBuilder, SetTensor, SetTensorRef, Tensor, TensorSet};
use crate::model::CacheRow;
use half::f16;
use std::ops::Range;

/// The element type of a KV cache: F16 (the default), or Q8_0 / Q4_0 blocks of 32 values — about half
/// and a quarter of F16's bytes, for longer contexts in the same memory, at the cost of their rounding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    #[default]
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub fn dtype(self) -> DType {
        match self {
            KvType::F16 => DType::F16,
            KvType::Q8_0 => DType::Q8_0,
            KvType::Q4_0 => DType::Q4_0,
        }
    }

    /// Bytes of `values` values (a whole number of blocks for the quantized types: see
    /// [`KvType::check_heads`]).
    pub fn bytes(self, values: usize) -> u64 {
        let dtype = self.dtype();
        dtype.row_bytes(values as u64).unwrap_or_else(|| (values as u64).div_ceil(32) * dtype.block_bytes())
    }

    /// Whether a model of `config` can keep its cache in this type: not DeepSeek's latent attention or
    /// MiniMax M3's block-sparse attention (not done yet), and heads as [`KvType::check_heads`] says.
    pub fn check_model(self, config: &crate::model::ModelConfig) -> Result<(), String> {
        if self != KvType::F16 && config.latent_attention.is_some() {
            return Err(format!(
                "a {} KV cache for latent attention (DeepSeek) is not done yet; use --kv-type f16",
                self.name()
            ));
        }
        if self != KvType::F16 && config.block_sparse.is_some() {
            return Err(format!(
                "a {} KV cache for block-sparse attention (MiniMax M3) is not done yet; use --kv-type f16",
                self.name()
            ));
        }
        self.check_heads(config.head_dim, config.value_dim)
    }

    /// Whether a cache of this type can hold heads `key_head` and `value_head` values wide: the quantized
    /// types store blocks of 32 values, and attention reads a head at a time.
    pub fn check_heads(self, key_head: usize, value_head: usize) -> Result<(), String> {
        if self == KvType::F16 || (key_head.is_multiple_of(32) && value_head.is_multiple_of(32)) {
            return Ok(());
        }
        Err(format!(
            "a {} KV cache stores blocks of 32 values, and this model's heads are {key_head} (keys) and \
             {value_head} (values) wide; use --kv-type f16",
            self.name()
        ))
    }

    /// The widths of the Walsh-Hadamard rotations that keys (with the queries) and values take before a
    /// cache of this type stores them, as llama.cpp rotates them (`n_rot_k`, `n_rot_v`): none for F16;
    /// for a quantized cache, keys in the largest power of two from 64 that divides the head, values in
    /// runs of 64 — where the heads are a multiple of 64 wide. Rotating spreads a head's outliers over
    /// its blocks, so the blocks' scales lose less.
    pub fn rotations(self, key_head: usize, value_head: usize) -> (Option<usize>, Option<usize>) {
        if self == KvType::F16 {
            return (None, None);
        }
        let key = key_head.is_multiple_of(64).then(|| {
            let mut n = 64;
            while key_head.is_multiple_of(2 * n) {
                n *= 2;
            }
            n
        });
        (key, value_head.is_multiple_of(64).then_some(64))
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }
}

/// The orthonormal Walsh-Hadamard matrix of width `n` (a power of two), row by row: every entry
/// ±1/√n, built by doubling as llama.cpp builds it, so the two rotate alike. It is its own inverse.
pub fn hadamard(n: usize) -> Vec<f32> {
    let mut h = vec![0f32; n * n];
    h[0] = 1.0 / (n as f32).sqrt();
    let mut s = 1;
    while s < n {
        for i in 0..s {
            for j in 0..s {
                let v = h[i * n + j];
                h[(i + s) * n + j] = v;
                h[i * n + j + s] = v;
                h[(i + s) * n + j + s] = -v;
            }
        }
        s *= 2;
    }
    h
}

impl std::str::FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<KvType, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            "q4_0" => Ok(KvType::Q4_0),
            other => Err(format!("{other:?} is not a KV cache type: f16, q8_0 or q4_0")),
        }
    }
}

/// Positions in the cache are counted in blocks of this many, so a decode graph keeps the same shape
/// (and can be reused) for that many tokens. llama.cpp pads the same way.
pub const CACHE_BLOCK: usize = 256;

/// Positions a layer caching `row` holds per sequence: the whole `context` (whole blocks), or for a
/// sliding-window layer a ring of the last positions — its window plus a step's tokens less one (what
/// the step's first token still sees), in whole blocks, never more than the context.
pub fn positions_held(row: &CacheRow, context: usize, batch: usize) -> usize {
    let context = context.max(1).div_ceil(CACHE_BLOCK) * CACHE_BLOCK;
    match row.window {
        Some(window) => ring_positions(window, context, batch),
        None => context,
    }
}

/// Positions the ring of a sliding layer with `window` holds per sequence (see [`positions_held`]).
pub fn ring_positions(window: usize, context: usize, batch: usize) -> usize {
    let context = context.max(1).div_ceil(CACHE_BLOCK) * CACHE_BLOCK;
    ((window + batch.max(1) - 1).div_ceil(CACHE_BLOCK) * CACHE_BLOCK).min(context)
}

/// Bytes one position of a layer caching `row` takes in a cache of `kv_type`.
pub fn bytes_per_position(row: &CacheRow, kv_type: KvType) -> u64 {
    let values = if row.values_in_keys { 0 } else { kv_type.bytes(row.value_width) };
    kv_type.bytes(row.key_width) + values
}

pub struct KvCache {
    /// None when no layer of the stage caches positions (only linear-attention layers).
    set: Option<TensorSet>,
    /// Each layer's keys (none for a linear-attention layer) and, unless they live in the keys, its
    /// values.
    keys: Vec<Option<SetTensorRef>>,
    values: Vec<Option<SetTensorRef>>,
    /// What each layer holds per position.
    rows: Vec<CacheRow>,
    /// The sliding window and the ring of positions the stage's sliding layers keep (position `p` in
    /// row `p % ring`), when it has such layers.
    sliding: Option<(usize, usize)>,
    /// Positions per sequence (a multiple of [`CACHE_BLOCK`]).
    context: usize,
    kv_type: KvType,
    sequences: usize,
    /// Filled positions of each sequence.
    lengths: Vec<usize>,
    /// One past the highest position written to each sequence since it last started at 0: what a ring
    /// may hold that a rewind then made stale.
    high_water: Vec<usize>,
}

impl KvCache {
    /// A zeroed cache of `kv_type` on `device` for layers holding `rows` per position (one entry per
    /// layer), `context` positions (rounded up to a whole block) for each of `sequences` sequences,
    /// written in steps of at most `batch` tokens.
    pub fn new(
        rows: &[CacheRow],
        context: usize,
        sequences: usize,
        batch: usize,
        device: Device,
        kv_type: KvType,
    ) -> Result<KvCache, EngineError> {
        let context = context.max(1).div_ceil(CACHE_BLOCK) * CACHE_BLOCK;
        let sequences = sequences.max(1);
        let mut specs: Vec<(String, [u64; 2])> = Vec::new();
        for (l, row) in rows.iter().enumerate().filter(|(_, row)| row.key_width > 0) {
            let positions = (positions_held(row, context, batch) * sequences) as u64;
            specs.push((format!("cache_k_{l}"), [row.key_width as u64, positions]));
            if !row.values_in_keys {
                specs.push((format!("cache_v_{l}"), [row.value_width as u64, positions]));
            }
        }
        let tensors: Vec<SetTensor<'_>> =
            specs.iter().map(|(name, shape)| SetTensor { name, dtype: kv_type.dtype(), shape }).collect();
        let set = match tensors.is_empty() {
            true => None,
            false => Some(
                TensorSet::allocate(&tensors, device)
                    .map_err(|e| EngineError::OutOfMemory(format!("KV cache: {e}")))?,
            ),
        };
        let get = |name: String| set.as_ref().and_then(|set| set.get(&name));
        let keys = (0..rows.len()).map(|l| get(format!("cache_k_{l}"))).collect();
        let values = (0..rows.len()).map(|l| get(format!("cache_v_{l}"))).collect();
        let sliding = rows.iter().find_map(|row| row.window.map(|w| (w, positions_held(row, context, batch))));
        Ok(KvCache {
            set,
            keys,
            values,
            rows: rows.to_vec(),
            sliding,
            context,
            kv_type,
            sequences,
            lengths: vec![0; sequences],
            high_water: vec![0; sequences],
        })
    }

    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Bytes of the cache.
    pub fn bytes(&self) -> u64 {
        self.set.as_ref().map_or(0, TensorSet::data_bytes)
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

    /// Records that positions `start..end` of `seq` were written.
    pub(super) fn wrote(&mut self, seq: usize, start: usize, end: usize) {
        self.lengths[seq] = end;
        self.high_water[seq] = if start == 0 { end } else { self.high_water[seq].max(end) };
    }

    /// Whether a step may (re)write `seq` from `start`: a sliding layer's ring must still hold the
    /// positions the step's first token sees, which later positions written since overwrite.
    pub(super) fn check_resume(&self, seq: usize, start: usize) -> Result<(), String> {
        let Some((window, ring)) = self.sliding else { return Ok(()) };
        let needed_from = start.saturating_sub(window - 1);
        let held_from = self.high_water[seq].saturating_sub(ring);
        if start > 0 && needed_from < held_from {
            return Err(format!(
                "cannot go back to position {start}: this stage's sliding-window layers keep only the last {ring} \
                 positions, and position {needed_from} is gone; start the sequence again from 0"
            ));
        }
        Ok(())
    }

    /// Bytes a copy of the first `positions` positions of one sequence takes (see [`KvCache::copy_out`]).
    pub fn copy_bytes(&self, positions: usize) -> usize {
        let tensors = self.keys.iter().chain(&self.values).flatten();
        tensors.map(|t| positions * t.bytes() / t.shape()[1].max(1) as usize).sum()
    }

    /// Appends to `out` the rows of positions `0..positions` of `seq` in every layer (keys, then values,
    /// layer by layer): what a saved prefix holds of this stage. A sliding layer's ring cannot give back
    /// a prefix in order, so a stage with one refuses.
    pub fn copy_out(&self, seq: usize, positions: usize, out: &mut Vec<u8>) -> Result<(), String> {
        self.check_copy(seq, positions)?;
        for tensor in self.keys.iter().chain(&self.values).flatten() {
            let row = tensor.bytes() / tensor.shape()[1] as usize;
            let at = out.len();
            out.resize(at + positions * row, 0);
            tensor.read_bytes(seq * self.context * row, &mut out[at..])?;
        }
        Ok(())
    }

    /// Writes back into `seq` the first `positions` positions of what [`KvCache::copy_out`] gave for
    /// `saved` positions, from the start of `data`; how many bytes it read (all `saved` positions'). The
    /// sequence then holds those positions.
    pub fn copy_in(&mut self, seq: usize, saved: usize, positions: usize, data: &[u8]) -> Result<usize, String> {
        self.check_copy(seq, saved)?;
        let needed = self.copy_bytes(saved);
        if positions > saved || data.len() < needed {
            return Err(format!("a saved prefix of {saved} positions is {needed} bytes, {} came", data.len()));
        }
        let mut at = 0;
        for tensor in self.keys.iter().chain(&self.values).flatten() {
            let row = tensor.bytes() / tensor.shape()[1] as usize;
            tensor.write_bytes(seq * self.context * row, &data[at..at + positions * row])?;
            at += saved * row;
        }
        self.lengths[seq] = positions;
        self.high_water[seq] = positions;
        Ok(at)
    }

    fn check_copy(&self, seq: usize, positions: usize) -> Result<(), String> {
        if self.sliding.is_some() {
            return Err("this stage's sliding-window layers keep a ring, not a prefix: it saves no prefix".into());
        }
        if seq >= self.sequences || positions > self.context {
            return Err(format!("no positions 0..{positions} of sequence {seq} in this cache"));
        }
        Ok(())
    }

    /// Cache rows a graph for `seq` attends over when its last position is `end - 1`: whole blocks.
    pub fn attended(&self, end: usize) -> usize {
        end.div_ceil(CACHE_BLOCK).max(1).min(self.context / CACHE_BLOCK) * CACHE_BLOCK
    }

    /// Ring rows a sliding layer attends over when the step's last position is `end - 1`: the whole ring
    /// once it has filled, before that only the blocks written (0 when the stage has no sliding layer).
    pub fn attended_sliding(&self, end: usize) -> usize {
        self.sliding.map_or(0, |(_, ring)| self.attended(end).min(ring))
    }

    /// Global cache row of position `pos` of `seq`.
    pub fn row(&self, seq: usize, pos: usize) -> i64 {
        (seq * self.context + pos) as i64
    }

    /// Global row of position `pos` of `seq` in the sliding layers' rings.
    pub fn sliding_row(&self, seq: usize, pos: usize) -> i64 {
        let ring = self.sliding.map_or(self.context, |(_, ring)| ring);
        (seq * ring + pos % ring) as i64
    }

    /// Appends to `mask` the mask of the sliding layers for a step writing positions `start..start +
    /// tokens` of one sequence: row `i` says which of the first `attended` ring rows token `i` sees (0)
    /// or not (-∞). After the step's writes, ring row `r` holds the one position of `end - ring..end`
    /// that is `r` modulo the ring; a token sees it when it is not in the future and less than the
    /// window behind.
    pub(super) fn push_sliding_mask(&self, mask: &mut Vec<f16>, start: usize, tokens: usize, attended: usize) {
        let Some((window, ring)) = self.sliding else { return };
        let (ring, end) = (ring as i64, (start + tokens) as i64);
        let base = end - ring;
        let at = mask.len();
        mask.resize(at + attended * tokens, f16::NEG_INFINITY);
        for i in 0..tokens {
            let q = (start + i) as i64;
            for r in 0..attended {
                let p = base + (r as i64 - base).rem_euclid(ring);
                if p >= 0 && p <= q && q - p < window as i64 {
                    mask[at + i * attended + r] = f16::ZERO;
                }
            }
        }
    }

    fn keys_of(&self, layer: usize) -> &SetTensorRef {
        self.keys[layer].as_ref().expect("only layers that attend over the cache store and read it")
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
        g.expand(g.set_rows(g.stored(self.keys_of(layer)), k, rows));
        if let (Some(v_cache), Some(v)) = (&self.values[layer], v) {
            g.expand(g.set_rows(g.stored(v_cache), v, rows));
        }
    }

    /// Views of `layer`'s keys and values of the sequences `seqs`, the first `attended` positions of each
    /// (of a sliding layer: of its ring), shaped [key_head, heads, attended, sequences] and [value_head,
    /// heads, attended, sequences]. Values that live in the keys are the first `value_head` of each key
    /// row.
    pub(super) fn view<'g>(
        &self,
        g: &'g GraphBuilder,
        layer: usize,
        seqs: Range<usize>,
        attended: usize,
        key_head: usize,
        value_head: usize,
    ) -> (Tensor<'g>, Tensor<'g>) {
        let held = match (self.rows[layer].window, self.sliding) {
            (Some(_), Some((_, ring))) => ring,
            _ => self.context,
        };
        let row = self.rows[layer];
        let sequences = seqs.len() as i64;
        // `width` values of each head, heads `head_width` apart in the first `heads_width` of rows of
        // `row_width`; one sequence's rows `held` rows after the one before's.
        let bytes = |values: usize| self.kv_type.bytes(values) as usize;
        let of = |cache: Tensor<'g>, width: usize, head_width: usize, heads_width: usize, row_width: usize| {
            let row_bytes = bytes(row_width);
            g.view(
                cache,
                &[width as i64, (heads_width / head_width) as i64, attended as i64, sequences],
                &[bytes(head_width), row_bytes, held * row_bytes],
                seqs.start * held * row_bytes,
            )
        };
        let k_cache = g.stored(self.keys_of(layer));
        let attention_keys = row.key_width - row.indexer_width;
        let k = of(k_cache, key_head, key_head, attention_keys, row.key_width);
        let v = match &self.values[layer] {
            Some(v_cache) => of(g.stored(v_cache), value_head, value_head, row.value_width, row.value_width),
            None => of(k_cache, value_head, key_head, attention_keys, row.key_width),
        };
        (k, v)
    }

    /// The lightning indexer's cached keys of `layer` (the end of each key row: [`CacheRow::indexer_width`])
    /// for the sequences `seqs`, the first `attended` positions of each: [width, 1, attended, sequences].
    pub(super) fn indexer_view<'g>(
        &self,
        g: &'g GraphBuilder,
        layer: usize,
        seqs: Range<usize>,
        attended: usize,
    ) -> Tensor<'g> {
        let row = self.rows[layer];
        let bytes = |values: usize| self.kv_type.bytes(values) as usize;
        let row_bytes = bytes(row.key_width);
        g.view(
            g.stored(self.keys_of(layer)),
            &[row.indexer_width as i64, 1, attended as i64, seqs.len() as i64],
            &[row_bytes, row_bytes, self.context * row_bytes],
            seqs.start * self.context * row_bytes + bytes(row.key_width - row.indexer_width),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sliding_cache(window: usize, batch: usize) -> KvCache {
        let row =
            CacheRow { key_width: 2, value_width: 2, values_in_keys: false, window: Some(window), indexer_width: 0 };
        let full = CacheRow { window: None, ..row };
        KvCache::new(&[row, full], 2048, 1, batch, Device::cpu(), KvType::F16).unwrap()
    }

    /// Over a long sequence taken in steps of every size up to the batch, each token sees through the
    /// mask exactly the ring rows that hold the positions of its window, which are where those
    /// positions were written.
    #[test]
    fn each_token_sees_exactly_its_window_in_the_ring() {
        for (window, batch) in [(5, 4), (4, 1), (128, 32), (300, 7)] {
            let mut cache = sliding_cache(window, batch);
            let ring = positions_held(&cache.rows[0], 2048, batch);
            assert!(ring < 2048 && ring >= window + batch - 1);
            // Where each position was last written, as the stage writes them.
            let mut written: Vec<Option<usize>> = vec![None; ring];
            let (mut start, mut step, mut mask) = (0, 1, Vec::new());
            while start + step <= 2000 {
                for p in start..start + step {
                    written[cache.sliding_row(0, p) as usize] = Some(p);
                }
                let attended = cache.attended_sliding(start + step);
                mask.clear();
                cache.push_sliding_mask(&mut mask, start, step, attended);
                for i in 0..step {
                    let q = start + i;
                    let seen: Vec<usize> = (0..attended)
                        .filter(|&r| mask[i * attended + r] == f16::ZERO)
                        .map(|r| written[r].expect("a visible row was written"))
                        .collect();
                    let mut seen = seen;
                    seen.sort();
                    let want: Vec<usize> = (q.saturating_sub(window - 1)..=q).collect();
                    assert_eq!(seen, want, "window {window}, token at {q}");
                }
                cache.wrote(0, start, start + step);
                start += step;
                step = step % batch + 1;
            }
        }
    }

    #[test]
    fn the_hadamard_matrix_is_orthonormal_and_its_own_inverse() {
        for n in [64, 128, 256] {
            let h = hadamard(n);
            for i in 0..n {
                for j in 0..n {
                    let dot: f32 = (0..n).map(|k| h[i * n + k] * h[k * n + j]).sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((dot - want).abs() < 1e-5, "n {n}: (H·H)[{i}][{j}] = {dot}");
                }
            }
        }
        assert_eq!(KvType::Q8_0.rotations(64, 64), (Some(64), Some(64)));
        assert_eq!(KvType::Q4_0.rotations(256, 256), (Some(256), Some(64)));
        assert_eq!(KvType::Q8_0.rotations(192, 96), (Some(64), None));
        assert_eq!(KvType::F16.rotations(128, 128), (None, None));
    }

    #[test]
    fn going_back_is_refused_once_the_ring_lost_the_positions_needed() {
        let mut cache = sliding_cache(5, 4);
        for start in (0..600).step_by(4) {
            cache.wrote(0, start, start + 4);
        }
        // The ring of 256 holds positions 344..600: position 400 needs 396..399, position 340 needs 336.
        assert!(cache.check_resume(0, 400).is_ok());
        assert!(cache.check_resume(0, 340).unwrap_err().contains("start the sequence again from 0"));
        assert!(cache.check_resume(0, 0).is_ok());
        cache.wrote(0, 0, 4);
        assert!(cache.check_resume(0, 4).is_ok());
    }
}
