//! The tensor groups several architectures share, each with the shapes and tensor-parallel splits its
//! declaration gives them: standard self-attention, the dense gated feed-forward, the shared experts'
//! feed-forward, the routed experts with their router, and DeepSeek's and GLM's mix of the last two.

use super::tensor_group::{tensor_group, Declared};
use crate::model::layout::Part;
use crate::model::{ModelConfig, MoeParams};

tensor_group! {
    /// Self-attention with the standard names: Q, K and V with optional biases, the output projection
    /// (its bias optional), per-head Q/K norms and gpt-oss's learned sinks.
    pub struct Attention {
        q: tensor "attn_q.weight",
        k: tensor "attn_k.weight",
        v: tensor "attn_v.weight",
        q_bias: optional "attn_q.bias",
        k_bias: optional "attn_k.bias",
        v_bias: optional "attn_v.bias",
        output: tensor "attn_output.weight",
        output_bias: optional "attn_output.bias",
        q_norm: optional "attn_q_norm.weight",
        k_norm: optional "attn_k_norm.weight",
        /// One logit per head that attends to nothing (gpt-oss).
        sinks: optional "attn_sinks.weight",
    }
}

impl Attention<Declared> {
    /// The standard attention of `config`, with per-head Q/K norms as `head_norms` says (required,
    /// optional, or absent) and no sinks. A tensor-parallel rank holds whole heads: rows of Q, K and V
    /// and the matching inputs of the output projection (whose bias is added once, after the ranks'
    /// outputs are summed).
    pub fn declare(config: &ModelConfig, head_norms: Option<bool>) -> Attention<Declared> {
        let (e, q, hd) = (config.embedding, config.heads * config.head_dim, config.head_dim);
        let kv = config.kv_heads * config.head_dim;
        let norm = |required| Declared::new(&[hd]).required_if(required);
        Attention {
            q: Declared::new(&[e, q]).split(1, Part::QueryHeads),
            k: Declared::new(&[e, kv]).split(1, Part::KvHeads),
            v: Declared::new(&[e, kv]).split(1, Part::KvHeads),
            q_bias: Some(Declared::optional(&[q]).split(0, Part::QueryHeads)),
            k_bias: Some(Declared::optional(&[kv]).split(0, Part::KvHeads)),
            v_bias: Some(Declared::optional(&[kv]).split(0, Part::KvHeads)),
            output: Declared::new(&[q, e]).split(0, Part::QueryHeads),
            output_bias: Some(Declared::optional(&[e])),
            q_norm: head_norms.map(norm),
            k_norm: head_norms.map(norm),
            sinks: None,
        }
    }
}

tensor_group! {
    /// A dense gated feed-forward `down(act(gate·x) ⊙ up·x)`.
    pub struct FeedForward {
        gate: tensor "ffn_gate.weight",
        up: tensor "ffn_up.weight",
        down: tensor "ffn_down.weight",
    }
}

tensor_group! {
    /// The shared experts' gated feed-forward, which every token goes through beside its routed experts.
    pub struct SharedExperts {
        gate: tensor "ffn_gate_shexp.weight",
        up: tensor "ffn_up_shexp.weight",
        down: tensor "ffn_down_shexp.weight",
    }
}

/// The three matrices of a gated feed-forward: gate, up, down.
fn gated(config: &ModelConfig, inner: usize, share: Part) -> [Declared; 3] {
    let e = config.embedding;
    // A tensor-parallel rank holds its share of the inner width.
    [
        Declared::new(&[e, inner]).split(1, share),
        Declared::new(&[e, inner]).split(1, share),
        Declared::new(&[inner, e]).split(0, share),
    ]
}

impl FeedForward<Declared> {
    /// A dense feed-forward of inner width `inner`.
    pub fn declare(config: &ModelConfig, inner: usize) -> FeedForward<Declared> {
        let [gate, up, down] = gated(config, inner, Part::FeedForward);
        FeedForward { gate, up, down }
    }
}

impl<T> FeedForward<T> {
    /// Gate, up and down.
    pub fn matrices(&self) -> [&T; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

impl SharedExperts<Declared> {
    /// The shared experts' feed-forward, `inner` wide.
    pub fn declare(config: &ModelConfig, inner: usize) -> SharedExperts<Declared> {
        let [gate, up, down] = gated(config, inner, Part::SharedFeedForward);
        SharedExperts { gate, up, down }
    }
}

impl<T> SharedExperts<T> {
    /// Gate, up and down.
    pub fn matrices(&self) -> [&T; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

tensor_group! {
    /// Routed experts: the router and the 3-D expert tensors, with the biases some architectures add.
    pub struct Experts {
        router: tensor "ffn_gate_inp.weight",
        gate: tensor "ffn_gate_exps.weight",
        up: tensor "ffn_up_exps.weight",
        down: tensor "ffn_down_exps.weight",
        router_bias: optional "ffn_gate_inp.bias",
        gate_bias: optional "ffn_gate_exps.bias",
        up_bias: optional "ffn_up_exps.bias",
        down_bias: optional "ffn_down_exps.bias",
        /// Biases which experts are chosen, not their weights (DeepSeek V3, GLM-4.5).
        selection_bias: optional "exp_probs_b.bias",
    }
}

impl Experts<Declared> {
    /// The router and experts of `moe`, without biases. A tensor-parallel rank holds whole experts;
    /// every rank routes with the whole router.
    pub fn declare(config: &ModelConfig, moe: &MoeParams) -> Experts<Declared> {
        let (e, f, n) = (config.embedding, moe.expert_feed_forward, moe.experts);
        Experts {
            router: Declared::new(&[e, n]),
            gate: Declared::new(&[e, f, n]).split(2, Part::Experts),
            up: Declared::new(&[e, f, n]).split(2, Part::Experts),
            down: Declared::new(&[f, e, n]).split(2, Part::Experts),
            router_bias: None,
            gate_bias: None,
            up_bias: None,
            down_bias: None,
            selection_bias: None,
        }
    }
}

tensor_group! {
    /// Routed experts and, when the model has them, shared experts every token goes through.
    pub struct MixedExperts {
        routed: group Experts,
        shared: optional_group SharedExperts,
    }
}

tensor_group! {
    /// The feed-forward of a model whose first layers are dense and the others routed to experts
    /// (GLM-4.5, DeepSeek V3).
    pub enum SparseOrDense {
        Dense(FeedForward),
        Sparse(MixedExperts),
    }
}

impl SparseOrDense<Declared> {
    /// Layer `layer`'s: dense among the leading dense layers, else experts (whose selection bias is
    /// required when `selection_bias` says so, optional when `Some(false)`) and `moe.shared_experts`
    /// shared experts.
    pub fn declare(config: &ModelConfig, moe: &MoeParams, layer: usize, selection_bias: bool) -> Self {
        if !moe.is_sparse(layer) {
            return SparseOrDense::Dense(FeedForward::declare(config, config.feed_forward));
        }
        let routed = Experts {
            selection_bias: Some(Declared::new(&[moe.experts]).required_if(selection_bias)),
            ..Experts::declare(config, moe)
        };
        let shared = (moe.shared_experts > 0)
            .then(|| SharedExperts::declare(config, moe.expert_feed_forward * moe.shared_experts));
        SparseOrDense::Sparse(MixedExperts { routed, shared })
    }
}
