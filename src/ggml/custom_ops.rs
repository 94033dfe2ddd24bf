//! Operations ggml has no kernel for, run by the CPU back end through ggml's custom-op hooks: the sum of
//! a tensor across a tensor-parallel group (an all-reduce, done by whatever moves the bytes between the
//! group's processes), and the remapping of chosen experts onto the experts one rank holds. What each
//! hook reads (the collective, the expert range) is owned by the graph, so it lives as long as the graph
//! can run.

use super::graph::{GraphBuilder, Tensor};
use super::{sys, DType};
use std::ffi::c_void;
use std::ops::Range;
use std::os::raw::c_int;
use std::sync::Arc;

/// What a graph hands a tensor to while it computes: the sum of that tensor over a group of processes
/// that each compute a part of it.
pub trait Collective: Send + Sync {
    /// Sets `out` to the sum over the group of each member's `local` (as long everywhere), adding in an
    /// order every member follows alike, so that every member gets the same bits. A failure (a member
    /// gone) is kept by the collective for its owner to report after the compute; `out` is then zeros.
    fn all_reduce(&self, local: &[f32], out: &mut [f32]);
}

/// Keeps what a custom op's hook reads alive with the graph (the hooks read it through raw pointers).
#[allow(dead_code)]
pub(super) enum Hooked {
    Collective(Box<Arc<dyn Collective>>),
    Experts(Box<Range<i32>>),
}

impl GraphBuilder {
    /// The sum of `a` (F32) over `collective`'s group, computed by it during the graph's compute.
    pub fn all_reduce<'g>(&'g self, a: Tensor<'g>, collective: &Arc<dyn Collective>) -> Tensor<'g> {
        assert_eq!(a.dtype(), DType::F32, "an all-reduce sums F32 values");
        let a = if self.is_contiguous(a) { a } else { self.cont(a) };
        let boxed = Box::new(collective.clone());
        let userdata = &*boxed as *const Arc<dyn Collective> as *mut c_void;
        self.keep(Hooked::Collective(boxed));
        self.reserve(1);
        // SAFETY: `a` belongs to this graph; the hook runs on one thread (n_tasks 1) and reads `userdata`,
        // which the graph keeps alive (above) as long as it can compute.
        self.adopt(unsafe { sys::ggml_map_custom1(self.ctx(), a.raw.as_ptr(), Some(all_reduce_hook), 1, userdata) })
    }

    /// For expert parallelism: the chosen experts `ids` (I32, global indices) as indices among the
    /// experts `held` that this rank holds. A chosen expert held elsewhere becomes one this rank computes
    /// for the same token anyway (or its first held expert), and its weight must be zeroed with
    /// [`GraphBuilder::held_expert_weights`]: the slot then costs no extra expert's weights.
    pub fn held_expert_ids<'g>(&'g self, ids: Tensor<'g>, held: Range<usize>) -> Tensor<'g> {
        assert_eq!(ids.dtype(), DType::I32, "expert ids are I32");
        let ids = if self.is_contiguous(ids) { ids } else { self.cont(ids) };
        let userdata = self.keep_experts(held);
        self.reserve(1);
        // SAFETY: as in `all_reduce`; the output has the shape and type of `ids`.
        self.adopt(unsafe { sys::ggml_map_custom1(self.ctx(), ids.raw.as_ptr(), Some(held_ids_hook), 1, userdata) })
    }

    /// `weights` (F32 [1, used, tokens]) with the weight of every chosen expert (`ids`, I32 [used,
    /// tokens]) that this rank does not hold set to zero.
    pub fn held_expert_weights<'g>(&'g self, weights: Tensor<'g>, ids: Tensor<'g>, held: Range<usize>) -> Tensor<'g> {
        let weights = if self.is_contiguous(weights) { weights } else { self.cont(weights) };
        let ids = if self.is_contiguous(ids) { ids } else { self.cont(ids) };
        let userdata = self.keep_experts(held);
        self.reserve(1);
        // SAFETY: as in `all_reduce`; the hook checks both tensors' element counts agree.
        self.adopt(unsafe {
            sys::ggml_map_custom2(
                self.ctx(),
                weights.raw.as_ptr(),
                ids.raw.as_ptr(),
                Some(held_weights_hook),
                1,
                userdata,
            )
        })
    }

    pub(super) fn keep_experts(&self, held: Range<usize>) -> *mut c_void {
        let boxed = Box::new(held.start as i32..held.end as i32);
        let userdata = &*boxed as *const Range<i32> as *mut c_void;
        self.keep(Hooked::Experts(boxed));
        userdata
    }

    pub(super) fn is_contiguous(&self, a: Tensor<'_>) -> bool {
        // SAFETY: the tensor belongs to this graph.
        unsafe { sys::ggml_is_contiguous(a.raw.as_ptr()) }
    }
}

/// The elements of a contiguous tensor.
///
/// # Safety
/// `t` must be a live, allocated, contiguous tensor of `T`'s type.
unsafe fn elements<'a, T>(t: *const sys::ggml_tensor) -> &'a [T] {
    let n = sys::ggml_nelements(t) as usize;
    std::slice::from_raw_parts((*t).data as *const T, n)
}

/// # Safety
/// As [`elements`], and nothing else may use the tensor's data meanwhile.
unsafe fn elements_mut<'a, T>(t: *mut sys::ggml_tensor) -> &'a mut [T] {
    let n = sys::ggml_nelements(t) as usize;
    std::slice::from_raw_parts_mut((*t).data as *mut T, n)
}

unsafe extern "C" fn all_reduce_hook(
    dst: *mut sys::ggml_tensor,
    a: *const sys::ggml_tensor,
    ith: c_int,
    _nth: c_int,
    userdata: *mut c_void,
) {
    if ith != 0 {
        return;
    }
    // SAFETY: `userdata` points at the Arc the graph keeps (see `all_reduce`); `a` and `dst` are the
    // op's contiguous F32 source and its own output, of equal shape, allocated by the scheduler.
    let collective = &*(userdata as *const Arc<dyn Collective>);
    collective.all_reduce(elements::<f32>(a), elements_mut::<f32>(dst));
}

unsafe extern "C" fn held_ids_hook(
    dst: *mut sys::ggml_tensor,
    a: *const sys::ggml_tensor,
    ith: c_int,
    _nth: c_int,
    userdata: *mut c_void,
) {
    if ith != 0 {
        return;
    }
    // SAFETY: see `all_reduce_hook`; `a` and `dst` are contiguous I32 [used, tokens].
    let held = &*(userdata as *const Range<i32>);
    let used = (*a).ne[0] as usize;
    let (ids, out) = (elements::<i32>(a), elements_mut::<i32>(dst));
    for (token, local) in ids.chunks(used.max(1)).zip(out.chunks_mut(used.max(1))) {
        // An expert this rank computes for the token anyway, so that a slot held elsewhere reads no
        // other expert's weights.
        let fallback = token.iter().find(|id| held.contains(id)).map_or(0, |id| id - held.start);
        for (id, l) in token.iter().zip(local.iter_mut()) {
            *l = if held.contains(id) { id - held.start } else { fallback };
        }
    }
}

unsafe extern "C" fn held_weights_hook(
    dst: *mut sys::ggml_tensor,
    weights: *const sys::ggml_tensor,
    ids: *const sys::ggml_tensor,
    ith: c_int,
    _nth: c_int,
    userdata: *mut c_void,
) {
    if ith != 0 {
        return;
    }
    // SAFETY: see `all_reduce_hook`; `weights`/`dst` are contiguous F32 and `ids` contiguous I32, one
    // weight per id (checked).
    let held = &*(userdata as *const Range<i32>);
    let (w, ids, out) = (elements::<f32>(weights), elements::<i32>(ids), elements_mut::<f32>(dst));
    if w.len() != ids.len() {
        out.fill(0.0);
        return;
    }
    for ((o, w), id) in out.iter_mut().zip(w).zip(ids) {
        *o = if held.contains(id) { *w } else { 0.0 };
    }
}
