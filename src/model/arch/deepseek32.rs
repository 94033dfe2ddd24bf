//! DeepSeek V3.2 (`deepseek32`), and GLM-5 (`glm-dsa`, whose differences are in [`super::glm_dsa`]):
//! DeepSeek V3's layers (latent attention in the split form, with a query bottleneck; dense then routed
//! and shared experts) with DeepSeek sparse attention: a lightning indexer (`indexer.*`) scores every
//! earlier position for each query — its small heads' queries from the query bottleneck, one key per
//! position from the layer's input, layer-normed, both turned by RoPE (NeoX for DeepSeek) on their
//! first rotary values and by a Walsh-Hadamard rotation —, and each query attends only to the
//! `attention.indexer.top_k` positions it scores highest. The indexer's key is cached beside each
//! position's latent. Next-token-prediction layers are skipped.

use super::deepseek2::{latent_cache_row, latent_hyper_parameters, LatentLayer, LatentYarn};
use super::groups::SparseOrDense;
use super::tensor_group::{tensor_group, Declared};
use super::Declare;
use crate::model::config::Keys;
use crate::model::{CacheRow, LatentAttention, ModelConfig, ModelError, SparseAttention};

/// The architectures with DeepSeek sparse attention.
pub struct SparseLatent {
    pub family: SparseFamily,
}

/// Which of them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum SparseFamily {
    /// DeepSeek V3.2: an indexer in every layer.
    Deepseek32,
    /// GLM-5 / 5.1 / 5.2 ([`super::glm_dsa`]).
    Glm5,
}

tensor_group! {
    /// A DeepSeek V3.2 or GLM-5 layer.
    pub struct SparseLatentLayer {
        attn_norm: tensor "attn_norm.weight",
        attention: group LatentLayer,
        /// Absent in GLM-5.2's layers that reuse an earlier layer's choice.
        indexer: optional_group LightningIndexer,
        ffn_norm: tensor "ffn_norm.weight",
        feed_forward: group SparseOrDense,
    }
}

tensor_group! {
    /// The lightning indexer's tensors.
    pub struct LightningIndexer {
        /// Its heads' queries, from the query bottleneck's normed output.
        q_b: tensor "indexer.attn_q_b.weight",
        /// Its one key per position, from the layer's normed input, then layer-normed.
        k: tensor "indexer.attn_k.weight",
        k_norm: tensor "indexer.k_norm.weight",
        k_norm_bias: tensor "indexer.k_norm.bias",
        /// Each head's weight in a position's score, per token.
        weights: tensor "indexer.proj.weight",
    }
}

/// What a DeepSeek sparse-attention file reads beyond the common keys: DeepSeek's (latent attention,
/// which must be in the split form with a query bottleneck, and the experts) into `config`, and the
/// lightning indexer's (every layer with its own; its RoPE in `rope_mode`), returned.
pub(super) fn sparse_latent_hyper_parameters(
    keys: &Keys<'_>,
    config: &mut ModelConfig,
    yarn: LatentYarn,
    rope_mode: i32,
) -> Result<SparseAttention, ModelError> {
    let mla = latent_hyper_parameters(keys, config, yarn)?;
    if !mla.absorbed {
        return Err(keys.arch_invalid(
            "attention.key_length_mla",
            "is missing: sparse attention runs latent attention in the split form (attn_k_b, attn_v_b) only",
        ));
    }
    if mla.q_lora_rank == 0 {
        return Err(
            keys.arch_invalid("attention.q_lora_rank", "is 0: the lightning indexer reads the query bottleneck")
        );
    }
    sparse_attention(keys, config, rope_mode)
}

/// Reads the lightning indexer's keys (every layer has its own indexer; its RoPE in `rope_mode`); the
/// key width must be a power of two from 64 (the rotation llama.cpp applies is that wide) and at least
/// the rotary width.
fn sparse_attention(keys: &Keys<'_>, config: &ModelConfig, rope_mode: i32) -> Result<SparseAttention, ModelError> {
    let width = keys.arch_count("attention.indexer.key_length")?;
    if width < 64 || !width.is_power_of_two() {
        return Err(keys.arch_invalid(
            "attention.indexer.key_length",
            &format!("is {width}; the lightning indexer's Walsh-Hadamard rotation needs a power of two from 64"),
        ));
    }
    if (config.rope.dimensions as usize) > width {
        return Err(keys.arch_invalid(
            "attention.indexer.key_length",
            &format!("is {width}, narrower than the {} rotary dimensions", config.rope.dimensions),
        ));
    }
    Ok(SparseAttention {
        heads: keys.arch_count("attention.indexer.head_count")?,
        width,
        top_k: keys.arch_count("attention.indexer.top_k")?,
        rope_mode,
        own_indexer: Vec::new(),
    })
}

/// A sparse layer's cache row: the latent and rotary part, then the indexer's key when the layer has an
/// indexer of its own.
fn indexed_cache_row(config: &ModelConfig, mla: &LatentAttention, sparse: &SparseAttention, layer: usize) -> CacheRow {
    let latent = latent_cache_row(config, mla);
    match sparse.has_indexer(layer) {
        true => CacheRow { key_width: latent.key_width + sparse.width, indexer_width: sparse.width, ..latent },
        false => latent,
    }
}

impl LightningIndexer<Declared> {
    /// The indexer of `config` (whose query bottleneck is `q_lora_rank` wide). Every tensor-parallel rank
    /// holds it whole and chooses the same positions, as every rank holds the latent whole.
    pub fn declare(config: &ModelConfig, sparse: &SparseAttention, q_lora_rank: usize) -> Self {
        let (e, d, h) = (config.embedding, sparse.width, sparse.heads);
        LightningIndexer {
            q_b: Declared::new(&[q_lora_rank, h * d]),
            k: Declared::new(&[e, d]),
            k_norm: Declared::new(&[d]),
            k_norm_bias: Declared::new(&[d]),
            weights: Declared::new(&[e, h]),
        }
    }
}

impl Declare for SparseLatent {
    type Layer = SparseLatentLayer<Declared>;

    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        config.sparse_attention = Some(match self.family {
            SparseFamily::Deepseek32 => sparse_latent_hyper_parameters(keys, config, LatentYarn::Deepseek32, 2)?,
            SparseFamily::Glm5 => super::glm_dsa::hyper_parameters(keys, config)?,
        });
        Ok(())
    }

    fn values_may_differ(&self) -> bool {
        true
    }

    fn partial_rotary(&self) -> bool {
        true
    }

    fn rope_mode(&self) -> i32 {
        0
    }

    fn cache_row(&self, config: &ModelConfig, layer: usize) -> CacheRow {
        let mla = config.latent_attention.expect("a sparse model reads its attention parameters when it opens");
        let sparse =
            config.sparse_attention.as_ref().expect("a sparse model reads its indexer parameters when it opens");
        indexed_cache_row(config, &mla, sparse, layer)
    }

    fn layer(&self, config: &ModelConfig, layer: usize) -> Self::Layer {
        let moe = config.moe.as_ref().expect("a sparse model reads its expert parameters when it opens");
        let mla = config.latent_attention.expect("a sparse model reads its attention parameters when it opens");
        let sparse =
            config.sparse_attention.as_ref().expect("a sparse model reads its indexer parameters when it opens");
        SparseLatentLayer {
            attn_norm: Declared::new(&[config.embedding]),
            attention: LatentLayer::declare(config),
            indexer: sparse.has_indexer(layer).then(|| LightningIndexer::declare(config, sparse, mla.q_lora_rank)),
            ffn_norm: Declared::new(&[config.embedding]),
            feed_forward: SparseOrDense::declare(config, moe, layer, false),
        }
    }
}
