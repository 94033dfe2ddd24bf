//! GLM-5, 5.1 and 5.2 (`glm-dsa`): DeepSeek V3.2's layers (declared with them in [`super::deepseek32`]:
//! latent attention in the split form with a query bottleneck, a lightning indexer, dense then routed
//! and shared experts) with three differences, read here: the indexer's RoPE turns adjacent pairs (ggml's normal mode, not NeoX), routing is sigmoid when the
//! file names no gating, and (GLM-5.2) only some layers have an indexer of their own; the others attend
//! to the positions the last layer before them with one chose. Which layers have one:
//! `attention.indexer.types`, else every layer for files trained on under 1M positions (GLM-5, 5.1)
//! and GLM-5.2's pattern otherwise (layers 0 and 1, then every fourth from 2), as llama.cpp decides.
//! A pipeline stage begins only at a layer with its own indexer. Next-token-prediction layers are
//! skipped.

use super::deepseek2::LatentYarn;
use super::deepseek32::sparse_latent_hyper_parameters;
use crate::model::config::Keys;
use crate::model::{Gating, ModelConfig, ModelError, SparseAttention};

/// Training contexts from which a file without `attention.indexer.types` is GLM-5.2 (llama.cpp's test).
const GLM_5_2_CONTEXT: usize = 1 << 20;

/// Which of `layers` layers have an indexer of their own when the file does not say.
fn default_indexers(layers: usize, training_context: usize) -> Vec<bool> {
    if training_context < GLM_5_2_CONTEXT {
        return Vec::new();
    }
    (0..layers).map(|l| l < 2 || (l - 2).is_multiple_of(4)).collect()
}

/// What a GLM-5 file reads beyond the common keys: DeepSeek's, without `yarn_log_multiplier` (llama.cpp
/// does not read it for GLM-5) and with sigmoid routing unless the file names a gating, into `config`;
/// the indexer's (RoPE in the normal mode, which layers have their own), returned.
pub(super) fn hyper_parameters(keys: &Keys<'_>, config: &mut ModelConfig) -> Result<SparseAttention, ModelError> {
    let named_gating = keys.arch_optional_size("expert_gating_func")?.is_some_and(|g| g != 0);
    let mut sparse = sparse_latent_hyper_parameters(keys, config, LatentYarn::Unread, 0)?;
    if !named_gating {
        if let Some(moe) = config.moe.as_mut() {
            moe.gating = Gating::Sigmoid;
        }
    }
    sparse.own_indexer = match keys.arch_flags("attention.indexer.types")? {
        Some(flags) if flags.len() >= config.layers => flags[..config.layers].to_vec(),
        Some(_) => return Err(keys.arch_invalid("attention.indexer.types", "has fewer entries than layers")),
        None => default_indexers(config.layers, config.training_context),
    };
    if !sparse.has_indexer(0) {
        return Err(keys.arch_invalid(
            "attention.indexer.types",
            "gives layer 0 no indexer, but a layer without one reuses an earlier layer's choice",
        ));
    }
    Ok(sparse)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glm_5_2_files_without_indexer_types_have_an_indexer_in_layers_0_1_and_every_fourth_from_2() {
        assert!(default_indexers(78, 202_752).is_empty(), "GLM-5 and 5.1: every layer");
        let glm_5_2 = default_indexers(78, 1 << 20);
        let with: Vec<usize> = (0..78).filter(|&l| glm_5_2[l]).collect();
        assert_eq!(&with[..5], &[0, 1, 2, 6, 10]);
        assert_eq!(with.len(), 2 + 19);
    }
}
