//! Graph ops that rearrange tensors rather than compute new values: concatenation, copies into
//! contiguous memory or into another element type, repetition, 4-D reshapes, constant fills, and RoPE
//! on a part of each row. Split from `graph.rs`, which holds the builder itself and the arithmetic ops.

use super::graph::{GraphBuilder, Tensor};
use super::sys;
use super::DType;

impl GraphBuilder {
    /// `a` and `b` joined along dimension `dim` (their other dimensions agree).
    pub fn concat<'g>(&'g self, a: Tensor<'g>, b: Tensor<'g>, dim: i32) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: both belong to this graph; ggml asserts the shapes agree outside `dim`.
        self.adopt(unsafe { sys::ggml_concat(self.ctx(), a.raw.as_ptr(), b.raw.as_ptr(), dim) })
    }

    /// `a` converted to `dtype`, element by element (from a quantized type: dequantized into F32).
    pub fn cast<'g>(&'g self, a: Tensor<'g>, dtype: DType) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: `a` belongs to this graph; ggml asserts the conversion is one it implements.
        self.adopt(unsafe { sys::ggml_cast(self.ctx(), a.raw.as_ptr(), dtype.raw()) })
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

#[cfg(test)]
mod tests {
    use crate::ggml::backend::run_on_cpu;
    use crate::ggml::{DType, GraphBuilder};

    /// A quantized tensor cast to F32 is dequantized (deepseek2 casts a quantized `attn_k_b` so that it
    /// can be transposed): values through Q8_0 and back come out within Q8_0's rounding, a step of the
    /// block's largest magnitude / 127.
    #[test]
    fn a_cast_from_a_quantized_type_dequantizes() {
        let (width, rows) = (64usize, 3usize);
        let values: Vec<f32> = (0..width * rows).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let g = GraphBuilder::new(8);
        let x = g.input("x", DType::F32, &[width as i64, rows as i64]);
        let quantized = g.cast(x, DType::Q8_0);
        assert_eq!(quantized.dtype(), DType::Q8_0);
        let out = g.output(g.cast(quantized, DType::F32));
        let graph = g.finish(out);
        let got = run_on_cpu(&graph, 1, |backend| backend.set_input(&graph, "x", &values));
        assert_eq!(got.len(), values.len());
        for (block, (got, want)) in got.chunks(32).zip(values.chunks(32)).enumerate() {
            let step = want.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (a, b) in got.iter().zip(want) {
                assert!((a - b).abs() <= step * 0.51 + 1e-3, "block {block}: {a} for {b} (step {step})");
            }
            assert!(got != want, "block {block}: Q8_0 rounds these values");
        }
    }
}
