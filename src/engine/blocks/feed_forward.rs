//! The feed-forward halves of a layer: the dense gated feed-forward (SwiGLU or GeGLU), the
//! mixture-of-experts feed-forward with its routing, and the two mixed as DeepSeek and GLM mix them.

use super::{linear, StepContext};
use crate::ggml::{has_cpu_dot_product, GraphBuilder, SetTensorRef, Tensor};
use crate::model::arch::groups::{Experts, SparseOrDense};
use crate::model::{ExpertActivation, ExpertGroups, Gating, MoeParams};

/// A gated feed-forward's matrices: gate, up, down (`FeedForward::matrices`, `SharedExperts::matrices`).
pub type GatedMatrices<'w> = [&'w SetTensorRef; 3];

/// The dense SwiGLU feed-forward `down(silu(gate·x) ⊙ up·x)` (a dense layer's own, or shared experts').
pub fn feed_forward<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: GatedMatrices<'_>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    gated_feed_forward(g, step, w, x, Activation::Silu)
}

/// The gate's activation in a gated feed-forward.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    Silu,
    /// GELU, tanh approximation.
    Gelu,
    /// Kimi K3's situ (see [`situ`]).
    Situ {
        beta: f32,
        linear_beta: f32,
    },
    /// gpt-oss's clamped SwiGLU (MiniMax M3's dense and shared feed-forwards).
    SwigluOai,
}

impl Activation {
    /// The activation of a model's dense and shared feed-forwards, as its experts'.
    fn of_experts(activation: ExpertActivation) -> Activation {
        match activation {
            ExpertActivation::Silu => Activation::Silu,
            ExpertActivation::SwigluOai => Activation::SwigluOai,
            ExpertActivation::Situ { beta, linear_beta } => Activation::Situ { beta, linear_beta },
        }
    }
}

/// Kimi K3's situ of a gated feed-forward, as llama.cpp computes it:
/// `β·tanh(gate/β)·σ(gate) · λ·tanh(up/λ)`, `up` taken as it is when λ ≤ 0.
pub fn situ<'g>(g: &'g GraphBuilder, gate: Tensor<'g>, up: Tensor<'g>, beta: f32, linear_beta: f32) -> Tensor<'g> {
    let squashed = |x: Tensor<'g>, bound: f32| g.scale(g.tanh(g.scale(x, 1.0 / bound)), bound);
    let activated = g.mul(squashed(gate, beta), g.sigmoid(gate));
    let up = if linear_beta > 0.0 { squashed(up, linear_beta) } else { up };
    g.mul(activated, up)
}

/// `down(act(gate·x) ⊙ up·x)` (on a tensor-parallel rank, over its columns of the inner width, summed
/// over the group).
pub fn gated_feed_forward<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: GatedMatrices<'_>,
    x: Tensor<'g>,
    activation: Activation,
) -> Tensor<'g> {
    step.complete(g, gated_part(g, w, x, activation))
}

/// [`gated_feed_forward`] before the group's sum: a tensor-parallel rank's part (the whole result on a
/// stage that is not one).
fn gated_part<'g>(g: &'g GraphBuilder, w: GatedMatrices<'_>, x: Tensor<'g>, act: Activation) -> Tensor<'g> {
    let [gate_weight, up_weight, down_weight] = w;
    let up = g.mul_mat(g.stored(up_weight), x);
    let gate = g.mul_mat(g.stored(gate_weight), x);
    let h = match act {
        Activation::Silu => g.swiglu(gate, up),
        Activation::Gelu => g.geglu(gate, up),
        Activation::Situ { beta, linear_beta } => situ(g, gate, up, beta, linear_beta),
        Activation::SwigluOai => g.swiglu_oai(gate, up, 1.702, 7.0),
    };
    g.mul_mat(g.stored(down_weight), h)
}

/// The mixture-of-experts feed-forward over the router and the 3-D expert tensors: route each token to
/// its top `experts_used` experts, run only those experts' rows (`mul_mat_id`), and sum their outputs
/// by weight. The selection bias (`exp_probs_b`), when the layer has it, biases the choice of experts but not their weights (DeepSeek V3, GLM-4.5). A tensor-parallel rank
/// that holds some of the experts routes alike, runs only the chosen experts it holds (the others'
/// weights zeroed; on the CPU their products are skipped) and sums with the group.
pub fn moe_feed_forward<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &Experts<SetTensorRef>,
    p: &MoeParams,
    x: Tensor<'g>,
) -> Tensor<'g> {
    moe_feed_forward_routed_by(g, step, w, p, x, x)
}

/// [`moe_feed_forward`] with the router reading `router_input` and the experts `x` (Kimi K3's experts
/// compute in a latent width, its router reads the full one).
pub fn moe_feed_forward_routed_by<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &Experts<SetTensorRef>,
    p: &MoeParams,
    router_input: Tensor<'g>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    match routed(g, step, w, p, router_input, x) {
        Routed::Part(part) => step.complete(g, part),
        Routed::Whole(out) => out,
    }
}

/// The routed experts' output on a stage: a tensor-parallel rank's part of the group's sum when it
/// holds only some of the experts, else the whole output (every rank that holds them all computes it).
enum Routed<'g> {
    Part(Tensor<'g>),
    Whole(Tensor<'g>),
}

/// [`moe_feed_forward`] before the group's sum.
fn routed<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &Experts<SetTensorRef>,
    p: &MoeParams,
    router_input: Tensor<'g>,
    x: Tensor<'g>,
) -> Routed<'g> {
    let [n_embd, tokens, ..] = x.shape();
    let (n_expert, n_used) = (p.experts as i64, p.experts_used as i64);
    let logits = linear(g, &w.router, w.router_bias.as_ref(), router_input); // [experts, tokens]
    let probs = match p.gating {
        Gating::Softmax => g.soft_max(logits),
        Gating::Sigmoid => g.sigmoid(logits),
        Gating::SoftmaxWeight => logits,
    };
    let selection = match &w.selection_bias {
        Some(bias) => g.add(probs, g.stored(bias)),
        None => probs,
    };
    let selection = match p.groups {
        Some(groups) => only_best_groups(g, selection, groups, tokens),
        None => selection,
    };
    let selected = g.argsort_top_k(selection, n_used); // I32 [used, tokens]
    let mut weights = g.get_rows(g.reshape_3d(probs, 1, n_expert, tokens), selected); // [1, used, tokens]
    if p.gating == Gating::SoftmaxWeight {
        weights = g.reshape_3d(g.soft_max(g.reshape_2d(weights, n_used, tokens)), 1, n_used, tokens);
    }
    if p.normalize {
        let flat = g.reshape_2d(weights, n_used, tokens);
        // llama.cpp clamps the sum to F16's smallest normal number against a division by zero.
        let sum = g.clamp(g.sum_rows(flat), 6.103_515_6e-5, f32::INFINITY);
        weights = g.reshape_3d(g.div(flat, sum), 1, n_used, tokens);
    }
    if p.scale != 0.0 && p.scale != 1.0 {
        weights = g.scale(weights, p.scale);
    }
    let held = step.held_experts();
    // `ids` name the rank's own experts: a slot held elsewhere names one the token uses anyway.
    let ids = match &held {
        Some((held, _)) => {
            weights = g.held_expert_weights(weights, selected, held.clone());
            g.held_expert_ids(selected, held.clone())
        }
        None => selected,
    };
    g.expand(weights);

    let x = g.reshape_3d(x, n_embd, 1, tokens);
    // Each chosen expert's rows, plus its own bias when the experts have them (gpt-oss). On the CPU a
    // rank computes only the slots of experts it holds (the others' weights are zero); elsewhere, or
    // for weights the CPU has no dot product for, `mul_mat_id` computes every slot (and the stage
    // reports what the device cannot compute).
    let expert = |weight: &SetTensorRef, bias: Option<&SetTensorRef>, input: Tensor<'g>| {
        let matrix = g.stored(weight);
        let y = match &held {
            Some((held, true)) if has_cpu_dot_product(matrix.dtype()) => {
                g.held_experts_product(matrix, input, selected, held.clone())
            }
            _ => g.mul_mat_id(matrix, input, ids),
        };
        match bias {
            Some(bias) => g.add_id(y, g.stored(bias), ids),
            None => y,
        }
    };
    let up = expert(&w.up, w.up_bias.as_ref(), x); // [ff, used, tokens]
    let gate = expert(&w.gate, w.gate_bias.as_ref(), x);
    let h = match p.activation {
        ExpertActivation::Silu => g.swiglu(gate, up),
        ExpertActivation::SwigluOai => g.swiglu_oai(gate, up, 1.702, 7.0),
        ExpertActivation::Situ { beta, linear_beta } => situ(g, gate, up, beta, linear_beta),
    };
    let experts = expert(&w.down, w.down_bias.as_ref(), h); // [embd, used, tokens]
    let experts = g.mul(experts, weights);
    g.expand(experts);

    // Views of each chosen slot first, then the sum, in llama.cpp's order.
    let slots: Vec<Tensor<'g>> = (0..n_used as usize)
        .map(|i| {
            let s = experts.strides();
            let view = g.view(experts, &[n_embd, tokens], &[s[2]], i * s[1]);
            g.expand(view);
            view
        })
        .collect();
    let mut out = slots[0];
    for &slot in &slots[1..] {
        out = g.add(out, slot);
        g.expand(out);
    }
    if held.is_some() {
        Routed::Part(out)
    } else {
        Routed::Whole(out)
    }
}

/// The feed-forward of a model whose first layers are dense and the others routed to experts, with
/// shared experts every token also goes through (GLM-4.5, DeepSeek V3), the dense and shared ones with
/// the experts' activation.
pub fn sparse_or_dense_feed_forward<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &SparseOrDense<SetTensorRef>,
    moe: &MoeParams,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let activation = Activation::of_experts(moe.activation);
    let experts = match w {
        SparseOrDense::Dense(dense) => return gated_feed_forward(g, step, dense.matrices(), x, activation),
        SparseOrDense::Sparse(experts) => experts,
    };
    let Some(shared) = &experts.shared else { return moe_feed_forward(g, step, &experts.routed, moe, x) };
    let routed = routed(g, step, &experts.routed, moe, x, x);
    let shared = gated_part(g, shared.matrices(), x, activation);
    match routed {
        // A rank's parts of both are summed over the group at once: one sum per layer, not two.
        Routed::Part(part) => step.complete(g, g.add(part, shared)),
        Routed::Whole(out) => g.add(out, step.complete(g, shared)),
    }
}

/// Group-limited routing: the scores `selection` ([experts, tokens]) of experts outside each token's
/// `groups.used` best groups become -∞, a group scoring the sum of its two best experts' scores.
fn only_best_groups<'g>(g: &'g GraphBuilder, selection: Tensor<'g>, groups: ExpertGroups, tokens: i64) -> Tensor<'g> {
    let [n_expert, ..] = selection.shape();
    let (count, used) = (groups.count as i64, groups.used as i64);
    let per_group = n_expert / count;
    let by_group = g.reshape_3d(selection, per_group, count, tokens); // [per_group, groups, tokens]
    let best_two = g.argsort_top_k(by_group, 2); // I32 [2, groups, tokens]
    let best_two = g.get_rows(g.reshape_4d(by_group, [1, per_group, count, tokens]), best_two); // [1, 2, groups, tokens]
    let group_scores = g.sum_rows(g.reshape_3d(best_two, 2, count, tokens)); // [1, groups, tokens]
    let best_groups = g.argsort_top_k(g.reshape_2d(group_scores, count, tokens), used); // I32 [used, tokens]
    let kept = g.get_rows(by_group, best_groups); // [per_group, used, tokens]
    let masked = g.set_rows(g.fill(by_group, f32::NEG_INFINITY), kept, best_groups);
    g.reshape_2d(masked, n_expert, tokens)
}
