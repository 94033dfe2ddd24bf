//! Graph ops particular to some architectures or caches: attention sinks and per-expert biases
//! (gpt-oss), gpt-oss's clamped SwiGLU, a weighted sum of residual streams (Kimi K3), and the Walsh-Hadamard rotation of heads a quantized KV cache
//! stores. Split from `graph.rs`, which holds the builder and the common ops.

use super::graph::{GraphBuilder, Tensor};
use super::sys;

impl GraphBuilder {
    /// Adds to a flash-attention op (just built by [`GraphBuilder::flash_attention`]) one learned logit
    /// per head (`sinks`, F32 [heads]) that joins each softmax's denominator without a value: attention
    /// may go nowhere.
    pub fn attention_sinks<'g>(&'g self, attention: Tensor<'g>, sinks: Tensor<'g>) -> Tensor<'g> {
        // SAFETY: ggml asserts that `attention` is a flash-attention op; this sets its fourth source.
        unsafe { sys::ggml_flash_attn_ext_add_sinks(attention.raw.as_ptr(), sinks.raw.as_ptr()) };
        attention
    }

    /// `a` ([n, used, tokens]) plus, for each slot, the row of `biases` ([n, experts]) of the expert
    /// `ids` ([used, tokens]) names.
    pub fn add_id<'g>(&'g self, a: Tensor<'g>, biases: Tensor<'g>, ids: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: all belong to this graph or outlive it; ggml asserts the shapes.
        self.adopt(unsafe { sys::ggml_add_id(self.ctx(), a.raw.as_ptr(), biases.raw.as_ptr(), ids.raw.as_ptr()) })
    }

    /// `x` rotated by `rotation` (an orthonormal Walsh-Hadamard matrix, F32 [n, n]) in every run of `n`
    /// values, shaped as `x` was: what llama.cpp does to queries, keys and values around a quantized KV
    /// cache (`llama_mul_mat_hadamard`), marked so that ggml's CPU computes it as a fast transform.
    pub fn mul_mat_hadamard<'g>(&'g self, rotation: Tensor<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let n = rotation.shape()[0];
        let shape = x.shape();
        let elements: i64 = shape.iter().product();
        // SAFETY: a plain query of a tensor of this graph.
        let contiguous = unsafe { sys::ggml_is_contiguous(x.raw.as_ptr()) };
        let rows = if contiguous { x } else { self.cont(x) };
        let rows = self.reshape_2d(rows, n, elements / n);
        let rotated = self.mul_mat_as_stored(rotation, rows);
        // SAFETY: `rotated` is the product just built; this sets one of its parameters.
        unsafe { sys::ggml_mul_mat_set_hint(rotated.raw.as_ptr(), sys::GGML_HINT_SRC0_IS_HADAMARD) };
        self.reshape_4d(rotated, shape)
    }

    /// gpt-oss's gated activation: `(up + 1) · gate · σ(alpha · gate)` with the gate clamped above at
    /// `limit` and `up` to ±`limit`.
    pub fn swiglu_oai<'g>(&'g self, gate: Tensor<'g>, up: Tensor<'g>, alpha: f32, limit: f32) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: both belong to this graph; ggml asserts their shapes agree.
        self.adopt(unsafe { sys::ggml_swiglu_oai(self.ctx(), gate.raw.as_ptr(), up.raw.as_ptr(), alpha, limit) })
    }

    /// Per token, the sum of `streams` ([width, streams, tokens]) weighted by `weights` ([streams,
    /// tokens]): [width, tokens] (ggml's `dsv4_hc_pre`; Kimi K3 mixes its residual checkpoints with it).
    pub fn weighted_streams<'g>(&'g self, streams: Tensor<'g>, weights: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: both belong to this graph; ggml asserts F32 and the shapes.
        self.adopt(unsafe { sys::ggml_dsv4_hc_pre(self.ctx(), streams.raw.as_ptr(), weights.raw.as_ptr()) })
    }
}

#[cfg(test)]
mod tests {
    use crate::ggml::backend::run_on_cpu;
    use crate::ggml::{DType, GraphBuilder};

    /// Each token's streams summed by that token's weights.
    #[test]
    fn streams_are_summed_by_each_tokens_weights() {
        let g = GraphBuilder::new(16);
        let x = g.input("x", DType::F32, &[2, 3, 2]);
        let w = g.input("w", DType::F32, &[3, 2]);
        let out = g.output(g.weighted_streams(x, w));
        let graph = g.finish(out);
        let got = run_on_cpu(&graph, 1, |b| {
            b.set_input(&graph, "x", &[1.0, 2.0, 10.0, 20.0, 100.0, 200.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
            b.set_input(&graph, "w", &[1.0, 0.5, 0.25, 0.0, 1.0, 2.0]);
        });
        assert_eq!(got, vec![31.0, 62.0, 8.0, 8.0]);
    }
}
