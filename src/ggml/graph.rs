//! Building ggml compute graphs from safe handles: the thin tensor layer model code is written against.

use super::custom_ops::Hooked;
use super::tensor_set::SetInner;
use super::{sys, DType, SetTensorRef};
use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Rust types that can be copied into or out of graph tensors.
pub trait Element: Copy {
    const DTYPE: DType;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}

/// A tensor in a graph under construction. Only valid while its [`GraphBuilder`] is.
#[derive(Clone, Copy)]
pub struct Tensor<'g> {
    pub(super) raw: NonNull<sys::ggml_tensor>,
    _builder: PhantomData<&'g GraphBuilder>,
}

impl Tensor<'_> {
    /// ggml order: `shape()[0]` is the row length.
    pub fn shape(&self) -> [i64; 4] {
        // SAFETY: the tensor lives in the builder's context, which outlives this handle.
        unsafe { self.raw.as_ref().ne }
    }

    /// Byte strides of each dimension.
    pub fn strides(&self) -> [usize; 4] {
        // SAFETY: as above.
        unsafe { self.raw.as_ref().nb }
    }

    pub fn dtype(&self) -> DType {
        // SAFETY: as above; ggml only creates tensors of valid types.
        DType::from_id(unsafe { self.raw.as_ref().type_ }).expect("ggml tensor of a known type")
    }

    fn bytes(&self) -> usize {
        // SAFETY: as above.
        unsafe { sys::ggml_nbytes(self.raw.as_ptr()) }
    }
}

/// The ggml context a graph's tensors live in, and the graph's node list inside it.
struct GraphParts {
    ctx: NonNull<sys::ggml_context>,
    graph: NonNull<sys::ggml_cgraph>,
}

impl Drop for GraphParts {
    fn drop(&mut self) {
        // SAFETY: the context was created by `GraphBuilder::new` and is freed once; the graph lives in it.
        unsafe { sys::ggml_free(self.ctx.as_ptr()) };
    }
}

/// Builds one graph: inputs, stored tensors it uses, and ops. Finish with [`GraphBuilder::finish`].
pub struct GraphBuilder {
    parts: GraphParts,
    capacity: usize,
    created: Cell<usize>,
    inputs: RefCell<Vec<(&'static str, NonNull<sys::ggml_tensor>)>>,
    keepalive: RefCell<Vec<Arc<SetInner>>>,
    /// What the graph's custom ops read while it computes.
    hooks: RefCell<Vec<Hooked>>,
    /// Whether products of Q5_0 weights by many rows widen the weights first (see [`super::widen`]).
    widen_products: Cell<bool>,
}

/// The output of a graph under construction, detached from the builder's borrow (see [`GraphBuilder::output`]).
pub struct GraphOutput {
    raw: NonNull<sys::ggml_tensor>,
    ctx: NonNull<sys::ggml_context>,
}

/// A built graph: its own tensors, the stored tensors it reads and writes, named inputs and one output.
pub struct Graph {
    pub(super) id: u64,
    parts: GraphParts,
    inputs: Vec<(&'static str, NonNull<sys::ggml_tensor>)>,
    pub(super) output: NonNull<sys::ggml_tensor>,
    _keepalive: Vec<Arc<SetInner>>,
    _hooks: Vec<Hooked>,
}

// SAFETY: a graph is plain heap memory owned by this value; it is only used through `&`/`&mut`, and the
// sets it keeps alive are themselves Send.
unsafe impl Send for Graph {}

static NEXT_GRAPH_ID: AtomicU64 = AtomicU64::new(1);

impl Graph {
    pub(super) fn raw(&self) -> *mut sys::ggml_cgraph {
        self.parts.graph.as_ptr()
    }

    /// Number of compute nodes.
    pub fn node_count(&self) -> usize {
        // SAFETY: the graph is alive.
        unsafe { sys::ggml_graph_n_nodes(self.raw()) as usize }
    }

    /// Whether the graph has an input named `name`.
    pub fn has_input(&self, name: &str) -> bool {
        self.inputs.iter().any(|(n, _)| *n == name)
    }

    pub(super) fn input(&self, name: &str) -> NonNull<sys::ggml_tensor> {
        self.inputs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
            .unwrap_or_else(|| panic!("graph has no input named {name}"))
    }

    /// Shape of the output tensor.
    pub fn output_shape(&self) -> [i64; 4] {
        // SAFETY: the output lives in this graph's context.
        unsafe { self.output.as_ref().ne }
    }
}

impl GraphBuilder {
    /// Starts a graph of at most `max_tensors` tensors.
    pub fn new(max_tensors: usize) -> GraphBuilder {
        // SAFETY: pure size computations, then a context whose memory ggml owns.
        let ctx = unsafe {
            let mem_size =
                sys::ggml_tensor_overhead() * max_tensors + sys::ggml_graph_overhead_custom(max_tensors, false);
            sys::ggml_init(sys::ggml_init_params { mem_size, mem_buffer: std::ptr::null_mut(), no_alloc: true })
        };
        let ctx = NonNull::new(ctx).expect("ggml_init failed to allocate a graph context");
        // SAFETY: the context was sized for a graph of `max_tensors` nodes.
        let graph = unsafe { sys::ggml_new_graph_custom(ctx.as_ptr(), max_tensors, false) };
        let parts = GraphParts { ctx, graph: NonNull::new(graph).expect("graph allocation inside a sized context") };
        GraphBuilder {
            parts,
            capacity: max_tensors,
            created: Cell::new(0),
            inputs: RefCell::new(Vec::new()),
            keepalive: RefCell::new(Vec::new()),
            hooks: RefCell::new(Vec::new()),
            widen_products: Cell::new(false),
        }
    }

    /// From now on, [`GraphBuilder::mul_mat`] widens Q5_0 weights multiplied by many rows to Q8_0 first:
    /// the same bits, sooner, on ggml's CPU back end (see [`super::widen`]). Only for graphs that run
    /// on the CPU: elsewhere the widening (a custom op) would pull the weights off the device.
    pub fn widen_many_row_products(&self) {
        self.widen_products.set(true);
    }

    /// Marks `t` as the graph's output, ending its borrow of the builder.
    pub fn output(&self, t: Tensor<'_>) -> GraphOutput {
        GraphOutput { raw: t.raw, ctx: self.parts.ctx }
    }

    /// Completes the graph: the output and everything it depends on become the graph's nodes.
    pub fn finish(self, output: GraphOutput) -> Graph {
        assert_eq!(output.ctx, self.parts.ctx, "output belongs to another graph");
        // SAFETY: the output belongs to this context; expanding records it and its ancestors.
        unsafe {
            sys::ggml_set_output(output.raw.as_ptr());
            sys::ggml_build_forward_expand(self.parts.graph.as_ptr(), output.raw.as_ptr());
        }
        Graph {
            id: NEXT_GRAPH_ID.fetch_add(1, Ordering::Relaxed),
            parts: self.parts,
            inputs: self.inputs.into_inner(),
            output: output.raw,
            _keepalive: self.keepalive.into_inner(),
            _hooks: self.hooks.into_inner(),
        }
    }

    pub(super) fn ctx(&self) -> *mut sys::ggml_context {
        self.parts.ctx.as_ptr()
    }

    /// Keeps what a custom op reads alive for as long as the graph.
    pub(super) fn keep(&self, hooked: Hooked) {
        self.hooks.borrow_mut().push(hooked);
    }

    pub(super) fn adopt(&self, raw: *mut sys::ggml_tensor) -> Tensor<'_> {
        let raw = NonNull::new(raw).expect("ggml op returned no tensor");
        Tensor { raw, _builder: PhantomData }
    }

    /// Guards ggml's context size: running out would abort the process.
    pub(super) fn reserve(&self, n: usize) {
        let created = self.created.get() + n;
        self.created.set(created);
        assert!(created < self.capacity, "graph needs more than {} tensors; raise max_tensors", self.capacity);
    }

    /// A new input tensor whose data is set before each compute, by name.
    pub fn input(&self, name: &'static str, dtype: DType, shape: &[i64]) -> Tensor<'_> {
        assert!(!shape.is_empty() && shape.len() <= 4 && shape.iter().all(|&n| n > 0), "bad input shape {shape:?}");
        self.reserve(1);
        let cname = CString::new(name).expect("input names have no NUL");
        // SAFETY: the context has room (checked by `reserve`); the shape is valid.
        let raw = unsafe {
            let t = sys::ggml_new_tensor(self.parts.ctx.as_ptr(), dtype.raw(), shape.len() as i32, shape.as_ptr());
            sys::ggml_set_name(t, cname.as_ptr());
            sys::ggml_set_input(t);
            t
        };
        let t = self.adopt(raw);
        self.inputs.borrow_mut().push((name, t.raw));
        t
    }

    /// Uses a stored tensor (a weight or a cache) in this graph; its set stays alive with the graph.
    pub fn stored(&self, tensor: &SetTensorRef) -> Tensor<'_> {
        let mut keep = self.keepalive.borrow_mut();
        if !keep.iter().any(|k| Arc::ptr_eq(k, &tensor.owner)) {
            keep.push(tensor.owner.clone());
        }
        Tensor { raw: tensor.raw, _builder: PhantomData }
    }

    /// Adds `t` (typically a write into a cache) to the graph now, so it runs before later nodes that
    /// read what it writes.
    pub fn expand(&self, t: Tensor<'_>) {
        // SAFETY: both belong to this builder.
        unsafe { sys::ggml_build_forward_expand(self.parts.graph.as_ptr(), t.raw.as_ptr()) };
    }

    pub fn get_rows<'g>(&'g self, table: Tensor<'g>, rows: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: all tensors belong to this graph or outlive it; ggml validates shapes.
        self.adopt(unsafe { sys::ggml_get_rows(self.parts.ctx.as_ptr(), table.raw.as_ptr(), rows.raw.as_ptr()) })
    }

    /// `a` ([k, n]) times `b` ([k, m]) → [n, m]; Q5_0 weights by many rows widened first where the
    /// graph asks for it ([`GraphBuilder::widen_many_row_products`]).
    pub fn mul_mat<'g>(&'g self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        let a = if self.widen_products.get() && self.worth_widening(a, b) { self.widened_to_q8_0(a) } else { a };
        self.mul_mat_as_stored(a, b)
    }

    /// [`GraphBuilder::mul_mat`] of `a` as it is stored, never widened: for a product whose widened
    /// copy would be large and is not counted in a stage's compute memory (the output head).
    pub fn mul_mat_as_stored<'g>(&'g self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: see get_rows.
        self.adopt(unsafe { sys::ggml_mul_mat(self.parts.ctx.as_ptr(), a.raw.as_ptr(), b.raw.as_ptr()) })
    }

    /// Element-wise product, broadcasting `b` over `a`.
    pub fn mul<'g>(&'g self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: see get_rows.
        self.adopt(unsafe { sys::ggml_mul(self.parts.ctx.as_ptr(), a.raw.as_ptr(), b.raw.as_ptr()) })
    }

    /// Element-wise sum, broadcasting `b` over `a`.
    pub fn add<'g>(&'g self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: see get_rows.
        self.adopt(unsafe { sys::ggml_add(self.parts.ctx.as_ptr(), a.raw.as_ptr(), b.raw.as_ptr()) })
    }

    pub fn rms_norm<'g>(&'g self, a: Tensor<'g>, eps: f32) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: see get_rows.
        self.adopt(unsafe { sys::ggml_rms_norm(self.parts.ctx.as_ptr(), a.raw.as_ptr(), eps) })
    }

    /// Rotary position embedding of `a` ([head_dim, heads, tokens]) at `positions` (I32 [tokens]).
    pub fn rope<'g>(
        &'g self,
        a: Tensor<'g>,
        positions: Tensor<'g>,
        factors: Option<Tensor<'g>>,
        p: &RopeParams,
    ) -> Tensor<'g> {
        self.reserve(1);
        let factors = factors.map_or(std::ptr::null_mut(), |f| f.raw.as_ptr());
        // SAFETY: see get_rows; `factors` may be null, which ggml accepts.
        self.adopt(unsafe {
            sys::ggml_rope_ext(
                self.parts.ctx.as_ptr(),
                a.raw.as_ptr(),
                positions.raw.as_ptr(),
                factors,
                p.n_dims,
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

    pub fn reshape_2d<'g>(&'g self, a: Tensor<'g>, ne0: i64, ne1: i64) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: ggml asserts the element counts agree and the source is contiguous.
        self.adopt(unsafe { sys::ggml_reshape_2d(self.parts.ctx.as_ptr(), a.raw.as_ptr(), ne0, ne1) })
    }

    pub fn reshape_3d<'g>(&'g self, a: Tensor<'g>, ne0: i64, ne1: i64, ne2: i64) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: as reshape_2d.
        self.adopt(unsafe { sys::ggml_reshape_3d(self.parts.ctx.as_ptr(), a.raw.as_ptr(), ne0, ne1, ne2) })
    }

    /// A strided view of `a`: `shape` elements with byte strides `strides` (for dims 1..) from byte
    /// `offset`. Panics if any element of the view would lie outside `a`.
    pub fn view<'g>(&'g self, a: Tensor<'g>, shape: &[i64], strides: &[usize], offset: usize) -> Tensor<'g> {
        assert!(!shape.is_empty() && shape.len() <= 4 && strides.len() == shape.len() - 1, "bad view rank");
        assert!(shape.iter().all(|&n| n > 0), "empty view");
        let row = a.dtype().row_bytes(shape[0] as u64).expect("view rows are whole blocks") as usize;
        let extent =
            shape[1..].iter().zip(strides).fold(offset + row, |end, (&n, &stride)| end + (n as usize - 1) * stride);
        assert!(extent <= a.bytes(), "view reaches byte {extent} of a {}-byte tensor", a.bytes());
        self.reserve(1);
        let (ctx, src) = (self.parts.ctx.as_ptr(), a.raw.as_ptr());
        // SAFETY: the view's extent was checked to lie inside `a`.
        self.adopt(unsafe {
            match shape.len() {
                1 => sys::ggml_view_1d(ctx, src, shape[0], offset),
                2 => sys::ggml_view_2d(ctx, src, shape[0], shape[1], strides[0], offset),
                3 => sys::ggml_view_3d(ctx, src, shape[0], shape[1], shape[2], strides[0], strides[1], offset),
                _ => sys::ggml_view_4d(
                    ctx, src, shape[0], shape[1], shape[2], shape[3], strides[0], strides[1], strides[2], offset,
                ),
            }
        })
    }

    pub fn permute<'g>(&'g self, a: Tensor<'g>, axes: [i32; 4]) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: ggml asserts the axes form a permutation.
        self.adopt(unsafe {
            sys::ggml_permute(self.parts.ctx.as_ptr(), a.raw.as_ptr(), axes[0], axes[1], axes[2], axes[3])
        })
    }

    /// Writes the rows of `src` into rows `indices` (I64) of `dst`, converting to `dst`'s type.
    pub fn set_rows<'g>(&'g self, dst: Tensor<'g>, src: Tensor<'g>, indices: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: ggml asserts shapes and types; indices are checked against `dst` by the caller.
        self.adopt(unsafe {
            sys::ggml_set_rows(self.parts.ctx.as_ptr(), dst.raw.as_ptr(), src.raw.as_ptr(), indices.raw.as_ptr())
        })
    }

    /// Fused attention softmax(q·kᵀ·scale + mask)·v with F32 accumulation. q: [d, tokens, heads],
    /// k/v: [d, kv, kv_heads] (F16), mask: F16 [kv, tokens]. Result: [d, heads, tokens].
    pub fn flash_attention<'g>(
        &'g self,
        q: Tensor<'g>,
        k: Tensor<'g>,
        v: Tensor<'g>,
        mask: Tensor<'g>,
        scale: f32,
    ) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: ggml asserts shapes and types of every operand.
        let raw = unsafe {
            let t = sys::ggml_flash_attn_ext(
                self.parts.ctx.as_ptr(),
                q.raw.as_ptr(),
                k.raw.as_ptr(),
                v.raw.as_ptr(),
                mask.raw.as_ptr(),
                scale,
                0.0,
                0.0,
            );
            sys::ggml_prec_set_acc(t, sys::GGML_PREC_F32);
            t
        };
        self.adopt(raw)
    }

    /// Softmax over each row.
    pub fn soft_max<'g>(&'g self, a: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: see get_rows.
        self.adopt(unsafe { sys::ggml_soft_max(self.parts.ctx.as_ptr(), a.raw.as_ptr()) })
    }

    pub fn sigmoid<'g>(&'g self, a: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: see get_rows.
        self.adopt(unsafe { sys::ggml_sigmoid(self.parts.ctx.as_ptr(), a.raw.as_ptr()) })
    }

    /// The indices (I32) of the `k` largest values of each row, largest first.
    pub fn argsort_top_k<'g>(&'g self, a: Tensor<'g>, k: i64) -> Tensor<'g> {
        self.reserve(2);
        // SAFETY: see get_rows; ggml asserts k <= the row length.
        self.adopt(unsafe { sys::ggml_argsort_top_k(self.parts.ctx.as_ptr(), a.raw.as_ptr(), k as i32) })
    }

    /// The sum of each row: [n, …] → [1, …].
    pub fn sum_rows<'g>(&'g self, a: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: see get_rows.
        self.adopt(unsafe { sys::ggml_sum_rows(self.parts.ctx.as_ptr(), a.raw.as_ptr()) })
    }

    /// Element-wise quotient, broadcasting `b` over `a`.
    pub fn div<'g>(&'g self, a: Tensor<'g>, b: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: see get_rows.
        self.adopt(unsafe { sys::ggml_div(self.parts.ctx.as_ptr(), a.raw.as_ptr(), b.raw.as_ptr()) })
    }

    pub fn clamp<'g>(&'g self, a: Tensor<'g>, min: f32, max: f32) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: see get_rows.
        self.adopt(unsafe { sys::ggml_clamp(self.parts.ctx.as_ptr(), a.raw.as_ptr(), min, max) })
    }

    /// `a` times the constant `s`.
    pub fn scale<'g>(&'g self, a: Tensor<'g>, s: f32) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: see get_rows.
        self.adopt(unsafe { sys::ggml_scale(self.parts.ctx.as_ptr(), a.raw.as_ptr(), s) })
    }

    /// Matrix products with chosen experts: `experts` is [k, n, n_expert], `b` is [k, 1 or used, tokens],
    /// `ids` (I32 [used, tokens]) names the experts of each token. Result: [n, used, tokens]. Only the
    /// chosen experts' rows are read.
    pub fn mul_mat_id<'g>(&'g self, experts: Tensor<'g>, b: Tensor<'g>, ids: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: see get_rows; ggml asserts the shapes agree.
        self.adopt(unsafe {
            sys::ggml_mul_mat_id(self.parts.ctx.as_ptr(), experts.raw.as_ptr(), b.raw.as_ptr(), ids.raw.as_ptr())
        })
    }

    pub fn tanh<'g>(&'g self, a: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: see get_rows.
        self.adopt(unsafe { sys::ggml_tanh(self.parts.ctx.as_ptr(), a.raw.as_ptr()) })
    }

    /// gelu(gate) · up, fused (GELU's tanh approximation, as Gemma uses).
    pub fn geglu<'g>(&'g self, gate: Tensor<'g>, up: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: ggml asserts equal shapes.
        self.adopt(unsafe { sys::ggml_geglu_split(self.parts.ctx.as_ptr(), gate.raw.as_ptr(), up.raw.as_ptr()) })
    }

    /// silu(gate) · up, fused.
    pub fn swiglu<'g>(&'g self, gate: Tensor<'g>, up: Tensor<'g>) -> Tensor<'g> {
        self.reserve(1);
        // SAFETY: ggml asserts equal shapes.
        self.adopt(unsafe { sys::ggml_swiglu_split(self.parts.ctx.as_ptr(), gate.raw.as_ptr(), up.raw.as_ptr()) })
    }
}

/// Parameters of [`GraphBuilder::rope`], as in `ggml_rope_ext`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub n_dims: i32,
    /// 0: adjacent pairs (llama); 2: halves (NeoX, Qwen).
    pub mode: i32,
    pub n_ctx_orig: i32,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}
