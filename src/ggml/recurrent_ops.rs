//! Graph ops of linear attention with a recurrent state (Qwen3.5's gated delta-net): the short
//! causal convolution over the last positions, the gated delta rule, the activations around them,
//! copies into a stored state, and RoPE over several position sections (Qwen's interleaved M-RoPE).
//! Split from `graph.rs`, which holds the builder and the common ops.

use super::graph::{GraphBuilder, RopeParams, Tensor};
use super::sys;

impl GraphBuilder {
    /// The depthwise causal convolution: `input` ([kernel - 1 + tokens, channels, sequences]: each
    /// channel's last inputs of earlier steps, then this step's) with `kernel` ([kernel, channels]).
    /// Result: [channels, tokens, sequences].
    pub fn ssm_conv<'g>(&'g self, input: Tensor<'g>, kernel: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: both belong to this graph or outlive it; ggml asserts the shapes.
        self.adopt(unsafe { sys::ggml_ssm_conv(self.ctx(), input.raw.as_ptr(), kernel.raw.as_ptr()) })
    }

    /// The gated delta rule over a step's tokens: q, k [S, H_k, tokens, sequences], v [S, H_v, tokens,
    /// sequences], the gate and beta [1, H_v, tokens, sequences], the state [S, S, H_v, sequences]
    /// before the step. The result holds the outputs ([S, H_v, tokens, sequences]) followed by the
    /// state after the step's last token.
    pub fn gated_delta_net<'g>(
        &'g self,
        q: Tensor<'g>,
        k: Tensor<'g>,
        v: Tensor<'g>,
        gate: Tensor<'g>,
        beta: Tensor<'g>,
        state: Tensor<'g>,
    ) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: all belong to this graph or outlive it; ggml asserts the shapes. One state snapshot.
        self.adopt(unsafe {
            sys::ggml_gated_delta_net(
                self.ctx(),
                q.raw.as_ptr(),
                k.raw.as_ptr(),
                v.raw.as_ptr(),
                gate.raw.as_ptr(),
                beta.raw.as_ptr(),
                state.raw.as_ptr(),
                1,
            )
        })
    }

    /// x · σ(x), element by element.
    pub fn silu<'g>(&'g self, a: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: `a` belongs to this graph.
        self.adopt(unsafe { sys::ggml_silu(self.ctx(), a.raw.as_ptr()) })
    }

    /// log(1 + eˣ), element by element.
    pub fn softplus<'g>(&'g self, a: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: `a` belongs to this graph.
        self.adopt(unsafe { sys::ggml_softplus(self.ctx(), a.raw.as_ptr()) })
    }

    /// Copies `src` into `dst` (a view of a stored tensor, with as many elements): the node to
    /// [`GraphBuilder::expand`] so that the write happens.
    pub fn copy_into<'g>(&'g self, src: Tensor<'g>, dst: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: both belong to this graph or outlive it; ggml asserts equal element counts.
        self.adopt(unsafe { sys::ggml_cpy(self.ctx(), src.raw.as_ptr(), dst.raw.as_ptr()) })
    }

    /// RoPE of `a` ([head_dim, heads, tokens]) by position sections: `positions` (I32 [4 · tokens]) holds
    /// four positions per token, section after section, and `sections` says how many of the rotated
    /// pairs each section turns (`p.mode` 40: interleaved, as Qwen3.5 uses it; a text token's sections
    /// are its position three times and 0).
    pub fn rope_multi<'g>(
        &'g self,
        a: Tensor<'g>,
        positions: Tensor<'g>,
        sections: [i32; 4],
        p: &RopeParams,
    ) -> Tensor<'g> {
        self.reserve(1);
        let mut sections = sections;
        // SAFETY: see `rope`; ggml reads the four sections.
        self.adopt(unsafe {
            sys::ggml_rope_multi(
                self.ctx(),
                a.raw.as_ptr(),
                positions.raw.as_ptr(),
                std::ptr::null_mut(),
                p.n_dims,
                sections.as_mut_ptr(),
                p.mode,
                p.n_ctx_orig,
                p.freq_base,
                p.freq_scale,
                p.ext_factor,
                p.attn_factor,
                p.beta_fast,
                p.beta_slow,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::ggml::backend::run_on_cpu;
    use crate::ggml::{DType, GraphBuilder};

    /// The causal convolution of one channel: each output is the kernel's dot product with the last
    /// `kernel` inputs (the state's, then the step's).
    #[test]
    fn the_convolution_sees_the_previous_inputs_and_the_step() {
        let g = GraphBuilder::new(16);
        // 3-wide kernel, 2 channels, 2 earlier inputs and 3 new ones per channel.
        let input = g.input("x", DType::F32, &[5, 2, 1]);
        let kernel = g.input("k", DType::F32, &[3, 2]);
        let out = g.output(g.ssm_conv(input, kernel));
        let graph = g.finish(out);
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0];
        let k = [1.0, 0.0, -1.0, 0.5, 0.5, 0.5];
        let got = run_on_cpu(&graph, 1, |b| {
            b.set_input(&graph, "x", &x);
            b.set_input(&graph, "k", &k);
        });
        // Channel 0: x[t] - x[t+2]; channel 1: the mean of three, times 1.5.
        assert_eq!(got, vec![-2.0, 30.0, -2.0, 45.0, -2.0, 60.0]);
    }

    /// With a zero gate (no decay) and beta 1, one token writes v kᵀ into a zero state, and the output
    /// is that state times q: v (k · q) scaled by 1/√S.
    #[test]
    fn one_delta_rule_step_from_a_zero_state() {
        let s = 2i64;
        let g = GraphBuilder::new(16);
        let q = g.input("q", DType::F32, &[s, 1, 1, 1]);
        let k = g.input("k", DType::F32, &[s, 1, 1, 1]);
        let v = g.input("v", DType::F32, &[s, 1, 1, 1]);
        let gate = g.input("g", DType::F32, &[1, 1, 1, 1]);
        let beta = g.input("b", DType::F32, &[1, 1, 1, 1]);
        let state = g.input("s", DType::F32, &[s, s, 1, 1]);
        let out = g.output(g.gated_delta_net(q, k, v, gate, beta, state));
        let graph = g.finish(out);
        let got = run_on_cpu(&graph, 1, |b| {
            b.set_input(&graph, "q", &[1.0, 1.0]);
            b.set_input(&graph, "k", &[1.0, 0.0]);
            b.set_input(&graph, "v", &[3.0, 5.0]);
            b.set_input(&graph, "g", &[0.0]);
            b.set_input(&graph, "b", &[1.0]);
            b.set_input(&graph, "s", &[0.0; 4]);
        });
        let scale = 1.0 / 2f32.sqrt();
        assert!((got[0] - 3.0 * scale).abs() < 1e-5 && (got[1] - 5.0 * scale).abs() < 1e-5, "{got:?}");
        // The state follows the two outputs: v kᵀ, four values, of which those of k's zero column are 0.
        assert_eq!(got.len(), 6);
        assert_eq!(got[2..].iter().filter(|v| **v == 0.0).count(), 2, "{got:?}");
    }
}
