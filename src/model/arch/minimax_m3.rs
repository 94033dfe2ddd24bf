//! MiniMax M3 (`minimax-m3`): grouped-query attention with Q and K RMS-normed per head and NeoX RoPE on
//! part of each head; the first `leading_dense_block_count` layers dense, the others routed experts
//! (gating as the file names it, a selection bias, weights normalised and scaled as it says) plus a
//! shared expert, every feed-forward with gpt-oss's clamped SwiGLU (swigluoai). The layers with experts
//! attend sparsely by blocks of positions (MiniMax sparse attention, MSA): an indexer with one head per
//! key/value head (`indexer.q_proj`, `indexer.k_proj`, per-head RMS norms, the same RoPE) scores every
//! cached position for each query, a block of `attention.indexer.block_size` positions scores its best,
//! and each key/value head's queries attend only to the `attention.indexer.top_k` best blocks — always
//! with the `attention.indexer.local_blocks` blocks up to their own position. The indexer's key is
//! cached beside each position's keys.

use super::groups::{Attention, SparseOrDense};
use super::tensor_group::{tensor_group, Declared};
use super::Declare;
use crate::model::config::Keys;
use crate::model::layout::Part;
use crate::model::{BlockSparseAttention, CacheRow, ExpertActivation, Gating, ModelConfig, ModelError, MoeParams};

pub struct MinimaxM3;

tensor_group! {
    /// A MiniMax M3 layer.
    pub struct MinimaxM3Layer {
        attn_norm: tensor "attn_norm.weight",
        attention: group Attention,
        /// In the layers with experts only.
        indexer: optional_group BlockIndexer,
        ffn_norm: tensor "ffn_norm.weight",
        feed_forward: group SparseOrDense,
    }
}

tensor_group! {
    /// MiniMax sparse attention's indexer: a query per key/value head and one key per position.
    pub struct BlockIndexer {
        q: tensor "indexer.q_proj.weight",
        k: tensor "indexer.k_proj.weight",
        q_norm: tensor "indexer.q_norm.weight",
        k_norm: tensor "indexer.k_norm.weight",
    }
}

impl Declare for MinimaxM3 {
    type Layer = MinimaxM3Layer<Declared>;

    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        super::skip_next_token_layers(keys, config)?;
        let (experts, experts_used) = super::expert_counts(keys)?;
        let gating = match keys.arch_count("expert_gating_func")? {
            1 => Gating::Softmax,
            2 => Gating::Sigmoid,
            other => {
                return Err(keys.arch_invalid("expert_gating_func", &format!("is {other}, a gating shoal does not run")))
            }
        };
        config.moe = Some(MoeParams {
            experts,
            experts_used,
            expert_feed_forward: keys.arch_count("expert_feed_forward_length")?,
            gating,
            activation: ExpertActivation::SwigluOai,
            normalize: keys.arch_optional_bool("expert_weights_norm")?.unwrap_or(false),
            scale: keys.arch_optional_float("expert_weights_scale")?.unwrap_or(0.0) as f32,
            shared_experts: keys.arch_count("expert_shared_count")?,
            leading_dense_layers: keys
                .arch_optional_count("leading_dense_block_count")?
                .unwrap_or(0)
                .min(config.layers),
            groups: None,
        });
        let heads = keys.arch_count("attention.indexer.head_count")?;
        if heads != config.kv_heads {
            return Err(keys.arch_invalid(
                "attention.indexer.head_count",
                &format!(
                    "is {heads}; MiniMax sparse attention has one indexer head per key/value head ({})",
                    config.kv_heads
                ),
            ));
        }
        let width = keys.arch_count("attention.indexer.key_length")?;
        if (config.rope.dimensions as usize) > width {
            return Err(keys.arch_invalid("attention.indexer.key_length", "is narrower than the rotary dimensions"));
        }
        let block = keys.arch_count("attention.indexer.block_size")?;
        config.block_sparse = Some(BlockSparseAttention {
            width,
            block,
            top_blocks: keys.arch_count("attention.indexer.top_k")?,
            local_blocks: keys.arch_optional_size("attention.indexer.local_blocks")?.unwrap_or(0),
        });
        Ok(())
    }

    fn partial_rotary(&self) -> bool {
        true
    }

    fn rope_mode(&self) -> i32 {
        2
    }

    fn cache_row(&self, config: &ModelConfig, layer: usize) -> CacheRow {
        let row = config.standard_cache_row();
        match (config.block_sparse, config.moe) {
            (Some(sparse), Some(moe)) if moe.is_sparse(layer) => {
                CacheRow { key_width: row.key_width + sparse.width, indexer_width: sparse.width, ..row }
            }
            _ => row,
        }
    }

    fn layer(&self, config: &ModelConfig, layer: usize) -> Self::Layer {
        let moe = config.moe.as_ref().expect("minimax-m3 reads its expert parameters when the model opens");
        let sparse = config.block_sparse.expect("minimax-m3 reads its indexer parameters when the model opens");
        let (e, d, heads) = (config.embedding, sparse.width, config.kv_heads);
        // A tensor-parallel rank holds the indexer queries of its key/value heads; the indexer key, one
        // per position, every rank computes whole.
        let indexer = moe.is_sparse(layer).then(|| BlockIndexer {
            q: Declared::new(&[e, heads * d]).split(1, Part::KvHeads),
            k: Declared::new(&[e, d]),
            q_norm: Declared::new(&[d]),
            k_norm: Declared::new(&[d]),
        });
        MinimaxM3Layer {
            attn_norm: Declared::new(&[e]),
            attention: Attention::declare(config, Some(true)),
            indexer,
            ffn_norm: Declared::new(&[e]),
            feed_forward: SparseOrDense::declare(config, moe, layer, true),
        }
    }
}
