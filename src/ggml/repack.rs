//! Weights in the CPU's repacked layout. ggml's CPU back end can hold a quantized matrix interleaved, a
//! few rows' blocks side by side (its `CPU_REPACK` buffer type), where its kernels multiply several rows
//! at once; the copy is made once, at load. llama.cpp does this by default. Which types it covers
//! depends on the CPU: with AVX2, Q4_0, Q4_K, IQ4_NL and MXFP4; on ARM also Q5_K, Q6_K and Q8_0.
//!
//! A weight can move there only when every node of the graphs that reads it is the matrix of a
//! `mul_mat` (2-D) or `mul_mat_id` (3-D) that ggml's repacked kernels take; anything else (a row lookup,
//! a view, a custom op) would read the interleaved bytes as if they were the file's. [`Repacking`]
//! finds those weights and copies them.

use super::{sys, Device, DeviceKind, Graph, SetTensorRef};
use std::collections::HashMap;
use std::ffi::CStr;
use std::ptr::NonNull;

/// ggml's name for the buffer type of repacked CPU weights.
const REPACK_BUFFER_TYPE: &CStr = c"CPU_REPACK";

/// The repacked-weights buffer type of one CPU device, with an empty buffer of that type to ask ggml
/// which products it would take from it.
pub struct Repacking {
    device: Device,
    buffer_type: NonNull<sys::ggml_backend_buffer_type>,
    probe_buffer: NonNull<sys::ggml_backend_buffer>,
}

// SAFETY: the buffer type is a static of ggml's and the probe buffer holds no memory; neither has thread
// affinity, and they are only read.
unsafe impl Send for Repacking {}

impl Drop for Repacking {
    fn drop(&mut self) {
        // SAFETY: made in `for_device`, freed once.
        unsafe { sys::ggml_backend_buffer_free(self.probe_buffer.as_ptr()) };
    }
}

impl Repacking {
    /// The repacked layout of `device`: only the CPU has one, and only when ggml was built with it.
    pub fn for_device(device: Device) -> Option<Repacking> {
        if device.kind() != DeviceKind::Cpu {
            return None;
        }
        // SAFETY: plain queries of a registered device and its registry; the extra buffer types are a
        // static, null-terminated list ggml owns.
        unsafe {
            let registry = sys::ggml_backend_dev_backend_reg(device.raw());
            if registry.is_null() {
                return None;
            }
            let address =
                sys::ggml_backend_reg_get_proc_address(registry, c"ggml_backend_dev_get_extra_bufts".as_ptr());
            if address.is_null() {
                return None;
            }
            let extra_buffer_types: unsafe extern "C" fn(
                sys::ggml_backend_dev_t,
            ) -> *mut sys::ggml_backend_buffer_type_t = std::mem::transmute(address);
            let mut types = extra_buffer_types(device.raw());
            while !types.is_null() && !(*types).is_null() {
                let buffer_type = *types;
                if CStr::from_ptr(sys::ggml_backend_buft_name(buffer_type)) == REPACK_BUFFER_TYPE {
                    // A zero-sized allocation is a buffer of the type without memory.
                    let probe_buffer = NonNull::new(sys::ggml_backend_buft_alloc_buffer(buffer_type, 0))?;
                    return Some(Repacking { device, buffer_type: NonNull::new(buffer_type)?, probe_buffer });
                }
                types = types.add(1);
            }
            None
        }
    }

    pub(super) fn buffer_type(&self) -> *mut sys::ggml_backend_buffer_type {
        self.buffer_type.as_ptr()
    }

    /// Which of `weights` every one of `graphs` reads only as the matrix of a product the repacked
    /// kernels take (in `weights`' order). A weight no graph reads stays as it is.
    pub fn eligible(&self, graphs: &[&Graph], weights: &[SetTensorRef]) -> Vec<bool> {
        let index: HashMap<*mut sys::ggml_tensor, usize> =
            weights.iter().enumerate().map(|(i, w)| (w.raw.as_ptr(), i)).collect();
        // None: not read yet; Some(ok): read, and every read so far repackable.
        let mut verdicts: Vec<Option<bool>> = vec![None; weights.len()];
        for graph in graphs {
            for n in 0..graph.node_count() {
                // SAFETY: `n` is a valid node index of a live graph; its sources are live tensors.
                let node = unsafe { sys::ggml_graph_node(graph.raw(), n as i32) };
                let sources = unsafe { (*node).src };
                for (slot, source) in sources.iter().enumerate().filter(|(_, s)| !s.is_null()) {
                    let Some(&i) = index.get(source) else { continue };
                    let ok = slot == 0 && self.takes(node);
                    verdicts[i] = Some(verdicts[i].unwrap_or(true) && ok);
                }
            }
        }
        verdicts.into_iter().map(|v| v == Some(true)).collect()
    }

    /// Whether the repacked kernels would compute `node` were its matrix (source 0) repacked: a product
    /// of a 2-D matrix or a 3-D stack of experts by F32 activations, in a type and shape this CPU has a
    /// kernel for.
    ///
    /// The repacked `mul_mat_id` keeps one row per token for each expert, so a token may name an expert
    /// only once: true of a router's top-k, not of expert parallelism's remapped ids (a custom op, which
    /// sends a slot held elsewhere to an expert the token already uses), whose experts stay unpacked.
    fn takes(&self, node: *mut sys::ggml_tensor) -> bool {
        // SAFETY: `node` is a live node; its sources are live tensors.
        unsafe {
            let (op, matrix, activations) = ((*node).op, (*node).src[0], (*node).src[1]);
            let dims = sys::ggml_n_dims(matrix);
            let shaped = (op == sys::GGML_OP_MUL_MAT && dims == 2) || (op == sys::GGML_OP_MUL_MAT_ID && dims == 3);
            if !shaped || activations.is_null() || (*activations).type_ != sys::GGML_TYPE_F32 {
                return false;
            }
            if op == sys::GGML_OP_MUL_MAT_ID && computed_by_custom_op((*node).src[2]) {
                return false;
            }
            self.has_kernel_for(matrix)
        }
    }

    /// Whether this CPU has a repacked kernel for `matrix`'s type and shape: a 2-D one as a `mul_mat`'s,
    /// a 3-D one as a `mul_mat_id`'s (what [`TensorSet::repacked`](super::TensorSet::repacked) can copy).
    /// Asked of ggml with a product whose matrix is a copy of `matrix` lying in the probe buffer.
    pub(super) fn has_kernel_for(&self, matrix: *const sys::ggml_tensor) -> bool {
        // SAFETY: `matrix` is a live tensor. The probe context holds only descriptions (no data) and is
        // freed below.
        unsafe {
            let dims = sys::ggml_n_dims(matrix);
            if dims != 2 && dims != 3 {
                return false;
            }
            let params = sys::ggml_init_params {
                mem_size: sys::ggml_tensor_overhead() * 4,
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            };
            let ctx = sys::ggml_init(params);
            if ctx.is_null() {
                return false;
            }
            let ne = (*matrix).ne;
            let probe_matrix = sys::ggml_new_tensor(ctx, (*matrix).type_, dims, ne.as_ptr());
            (*probe_matrix).buffer = self.probe_buffer.as_ptr();
            let product = if dims == 2 {
                let x = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, ne[0], 1);
                sys::ggml_mul_mat(ctx, probe_matrix, x)
            } else {
                let x = sys::ggml_new_tensor_3d(ctx, sys::GGML_TYPE_F32, ne[0], 1, 1);
                let ids = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_I32, 1, 1);
                sys::ggml_mul_mat_id(ctx, probe_matrix, x, ids)
            };
            let takes = sys::ggml_backend_dev_supports_op(self.device.raw(), product);
            sys::ggml_free(ctx);
            takes
        }
    }
}

/// Whether `t` is the result of a custom op, seen through views, reshapes and copies.
///
/// # Safety
/// `t` is null or a live tensor whose sources are live.
unsafe fn computed_by_custom_op(mut t: *const sys::ggml_tensor) -> bool {
    const LAYOUT_OPS: [sys::ggml_op; 6] = [
        sys::GGML_OP_VIEW,
        sys::GGML_OP_RESHAPE,
        sys::GGML_OP_PERMUTE,
        sys::GGML_OP_TRANSPOSE,
        sys::GGML_OP_CONT,
        sys::GGML_OP_CPY,
    ];
    // SAFETY: the caller's; each source followed is a live tensor of the same graph.
    unsafe {
        while !t.is_null() && LAYOUT_OPS.contains(&(*t).op) {
            t = (*t).src[0];
        }
        !t.is_null()
            && [sys::GGML_OP_MAP_CUSTOM1, sys::GGML_OP_MAP_CUSTOM2, sys::GGML_OP_MAP_CUSTOM3, sys::GGML_OP_CUSTOM]
                .contains(&(*t).op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::{DType, SetTensor, TensorSet};

    /// With AVX2 (every x86_64 release build), Q4_0 matrices of 8 rows have a repacked kernel, Q4_1 ones
    /// and Q4_0 ones of 4 rows none; those are refused rather than handed to ggml's copy, which would
    /// crash on them, and so is a name given twice.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    fn only_matrices_with_a_repacked_kernel_are_copied() {
        let repacking = Repacking::for_device(Device::cpu()).expect("ggml is built with CPU_REPACK");
        let shape = [64u64, 8];
        let specs = [
            SetTensor { name: "q4_0", dtype: DType::Q4_0, shape: &shape },
            SetTensor { name: "q4_1", dtype: DType::Q4_1, shape: &shape },
            SetTensor { name: "q4_0_rows", dtype: DType::Q4_0, shape: &[64, 4] },
        ];
        let set = TensorSet::allocate(&specs, Device::cpu()).unwrap();
        let tensor = |name: &'static str| (name, set.get(name).unwrap());
        let copied = TensorSet::repacked(&repacking, &[tensor("q4_0")], |_| {}).unwrap();
        assert_eq!(copied.data_bytes(), set.get("q4_0").unwrap().bytes() as u64);
        let twice = TensorSet::repacked(&repacking, &[tensor("q4_0"), tensor("q4_0")], |_| {}).err().unwrap();
        assert!(twice.contains("named twice"), "{twice}");
        for refused in ["q4_1", "q4_0_rows"] {
            let error = TensorSet::repacked(&repacking, &[tensor(refused)], |_| {}).err().unwrap();
            assert!(error.contains(refused), "{error}");
        }
    }
}
