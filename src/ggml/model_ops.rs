//! Graph ops particular to some architectures: attention sinks and per-expert biases (gpt-oss), and
//! gpt-oss's clamped SwiGLU. Split from `graph.rs`, which holds the builder and the common ops.

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

    /// gpt-oss's gated activation: `(up + 1) · gate · σ(alpha · gate)` with the gate clamped above at
    /// `limit` and `up` to ±`limit`.
    pub fn swiglu_oai<'g>(&'g self, gate: Tensor<'g>, up: Tensor<'g>, alpha: f32, limit: f32) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: both belong to this graph; ggml asserts their shapes agree.
        self.adopt(unsafe { sys::ggml_swiglu_oai(self.ctx(), gate.raw.as_ptr(), up.raw.as_ptr(), alpha, limit) })
    }
}
