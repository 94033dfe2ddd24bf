//! DeepSeek V3.2 (`deepseek32`) in miniature, as random weights: its lightning indexer's metadata and
//! tensors, written beside DeepSeek V3's latent attention and experts by [`super::random_model`].

use super::gguf_writer::{GgufWriter, Meta};
use super::random_model::{RandomMla, RandomModel, Weights};

/// The lightning indexer's shape: its heads, their width (a power of two from 64, as llama.cpp's
/// rotation needs) and how many positions each query keeps.
#[derive(Clone, Copy, Debug)]
pub struct RandomIndexer {
    pub heads: usize,
    pub width: usize,
    pub top_k: usize,
    /// Which layers have an indexer of their own (`attention.indexer.types`; GLM-5.2), when not all.
    pub types: Option<&'static [bool]>,
}

/// DeepSeek V3.2 in miniature: [`super::random_model::deepseek2`]'s shape without next-token-prediction
/// layers, and in every layer an indexer of 16 heads 64 wide keeping 8 positions per query, so that the
/// longer prompts and their continuations attend sparsely.
pub fn deepseek32() -> RandomModel {
    RandomModel {
        architecture: "deepseek32",
        nextn_layers: 0,
        indexer: Some(RandomIndexer { heads: 16, width: 64, top_k: 8, types: None }),
        seed: 0x5eed_0013,
        ..super::random_model::deepseek2()
    }
}

/// GLM-5.2 in miniature: [`deepseek32`]'s shape in 5 layers, of which layers 0 and 3 have an indexer
/// of their own (the indexer's RoPE in ggml's normal mode) and the others reuse the choice of the last
/// one before them.
pub fn glm_dsa() -> RandomModel {
    RandomModel {
        architecture: "glm-dsa",
        layers: 5,
        indexer: Some(RandomIndexer {
            types: Some(&[true, false, false, true, false]),
            ..deepseek32().indexer.unwrap()
        }),
        seed: 0x5eed_0015,
        ..deepseek32()
    }
}

/// The indexer's metadata.
pub(super) fn indexer_metadata(g: GgufWriter, model: &RandomModel, indexer: &RandomIndexer) -> GgufWriter {
    let k = |key: &str| format!("{}.attention.indexer.{key}", model.architecture);
    let g = g
        .meta(&k("head_count"), Meta::U32(indexer.heads as u32))
        .meta(&k("key_length"), Meta::U32(indexer.width as u32))
        .meta(&k("top_k"), Meta::U32(indexer.top_k as u32));
    match indexer.types {
        Some(types) => {
            let flags = types.iter().map(|&own| shoal::model::Value::Bool(own)).collect();
            g.meta(&k("types"), Meta::Value(shoal::model::Value::Array(flags)))
        }
        None => g,
    }
}

/// Layer `l`'s indexer tensors.
pub(super) fn indexer_tensors(
    g: GgufWriter,
    model: &RandomModel,
    mla: &RandomMla,
    indexer: &RandomIndexer,
    l: usize,
    w: &mut Weights,
) -> GgufWriter {
    if indexer.types.is_some_and(|types| !types[l]) {
        return g;
    }
    let n = |part: &str| format!("blk.{l}.indexer.{part}");
    let (e, r) = (model.embedding as u64, mla.q_lora_rank as u64);
    let (h, d) = (indexer.heads as u64, indexer.width as u64);
    let proj = |fan_in: u64| 1.0 / (fan_in as f32).sqrt() * 1.7;
    g.f16_values(&n("attn_q_b.weight"), &[r, h * d], &w.uniform(r * h * d, proj(r)))
        .f16_values(&n("attn_k.weight"), &[e, d], &w.uniform(e * d, proj(e)))
        .f32_values(&n("k_norm.weight"), &[d], &w.around_one(d, 0.1))
        .f32_values(&n("k_norm.bias"), &[d], &w.uniform(d, 0.1))
        .f16_values(&n("proj.weight"), &[e, h], &w.uniform(e * h, proj(e)))
}

/// A DeepSeek V3.2 large enough to measure: [`super::random_model::deepseek2_bench`]'s shape (6 layers,
/// 64 grouped experts of which 8 are used, a latent of 128) with an indexer of 16 heads 64 wide keeping
/// 256 positions, so a 512-token prompt attends sparsely.
pub fn deepseek32_bench() -> RandomModel {
    RandomModel {
        architecture: "deepseek32",
        indexer: Some(RandomIndexer { heads: 16, width: 64, top_k: 256, types: None }),
        seed: 0x5eed_0014,
        ..super::random_model::deepseek2_bench()
    }
}

/// MiniMax M3's block-sparse attention: an indexer key width, positions per block, blocks kept per
/// query and blocks up to its own always kept.
#[derive(Clone, Copy, Debug)]
pub struct RandomMsa {
    pub width: usize,
    pub block: usize,
    pub top_blocks: usize,
    pub local_blocks: usize,
}

/// MiniMax M3 in miniature: 4 layers (the first dense), Q and K normed per head, RoPE on half of each
/// head, 16 swigluoai experts of which 4 are used plus a shared one; the layers with experts attend by
/// blocks of 4 positions, 2 chosen per query beside its own block, so the longer prompts and every
/// continuation attend sparsely.
pub fn minimax_m3() -> RandomModel {
    RandomModel {
        architecture: "minimax-m3",
        rope_dims: 8,
        leading_dense: 1,
        shared_experts: 1,
        msa: Some(RandomMsa { width: 16, block: 4, top_blocks: 2, local_blocks: 1 }),
        seed: 0x5eed_0016,
        ..super::random_model::qwen3moe()
    }
}

/// MiniMax M3's own metadata.
pub(super) fn msa_metadata(g: GgufWriter, model: &RandomModel, msa: &RandomMsa) -> GgufWriter {
    let k = |key: &str| format!("{}.{key}", model.architecture);
    g.meta(&k("leading_dense_block_count"), Meta::U32(model.leading_dense as u32))
        .meta(&k("expert_shared_count"), Meta::U32(model.shared_experts as u32))
        .meta(&k("expert_weights_scale"), Meta::F32(2.0))
        .meta(&k("expert_weights_norm"), Meta::Value(shoal::model::Value::Bool(true)))
        .meta(&k("attention.indexer.head_count"), Meta::U32(model.kv_heads as u32))
        .meta(&k("attention.indexer.key_length"), Meta::U32(msa.width as u32))
        .meta(&k("attention.indexer.top_k"), Meta::U32(msa.top_blocks as u32))
        .meta(&k("attention.indexer.block_size"), Meta::U32(msa.block as u32))
        .meta(&k("attention.indexer.local_blocks"), Meta::U32(msa.local_blocks as u32))
}

/// Layer `l`'s per-head Q/K norms, feed-forward norm and, in a layer with experts, its indexer.
pub(super) fn msa_layer(g: GgufWriter, model: &RandomModel, msa: &RandomMsa, l: usize, w: &mut Weights) -> GgufWriter {
    let n = |part: &str| format!("blk.{l}.{part}");
    let (e, hd, d, heads) = (model.embedding as u64, model.head_dim as u64, msa.width as u64, model.kv_heads as u64);
    let g = g
        .f32_values(&n("attn_q_norm.weight"), &[hd], &w.around_one(hd, 0.1))
        .f32_values(&n("attn_k_norm.weight"), &[hd], &w.around_one(hd, 0.1))
        .f32_values(&n("ffn_norm.weight"), &[e], &w.around_one(e, 0.1));
    if l < model.leading_dense {
        return g;
    }
    let proj = 1.0 / (e as f32).sqrt() * 1.7;
    g.f16_values(&n("indexer.q_proj.weight"), &[e, heads * d], &w.uniform(e * heads * d, proj))
        .f16_values(&n("indexer.k_proj.weight"), &[e, d], &w.uniform(e * d, proj))
        .f32_values(&n("indexer.q_norm.weight"), &[d], &w.around_one(d, 0.1))
        .f32_values(&n("indexer.k_norm.weight"), &[d], &w.around_one(d, 0.1))
}
