//! Linear attention with a recurrent state: the gated delta-net of Qwen3.5 / 3.6 and Qwen3-Next, as
//! llama.cpp's `src/models/qwen35.cpp` and `qwen3next.cpp` (`build_layer_attn_linear`) and
//! `delta-net-base.cpp` compute it with ggml's fused `gated_delta_net`, and Kimi K3's delta attention
//! (`kimi-k3.cpp`, `build_kda_layer`: the same op with a decay per key channel). The projections and
//! gates run over every row of the step at once; the short convolution and the delta rule run per
//! sequence, each from the state its previous step left (see [`crate::engine::recurrent_state`]).

use super::{linear, norm, StepContext};
use crate::ggml::{GraphBuilder, SetTensorRef, Tensor};
use crate::model::arch::{GatedDeltaNet, KimiDeltaAttention};
use crate::model::LinearAttention;

/// Qwen3.5's gated delta-net of layer `layer` over `x` (the normed input, [embedding, tokens]):
/// queries, keys and values from `attn_qkv`, the output gate from `attn_gate`, beta and alpha from
/// projections of their own. Returns [embedding, tokens].
pub fn gated_delta_net<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &GatedDeltaNet<SetTensorRef>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let beta = g.sigmoid(linear(g, &w.beta, None, x));
    let alpha = linear(g, &w.alpha, None, x);
    let inputs = DeltaNetInputs {
        mixed: linear(g, &w.qkv, None, x),
        gate: linear(g, &w.gate, None, x),
        beta,
        decay: decay(g, alpha, &w.dt_bias, &w.a),
    };
    let weights = DeltaNetWeights { conv: g.stored(&w.conv), norm: &w.norm, output: &w.output, gate: OutputGate::Silu };
    delta_net(g, step, layer, inputs, weights)
}

/// Kimi delta attention of layer `layer` over `x` (the normed input, [embedding, tokens]): queries,
/// keys and values projected apart and convolved each with its own kernel (here side by side, as one
/// convolution over their channels), the decay of every key channel through `ssm_f_a` → `ssm_f_b`, the
/// output gated by σ(`ssm_g` · x). Returns [embedding, tokens].
pub fn kimi_delta_attention<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &KimiDeltaAttention<SetTensorRef>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let shape = step.linear_attention();
    let (t, inner, head, heads) =
        (step.tokens(), shape.inner as i64, shape.head_width as i64, shape.value_heads as i64);
    let mixed = g.concat(
        g.concat(g.mul_mat(g.stored(&w.q), x), g.mul_mat(g.stored(&w.k), x), 0),
        g.mul_mat(g.stored(&w.v), x),
        0,
    );
    let kernel = |k: &SetTensorRef| {
        let k = g.stored(k);
        g.reshape_2d(k, k.shape()[0], inner)
    };
    let kernels = g.concat(g.concat(kernel(&w.q_conv), kernel(&w.k_conv), 1), kernel(&w.v_conv), 1);
    // The decay per key channel: -exp(A_log) · softplus(f + dt_bias), or with a lower bound b (K3)
    // b · σ(exp(A_log) · (f + dt_bias)); `ssm_a` holds -exp(A_log).
    let f = g.add(g.mul_mat(g.stored(&w.decay_b), g.mul_mat(g.stored(&w.decay_a), x)), g.stored(&w.dt_bias));
    let a = g.reshape_3d(g.stored(&w.a), 1, heads, 1);
    let decay = match shape.decay_lower_bound {
        Some(bound) => {
            let scaled = g.mul(g.reshape_3d(f, head, heads, t), a);
            g.scale(g.sigmoid(g.scale(scaled, -1.0)), bound)
        }
        None => g.mul(g.reshape_3d(g.softplus(f), head, heads, t), a),
    };
    let inputs = DeltaNetInputs {
        mixed,
        gate: g.mul_mat(g.stored(&w.gate), x),
        beta: g.sigmoid(g.mul_mat(g.stored(&w.beta), x)),
        decay: g.reshape_2d(decay, head * heads, t),
    };
    let weights = DeltaNetWeights { conv: kernels, norm: &w.norm, output: &w.output, gate: OutputGate::Sigmoid };
    delta_net(g, step, layer, inputs, weights)
}

/// The decay of each value head from its alpha ([value heads, tokens]): -exp(A_log) (stored as
/// `ssm_a`) times softplus(alpha + dt_bias).
pub fn decay<'g>(g: &'g GraphBuilder, alpha: Tensor<'g>, dt_bias: &SetTensorRef, a: &SetTensorRef) -> Tensor<'g> {
    g.mul(g.softplus(g.add(alpha, g.stored(dt_bias))), g.stored(a))
}

/// A gated delta-net's projections over every row of the step: `mixed` [channels, tokens] (queries,
/// keys and values in that order), the output gate z [inner, tokens], each value head's write
/// strength (beta, after its sigmoid) [value heads, tokens] and decay, [value heads, tokens] or per
/// key channel (Kimi) [inner, tokens].
pub struct DeltaNetInputs<'g> {
    pub mixed: Tensor<'g>,
    pub gate: Tensor<'g>,
    pub beta: Tensor<'g>,
    pub decay: Tensor<'g>,
}

/// The tensors of a gated delta-net past its projections: the short convolution's kernel
/// ([kernel, channels]), the norm of each head's output, the output projection, and how the output
/// gate is activated.
pub struct DeltaNetWeights<'g, 'w> {
    pub conv: Tensor<'g>,
    pub norm: &'w SetTensorRef,
    pub output: &'w SetTensorRef,
    pub gate: OutputGate,
}

/// How a delta-net's output gate z scales each head's normed output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputGate {
    /// By silu(z) (Qwen).
    Silu,
    /// By σ(z) (Kimi).
    Sigmoid,
}

/// The rest of a gated delta-net of layer `layer` from its projections: per sequence the convolution
/// and the delta rule, then each head's output normed, scaled by its activated output gate and
/// projected (a tensor-parallel rank's part summed over the group). Returns [embedding, tokens].
pub fn delta_net<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    DeltaNetInputs { mixed, gate, beta, decay }: DeltaNetInputs<'g>,
    w: DeltaNetWeights<'g, '_>,
) -> Tensor<'g> {
    let c = step.config;
    let shape = step.linear_attention();
    let t = step.tokens();
    let (head, value_heads) = (shape.head_width as i64, shape.value_heads as i64);
    let kernel = w.conv;
    let local = layer - step.layers.start;
    let outputs: Vec<Tensor<'g>> = step
        .shape
        .segments
        .iter()
        .zip(step.shape.row_offsets())
        .map(|(segment, row)| {
            let rows = SegmentRows { row, tokens: segment.tokens };
            let inputs = SegmentInputs { mixed: rows.of(g, mixed), decay: rows.of(g, decay), beta: rows.of(g, beta) };
            sequence_step(g, step, shape, (local, segment.seq, segment.fresh), kernel, inputs)
        })
        .collect();
    let attended = super::concat_rows(g, &outputs);
    let z = g.reshape_3d(gate, head, value_heads, t);
    let z = match w.gate {
        OutputGate::Silu => g.silu(z),
        OutputGate::Sigmoid => g.sigmoid(z),
    };
    let gated = g.mul(norm(g, attended, w.norm, c.rms_epsilon), z);
    let merged = g.reshape_2d(gated, head * value_heads, t);
    // A tensor-parallel rank's heads give its part of the output projection; the group sums the parts.
    step.complete(g, g.mul_mat(g.stored(w.output), merged))
}

/// One segment's rows of a [width, tokens] tensor of the step.
#[derive(Clone, Copy)]
struct SegmentRows {
    row: usize,
    tokens: usize,
}

impl SegmentRows {
    fn of<'g>(self, g: &'g GraphBuilder, a: Tensor<'g>) -> Tensor<'g> {
        let width = a.shape()[0];
        let stride = a.strides()[1];
        g.view(a, &[width, self.tokens as i64], &[stride], self.row * stride)
    }
}

/// One segment's rows of the step-wide projections: `mixed` [channels, tokens], `decay` and `beta`
/// [value heads, tokens].
struct SegmentInputs<'g> {
    mixed: Tensor<'g>,
    decay: Tensor<'g>,
    beta: Tensor<'g>,
}

/// The convolution and the delta rule of one sequence's segment (`at`: the stage's layer index, the
/// sequence, whether the segment begins it). Writes the sequence's states after the segment and
/// returns its outputs [head, value heads, tokens].
fn sequence_step<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    shape: &LinearAttention,
    (local, seq, fresh): (usize, usize, bool),
    kernel: Tensor<'g>,
    SegmentInputs { mixed, decay, beta }: SegmentInputs<'g>,
) -> Tensor<'g> {
    let n = mixed.shape()[1];
    let channels = shape.conv_channels() as i64;
    let (head, key_heads, value_heads) = (shape.head_width as i64, shape.key_heads as i64, shape.value_heads as i64);
    let state = step.state;
    // The convolution sees each channel's last inputs before the segment, then the segment's.
    let before = state.conv_before(g, local, seq, fresh);
    let columns = g.permute(g.reshape_3d(mixed, channels, n, 1), [1, 0, 2, 3]);
    let input = g.concat(before, columns, 0);
    let kept = shape.conv_kernel as i64 - 1;
    let conv_after = g.view(input, &[kept, channels, 1], &[input.strides()[1], input.strides()[2]], n as usize * 4);
    let conv = g.silu(g.ssm_conv(input, kernel));
    // Queries, keys and values of the convolved channels, in that order.
    let row = conv.strides()[1];
    let part = |heads: i64, offset: i64| {
        g.view(conv, &[head, heads, n, 1], &[head as usize * 4, row, row * n as usize], (offset * head) as usize * 4)
    };
    let eps = step.config.rms_epsilon;
    let q = l2_norm(g, part(key_heads, 0), eps);
    let k = l2_norm(g, part(key_heads, key_heads), eps);
    // Value heads grouped by key head read their key head repeated for the group, as llama.cpp's
    // qwen3next.cpp repeats them; tiled ones (Qwen3.5) are broadcast by the fused op itself.
    let (q, k) = if shape.value_heads_grouped && key_heads != value_heads {
        let group = value_heads / key_heads;
        let repeated = |x: Tensor<'g>| {
            let spread = g.repeat(g.reshape_4d(x, [head, 1, key_heads, n]), [head, group, key_heads, n]);
            g.reshape_4d(spread, [head, value_heads, n, 1])
        };
        (repeated(q), repeated(k))
    } else if !shape.value_heads_grouped
        && key_heads != value_heads
        && (!shape.first_value_head.is_multiple_of(shape.key_heads)
            || !shape.value_heads.is_multiple_of(shape.key_heads))
    {
        (tiled_from(g, shape, q), tiled_from(g, shape, k))
    } else {
        (q, k)
    };
    let v = part(value_heads, 2 * key_heads);
    // One decay per value head, or (Kimi) one per key channel.
    let as_gate = |a: Tensor<'g>| g.reshape_4d(a, [a.shape()[0] / value_heads, value_heads, n, 1]);
    let delta_before = state.delta_before(g, local, seq, fresh);
    let result = g.gated_delta_net(q, k, v, as_gate(decay), as_gate(beta), delta_before);
    let out_values = (head * value_heads * n) as usize;
    let output = g.view(result, &[head, value_heads, n], &[head as usize * 4, (head * value_heads) as usize * 4], 0);
    let delta_after = g.view(result, &[(head * head * value_heads)], &[], out_values * 4);
    state.store(g, local, seq, conv_after, delta_after);
    output
}

/// Key (or query) heads `x` ([head, key heads, tokens, 1], every key head) in the order a tensor-parallel
/// rank's value heads read them when value head j reads key head j mod key heads (Qwen3.5) and the
/// rank's first value head is not the model's: key heads from the first one's onwards, repeated and cut
/// to one per value head unless they tile the rank's value heads evenly.
fn tiled_from<'g>(g: &'g GraphBuilder, shape: &LinearAttention, x: Tensor<'g>) -> Tensor<'g> {
    let [head, key_heads, n, _] = x.shape();
    let (value_heads, turn) = (shape.value_heads as i64, (shape.first_value_head % shape.key_heads) as i64);
    let strides = x.strides();
    let heads = |from: i64, count: i64| {
        g.view(x, &[head, count, n, 1], &[strides[1], strides[2], strides[3]], (from * head) as usize * 4)
    };
    let turned = if turn == 0 { x } else { g.concat(heads(turn, key_heads - turn), heads(0, turn), 1) };
    if value_heads % key_heads == 0 {
        return turned;
    }
    let copies = (value_heads + key_heads - 1) / key_heads;
    let spread = g.repeat(turned, [head, key_heads * copies, n, 1]);
    let s = spread.strides();
    g.cont(g.view(spread, &[head, value_heads, n, 1], &[s[1], s[2], s[3]], 0))
}

/// Each head of `x` scaled to unit length, as llama.cpp's `build_gdn_l2_norm` computes it: an RMS norm
/// with the epsilon divided by the width, then 1/√width.
fn l2_norm<'g>(g: &'g GraphBuilder, x: Tensor<'g>, eps: f32) -> Tensor<'g> {
    let width = x.shape()[0] as f32;
    g.scale(g.rms_norm(x, eps / width), 1.0 / width.sqrt())
}
