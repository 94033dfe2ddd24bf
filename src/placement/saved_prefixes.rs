//! How many tokens of saved prefixes (the prompt cache beyond its slots) an instance keeps in memory:
//! placement gives them the memory each stage's node offers beyond what the plan takes, up to what the
//! launch asks for (by default one more context per slot), so that keeping them never takes memory the
//! node did not offer. Every stage keeps its layers' rows of every saved token, so the stage with the
//! least room for its rows decides.

use super::{ModelNeeds, Plan};

/// Tokens of saved prefixes `plan` gives room for, at most `wanted`: 0 where the stages save none (a
/// tensor-parallel rank computes a slice of the rows; sliding-window layers keep a ring, not a prefix).
pub fn saved_prefix_tokens(plan: &Plan, needs: &ModelNeeds, wanted: usize) -> usize {
    if needs.sliding_layers || plan.stages.iter().any(|s| s.slice.is_some()) {
        return 0;
    }
    let per_layer = &needs.kv_per_layer_position;
    plan.stages
        .iter()
        .filter_map(|s| {
            let per_token: u64 = per_layer.get(s.layers.clone())?.iter().sum();
            // A stage of linear layers only keeps a state per saved prefix, not rows per token.
            (per_token > 0).then(|| (s.offer.saturating_sub(s.bytes.total()) / per_token) as usize)
        })
        .fold(wanted, usize::min)
}
