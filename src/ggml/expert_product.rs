//! The product of the chosen experts a tensor-parallel rank holds, computed on the CPU by custom ops:
//! what `mul_mat_id` computes, but a slot whose expert is held elsewhere costs nothing (its output is
//! zeros). ggml's `mul_mat_id` needs every id to name one of the rank's experts, so under expert
//! parallelism each slot held elsewhere became a second product with an expert the token already uses:
//! every rank then computed all `used` slots of every token, as one node does, and only the weights it
//! read halved. Here a rank computes only its own slots.
//!
//! Two ops: the activations converted once to the type the weights' dot product takes (ggml's CPU type
//! traits: F16 for F16 weights, Q8_K for K-quants, ...), then each held slot's rows by ggml's own dot
//! product over the weights as the file lays them out, experts' rows in blocks so that a block of an
//! expert's weights stays in cache across the tokens that chose it. Both ops split their rows over
//! the graph's threads.

use super::graph::{GraphBuilder, Tensor};
use super::{sys, DType};
use std::ffi::c_void;
use std::ops::Range;
use std::os::raw::c_int;

/// Rows of an expert's matrix computed together for every token that chose the expert.
const ROW_BLOCK: usize = 16;

/// Whether the CPU has a dot product for weights of `dtype` (and converts activations to the type it
/// takes): what [`GraphBuilder::held_experts_product`] needs. Every quantization a model uses has one;
/// a file with experts of another type (an integer type, say) does not.
pub fn has_cpu_dot_product(dtype: DType) -> bool {
    // SAFETY: the type is one of ggml's (a DType is checked at construction); the traits are a static
    // table, and the dot product's type is one of ggml's too.
    unsafe {
        let traits = &*sys::ggml_get_type_traits_cpu(dtype.raw());
        traits.vec_dot.is_some() && (*sys::ggml_get_type_traits_cpu(traits.vec_dot_type)).from_float.is_some()
    }
}

impl GraphBuilder {
    /// For expert parallelism on the CPU: `experts` ([k, n, held.len()], the rank's experts) times `b`
    /// (F32 [k, 1 or used, tokens]) for each slot of `ids` (I32 [used, tokens], global expert ids)
    /// whose expert is in `held`; zeros for the others. Result: F32 [n, used, tokens], as
    /// [`GraphBuilder::mul_mat_id`] gives. The experts' type must have [`has_cpu_dot_product`].
    pub fn held_experts_product<'g>(
        &'g self,
        experts: Tensor<'g>,
        b: Tensor<'g>,
        ids: Tensor<'g>,
        held: Range<usize>,
    ) -> Tensor<'g> {
        let [k, n, count, _] = experts.shape();
        let [bk, b_slots, tokens, _] = b.shape();
        let [used, id_tokens, _, _] = ids.shape();
        assert_eq!(held.len() as i64, count, "the rank holds {} experts, the matrix has {count}", held.len());
        assert!(bk == k && id_tokens == tokens && (b_slots == 1 || b_slots == used), "expert product shapes");
        assert_eq!((b.dtype(), ids.dtype()), (DType::F32, DType::I32), "expert product types");
        assert!(has_cpu_dot_product(experts.dtype()), "no CPU dot product for {:?} experts", experts.dtype());
        // SAFETY: the weights' type is one of ggml's; the traits are a static table.
        let traits = unsafe { &*sys::ggml_get_type_traits_cpu(experts.dtype().raw()) };
        let b = if self.is_contiguous(b) { b } else { self.cont(b) };
        let converted = if traits.vec_dot_type == sys::GGML_TYPE_F32 {
            b
        } else {
            self.reserve(1);
            let mut args = [b.raw.as_ptr()];
            // SAFETY: a new tensor of the dot product's type and `b`'s shape, whose rows `convert_hook`
            // writes; `k` is a whole number of that type's blocks, as the weights' rows are.
            self.adopt(unsafe {
                sys::ggml_custom_4d(
                    self.ctx(),
                    traits.vec_dot_type,
                    k,
                    b_slots,
                    tokens,
                    1,
                    args.as_mut_ptr(),
                    1,
                    Some(convert_hook),
                    -1,
                    std::ptr::null_mut(),
                )
            })
        };
        let userdata = self.keep_experts(held);
        self.reserve(1);
        let mut args = [experts.raw.as_ptr(), converted.raw.as_ptr(), ids.raw.as_ptr()];
        // SAFETY: the output is a new F32 [n, used, tokens]; `product_hook` reads its three sources with
        // their strides and the held range the graph keeps alive.
        self.adopt(unsafe {
            sys::ggml_custom_4d(
                self.ctx(),
                sys::GGML_TYPE_F32,
                n,
                used,
                tokens,
                1,
                args.as_mut_ptr(),
                3,
                Some(product_hook),
                -1,
                userdata,
            )
        })
    }
}

/// Writes `dst` (the dot product's type) from its source's F32 rows, rows split over the threads.
unsafe extern "C" fn convert_hook(dst: *mut sys::ggml_tensor, ith: c_int, nth: c_int, _userdata: *mut c_void) {
    // SAFETY: `dst` and its contiguous F32 source are live, allocated tensors of the shape
    // `held_experts_product` made, which checked that the type converts from F32.
    let src = (*dst).src[0];
    let Some(from_float) = (*sys::ggml_get_type_traits_cpu((*dst).type_)).from_float else { return };
    let (k, slots, tokens) = ((*dst).ne[0], (*dst).ne[1] as usize, (*dst).ne[2] as usize);
    for row in share(slots * tokens, ith, nth) {
        let (slot, token) = (row % slots, row / slots);
        let from = ((*src).data as *const u8).add(slot * (*src).nb[1] + token * (*src).nb[2]) as *const f32;
        let to = ((*dst).data as *mut u8).add(slot * (*dst).nb[1] + token * (*dst).nb[2]);
        from_float(from, to as *mut c_void, k);
    }
}

/// Each held slot's rows of the product, each thread its share of every expert's rows.
unsafe extern "C" fn product_hook(dst: *mut sys::ggml_tensor, ith: c_int, nth: c_int, userdata: *mut c_void) {
    // SAFETY: as `convert_hook`; `userdata` is the held range the graph keeps (see `keep_experts`).
    let held = &*(userdata as *const Range<i32>);
    let (w, b, ids) = ((*dst).src[0], (*dst).src[1], (*dst).src[2]);
    let Some(vec_dot) = (*sys::ggml_get_type_traits_cpu((*w).type_)).vec_dot else { return };
    let k = (*w).ne[0] as c_int;
    let (used, tokens, b_slots) = ((*ids).ne[0] as usize, (*ids).ne[1] as usize, (*b).ne[1] as usize);
    let rows = share((*dst).ne[0] as usize, ith, nth);
    let out_row = |slot: usize, token: usize| {
        ((*dst).data as *mut u8).add(slot * (*dst).nb[1] + token * (*dst).nb[2]) as *mut f32
    };

    // The slots each held expert computes; the others' rows become zeros.
    let mut chosen: Vec<Vec<(usize, usize)>> = vec![Vec::new(); held.len()];
    for token in 0..tokens {
        for slot in 0..used {
            let id = *(((*ids).data as *const u8).add(slot * (*ids).nb[0] + token * (*ids).nb[1]) as *const i32);
            if held.contains(&id) {
                chosen[(id - held.start) as usize].push((slot, token));
            } else {
                let out = out_row(slot, token);
                for r in rows.clone() {
                    *out.add(r) = 0.0;
                }
            }
        }
    }
    for (expert, slots) in chosen.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
        let matrix = ((*w).data as *const u8).add(expert * (*w).nb[2]);
        for block in rows.clone().step_by(ROW_BLOCK) {
            let block = block..(block + ROW_BLOCK).min(rows.end);
            for &(slot, token) in slots {
                let input = ((*b).data as *const u8).add(slot % b_slots * (*b).nb[1] + token * (*b).nb[2]);
                let out = out_row(slot, token);
                for r in block.clone() {
                    let row = matrix.add(r * (*w).nb[1]);
                    vec_dot(k, out.add(r), 0, row as *const c_void, 0, input as *const c_void, 0, 1);
                }
            }
        }
    }
}

/// Thread `ith` of `nth`'s share of `n` rows.
fn share(n: usize, ith: c_int, nth: c_int) -> Range<usize> {
    let (ith, nth) = (ith.max(0) as usize, nth.max(1) as usize);
    n * ith / nth..n * (ith + 1) / nth
}

#[cfg(test)]
mod tests {
    use crate::ggml::backend::run_on_cpu;
    use crate::ggml::{DType, GraphBuilder};

    const WIDTH: usize = 256;
    const ROWS: usize = 40;
    const EXPERTS: usize = 6;
    const USED: usize = 3;
    const TOKENS: usize = 5;
    const HELD: std::ops::Range<usize> = 2..5;

    /// The product of `weights` (as `dtype`) and `inputs` (one row per token, or one per slot) for
    /// `ids`: ggml's `mul_mat_id` over every expert, or the held experts' product over experts 2..5.
    fn product(
        dtype: DType,
        weights: &[f32],
        inputs: &[f32],
        ids: &[i32],
        held_only: bool,
        threads: usize,
    ) -> Vec<f32> {
        let slots = (inputs.len() / WIDTH / TOKENS) as i64;
        let g = GraphBuilder::new(16);
        let w = g.input("w", DType::F32, &[WIDTH as i64, ROWS as i64, EXPERTS as i64]);
        let w = if dtype == DType::F32 { w } else { g.cast(w, dtype) };
        let b = g.input("b", DType::F32, &[WIDTH as i64, slots, TOKENS as i64]);
        let chosen = g.input("ids", DType::I32, &[USED as i64, TOKENS as i64]);
        let out = if held_only {
            let s = w.strides();
            let held = g.view(w, &[WIDTH as i64, ROWS as i64, HELD.len() as i64], &s[1..3], HELD.start * s[2]);
            g.held_experts_product(held, b, chosen, HELD)
        } else {
            g.mul_mat_id(w, b, chosen)
        };
        let out = g.output(out);
        let graph = g.finish(out);
        run_on_cpu(&graph, threads, |backend| {
            backend.set_input(&graph, "w", weights);
            backend.set_input(&graph, "b", inputs);
            backend.set_input(&graph, "ids", ids);
        })
    }

    /// The types models quantize experts to have a dot product; integer types do not (a file with such
    /// experts is computed by `mul_mat_id`, whose refusal the stage reports).
    #[test]
    fn only_types_with_a_cpu_dot_product_take_the_held_product() {
        for dtype in [DType::F32, DType::F16, DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K] {
            assert!(super::has_cpu_dot_product(dtype), "{dtype:?}");
        }
        for dtype in [DType::I32, DType::I64] {
            assert!(!super::has_cpu_dot_product(dtype), "{dtype:?}");
        }
    }

    /// Every slot whose expert the rank holds gets exactly what `mul_mat_id` computes for it (the same
    /// conversion of the activations and the same dot product), every other slot zeros: for weights
    /// whose products take F32, F16, Q8_0 and Q8_K activations, one input row per token (gate, up) or
    /// one per slot (down), on one thread and on three (rows not a multiple of the block or the threads).
    #[test]
    fn held_slots_equal_mul_mat_id_and_the_others_are_zero() {
        let value = |i: usize, salt: usize| (((i * 7919 + salt * 104_729) % 2003) as f32 - 1001.0) / 997.0;
        let weights: Vec<f32> = (0..WIDTH * ROWS * EXPERTS).map(|i| value(i, 1)).collect();
        // Each token's experts are distinct: some tokens hold none of 2..5, some all their slots there.
        let ids: Vec<i32> = [[0, 1, 5], [2, 3, 4], [4, 0, 2], [1, 3, 5], [5, 2, 0]].concat();
        for dtype in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_K] {
            for slots in [1, USED] {
                let inputs: Vec<f32> = (0..WIDTH * slots * TOKENS).map(|i| value(i, 2 + slots)).collect();
                let all = product(dtype, &weights, &inputs, &ids, false, 1);
                for threads in [1, 3] {
                    let held = product(dtype, &weights, &inputs, &ids, true, threads);
                    assert_eq!(held.len(), all.len());
                    for (slot, (got, want)) in held.chunks(ROWS).zip(all.chunks(ROWS)).enumerate() {
                        let label = format!("{dtype:?}, {slots} input rows, {threads} threads, slot {slot}");
                        if HELD.contains(&(ids[slot] as usize)) {
                            assert_eq!(got, want, "{label}: expert {}", ids[slot]);
                            assert!(got.iter().any(|v| *v != 0.0), "{label}: a product of nonzero rows");
                        } else {
                            assert!(got.iter().all(|v| *v == 0.0), "{label}: expert {} is held elsewhere", ids[slot]);
                        }
                    }
                }
            }
        }
    }
}
