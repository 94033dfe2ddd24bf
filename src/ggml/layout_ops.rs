//! Graph ops that rearrange tensors rather than compute new values: concatenation, copies into
//! contiguous memory, repetition, 4-D reshapes, constant fills, and RoPE on a part of each row. Split
//! from `graph.rs`, which holds the builder itself and the arithmetic ops.

use super::graph::{GraphBuilder, Tensor};
use super::sys;

impl GraphBuilder {
    /// `a` and `b` joined along dimension `dim` (their other dimensions agree).
    pub fn concat<'g>(&'g self, a: Tensor<'g>, b: Tensor<'g>, dim: i32) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: both belong to this graph; ggml asserts the shapes agree outside `dim`.
        self.adopt(unsafe { sys::ggml_concat(self.ctx(), a.raw.as_ptr(), b.raw.as_ptr(), dim) })
    }

    /// A contiguous copy of `a` (a view or a permutation).
    pub fn cont<'g>(&'g self, a: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: `a` belongs to this graph.
        self.adopt(unsafe { sys::ggml_cont(self.ctx(), a.raw.as_ptr()) })
    }

    /// `a` repeated to the shape `shape` (each dimension a multiple of `a`'s).
    pub fn repeat<'g>(&'g self, a: Tensor<'g>, shape: [i64; 4]) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: ggml asserts that `a` repeats into `shape`.
        self.adopt(unsafe { sys::ggml_repeat_4d(self.ctx(), a.raw.as_ptr(), shape[0], shape[1], shape[2], shape[3]) })
    }

    pub fn reshape_4d<'g>(&'g self, a: Tensor<'g>, shape: [i64; 4]) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: ggml asserts the element counts agree and the source is contiguous.
        self.adopt(unsafe { sys::ggml_reshape_4d(self.ctx(), a.raw.as_ptr(), shape[0], shape[1], shape[2], shape[3]) })
    }

    /// A tensor shaped like `a` with every element `value`.
    pub fn fill<'g>(&'g self, a: Tensor<'g>, value: f32) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: `a` belongs to this graph.
        self.adopt(unsafe { sys::ggml_fill(self.ctx(), a.raw.as_ptr(), value) })
    }

    /// Makes the RoPE op `rope` (just built by [`GraphBuilder::rope`]) turn the `n_dims` values that follow
    /// the first `offset` of each head instead of the first ones; the others pass unchanged.
    pub fn rope_at_offset<'g>(&'g self, rope: Tensor<'g>, offset: i32) -> Tensor<'g> {
        // SAFETY: ggml asserts that `rope` is a RoPE op; this sets one of its parameters.
        let raw = unsafe { sys::ggml_rope_set_offset(rope.raw.as_ptr(), offset) };
        self.adopt(raw)
    }
}
