//! Graph ops of sparse attention (DeepSeek V3.2's lightning indexer: its scores over the cached
//! indexer keys, the top-k positions each query keeps, the layer norm of its keys; MiniMax M3's blocks:
//! the best score of each block, the blocks near each query's position) and of norms a
//! tensor-parallel group completes across ranks (the square and square root of a sum of squares).
//! Split from `graph.rs`, which holds the builder and the common ops.

use super::graph::{GraphBuilder, Tensor};
use super::sys;

impl GraphBuilder {
    /// `a - b`, broadcasting `b` over `a`.
    pub fn sub<'g>(&'g self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: both belong to this graph; ggml asserts `b` repeats into `a`.
        self.adopt(unsafe { sys::ggml_sub(self.ctx(), a.raw.as_ptr(), b.raw.as_ptr()) })
    }

    /// Each value squared.
    pub fn sqr<'g>(&'g self, a: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: `a` belongs to this graph.
        self.adopt(unsafe { sys::ggml_sqr(self.ctx(), a.raw.as_ptr()) })
    }

    /// Each value's square root.
    pub fn sqrt<'g>(&'g self, a: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: `a` belongs to this graph.
        self.adopt(unsafe { sys::ggml_sqrt(self.ctx(), a.raw.as_ptr()) })
    }

    /// `a · s + b`, value by value.
    pub fn scale_bias<'g>(&'g self, a: Tensor<'g>, s: f32, b: f32) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: `a` belongs to this graph.
        self.adopt(unsafe { sys::ggml_scale_bias(self.ctx(), a.raw.as_ptr(), s, b) })
    }

    /// Each row shifted to mean 0 and scaled to variance 1 (a layer norm without weight or bias).
    pub fn layer_norm<'g>(&'g self, a: Tensor<'g>, eps: f32) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: `a` belongs to this graph.
        self.adopt(unsafe { sys::ggml_norm(self.ctx(), a.raw.as_ptr(), eps) })
    }

    /// The largest of each run of `width` values along rows ([n, …] → [n / width, …]).
    pub fn max_pool_rows<'g>(&'g self, a: Tensor<'g>, width: usize) -> Tensor<'g> {
        self.reserve(1);
        let w = width as i32;
        // SAFETY: `a` belongs to this graph; a pooling window of `width` × 1, as wide as its stride.
        self.adopt(unsafe {
            sys::ggml_pool_2d(self.ctx(), a.raw.as_ptr(), sys::GGML_OP_POOL_MAX, w, 1, w, 1, 0.0, 0.0)
        })
    }

    /// Each value rounded down.
    pub fn floor<'g>(&'g self, a: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: `a` belongs to this graph.
        self.adopt(unsafe { sys::ggml_floor(self.ctx(), a.raw.as_ptr()) })
    }

    /// 1 where a value is above 0, else 0.
    pub fn step<'g>(&'g self, a: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: `a` belongs to this graph.
        self.adopt(unsafe { sys::ggml_step(self.ctx(), a.raw.as_ptr()) })
    }

    /// 0, 1, …, n - 1 (F32).
    pub fn arange<'g>(&'g self, n: usize) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: a new tensor of this graph.
        self.adopt(unsafe { sys::ggml_arange(self.ctx(), 0.0, n as f32, 1.0) })
    }

    /// The indices (I32) of the `k` largest values of each row, in no particular order.
    pub fn top_k<'g>(&'g self, a: Tensor<'g>, k: i64) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: `a` belongs to this graph; ggml asserts k <= the row length.
        self.adopt(unsafe { sys::ggml_top_k(self.ctx(), a.raw.as_ptr(), k as i32) })
    }

    /// DeepSeek's lightning indexer: for queries `q` ([width, heads, tokens, sequences]) over cached
    /// keys `k` ([width, 1, positions, sequences]), `Σ_heads weight · relu(q·k)` with `weights`
    /// ([heads, tokens, 1, sequences], already scaled), plus `mask` (F16 [positions, tokens, 1,
    /// sequences]): [positions, tokens, 1, sequences].
    pub fn lightning_indexer<'g>(
        &'g self,
        q: Tensor<'g>,
        k: Tensor<'g>,
        weights: Tensor<'g>,
        mask: Tensor<'g>,
    ) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: all belong to this graph or outlive it; ggml asserts the shapes and the mask's type.
        self.adopt(unsafe {
            sys::ggml_lightning_indexer(
                self.ctx(),
                q.raw.as_ptr(),
                k.raw.as_ptr(),
                weights.raw.as_ptr(),
                mask.raw.as_ptr(),
            )
        })
    }
}
