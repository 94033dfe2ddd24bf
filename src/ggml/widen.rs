//! Widening 5-bit weights to 8 bits for products over many rows. A Q5_0 block holds 32 integers in
//! [-16, 15] and one scale; a Q8_0 block holds 32 integers in [-128, 127] and one scale, so a Q5_0 block
//! is exactly a Q8_0 block with the same scale and integers. ggml's CPU multiplies both kinds of weights
//! against rows quantized to Q8_0 with the same kernel (llamafile's tinyBLAS on x86), which unpacks each
//! Q5_0 block again for every few rows it multiplies; a prompt's hundreds of rows unpack each block
//! many times over. Widening the weights once per graph compute, into the compute buffer, and then
//! multiplying Q8_0 by Q8_0 gives the same integers, scales and sums in the same order (the same bits
//! on x86) for less work: Gemma 3 270M, whose 640-wide matrices cannot be K-quants and are Q5_0,
//! prefills about a quarter faster (`benches/compare-llama-bench`). One row (a single sequence's
//! decoding) reads each weight once, where a wider copy would only add reads: it keeps the 5-bit
//! product; a step of 8 or more rows (a prompt, or a batch of 8 sequences decoding) widens.
//!
//! Q4_0 and IQ4_NL widen exactly too, but ggml's CPU repacks those into its interleaved layout, whose
//! kernels are faster still ([`super::Repacking`]); Q4_1 and Q5_1 have an offset Q8_0 cannot hold.

use super::graph::{GraphBuilder, Tensor};
use super::{sys, DType};
use std::ffi::c_void;
use std::os::raw::c_int;

/// Rows (tokens) a product must have before its Q5_0 weights are widened. Measured with Gemma 3 270M
/// (`shoal bench`, 2 threads, pairs with and without): even at 2 and 4 rows, ahead from 8 (7% and 24%),
/// about 1.6x at 16 and 1.2x at 32–64 rows.
pub const WIDEN_FROM_ROWS: i64 = 8;

const BLOCK: usize = 32;
const Q5_0_BYTES: usize = 22;
const Q8_0_BYTES: usize = 34;

/// The bytes of a widened copy of a Q5_0 matrix of `elements` weights.
pub fn widened_bytes(elements: u64) -> u64 {
    elements / BLOCK as u64 * Q8_0_BYTES as u64
}

impl GraphBuilder {
    /// Whether `a` times `b` would be faster with `a` widened: contiguous Q5_0 weights by many rows.
    pub(super) fn worth_widening(&self, a: Tensor<'_>, b: Tensor<'_>) -> bool {
        a.dtype() == DType::Q5_0 && b.shape()[1] >= WIDEN_FROM_ROWS && self.is_contiguous(a)
    }

    /// `a` (contiguous Q5_0) as Q8_0 of the same values, computed by the CPU's threads.
    pub fn widened_to_q8_0<'g>(&'g self, a: Tensor<'g>) -> Tensor<'g> {
        assert!(a.dtype() == DType::Q5_0 && self.is_contiguous(a), "only contiguous Q5_0 widens to Q8_0 exactly");
        let [n0, n1, n2, n3] = a.shape();
        let mut args = [a.raw.as_ptr()];
        self.reserve(1);
        // SAFETY: `a` belongs to this graph; the hook reads it as contiguous Q5_0 rows (checked again by
        // the hook) and writes its own output, Q8_0 of the same shape, each thread its own rows.
        self.adopt(unsafe {
            sys::ggml_custom_4d(
                self.ctx(),
                DType::Q8_0.raw(),
                n0,
                n1,
                n2,
                n3,
                args.as_mut_ptr(),
                1,
                Some(widen_hook),
                -1, // GGML_N_TASKS_MAX: every thread of the compute
                std::ptr::null_mut(),
            )
        })
    }
}

/// Converts one Q5_0 block (scale, 32 high bits, 16 bytes of low nibbles: element j in the low nibble
/// of byte j, element j + 16 in its high nibble) to a Q8_0 block (the scale, 32 signed bytes).
fn widen_block(q5: &[u8], q8: &mut [u8]) {
    q8[..2].copy_from_slice(&q5[..2]);
    let high = u32::from_le_bytes([q5[2], q5[3], q5[4], q5[5]]);
    let (low, out) = (&q5[6..22], &mut q8[2..34]);
    let bit = |k: usize| (((high >> k) & 1) << 4) as u8;
    for j in 0..16 {
        out[j] = ((low[j] & 0x0f) | bit(j)).wrapping_sub(16);
        out[j + 16] = ((low[j] >> 4) | bit(j + 16)).wrapping_sub(16);
    }
}

unsafe extern "C" fn widen_hook(dst: *mut sys::ggml_tensor, ith: c_int, nth: c_int, _userdata: *mut c_void) {
    // SAFETY: `dst` is this op's output (Q8_0, contiguous, allocated by the scheduler) and its one
    // source the Q5_0 tensor it was built from (checked); each thread writes only its share of the rows.
    let src = (*dst).src[0];
    if src.is_null() || !sys::ggml_is_contiguous(src) || (*src).type_ != DType::Q5_0.raw() {
        return;
    }
    let rows = sys::ggml_nrows(src) as usize;
    let blocks_per_row = (*src).ne[0] as usize / BLOCK;
    let (ith, nth) = (ith.max(0) as usize, nth.max(1) as usize);
    let per_thread = rows.div_ceil(nth);
    let (first, last) = ((ith * per_thread).min(rows), ((ith + 1) * per_thread).min(rows));
    let (start, blocks) = (first * blocks_per_row, (last - first) * blocks_per_row);
    let from = std::slice::from_raw_parts(((*src).data as *const u8).add(start * Q5_0_BYTES), blocks * Q5_0_BYTES);
    let to = std::slice::from_raw_parts_mut(((*dst).data as *mut u8).add(start * Q8_0_BYTES), blocks * Q8_0_BYTES);
    for (q5, q8) in from.chunks_exact(Q5_0_BYTES).zip(to.chunks_exact_mut(Q8_0_BYTES)) {
        widen_block(q5, q8);
    }
}

#[cfg(test)]
mod tests {
    use crate::ggml::backend::run_on_cpu;
    use crate::ggml::{DType, GraphBuilder};

    const WIDTH: i64 = 256;
    const OUT: i64 = 37;

    fn value(i: usize, salt: usize) -> f32 {
        (((i * 7919 + salt * 104_729) % 2003) as f32 - 1001.0) / 997.0
    }

    /// `weights` ([WIDTH, OUT]) quantized to Q5_0 times `rows` rows of inputs, on `threads` threads,
    /// with the builder widening or not; and the weights as the product saw them, back in F32.
    fn product(rows: i64, widen: bool, threads: usize) -> Vec<f32> {
        let weights: Vec<f32> = (0..(WIDTH * OUT) as usize).map(|i| value(i, 1)).collect();
        let inputs: Vec<f32> = (0..(WIDTH * rows) as usize).map(|i| value(i, 2)).collect();
        let g = GraphBuilder::new(16);
        if widen {
            g.widen_many_row_products();
        }
        let w = g.cast(g.input("w", DType::F32, &[WIDTH, OUT]), DType::Q5_0);
        let x = g.input("x", DType::F32, &[WIDTH, rows]);
        let out = g.output(g.mul_mat(w, x));
        let graph = g.finish(out);
        run_on_cpu(&graph, threads, |backend| {
            backend.set_input(&graph, "w", &weights);
            backend.set_input(&graph, "x", &inputs);
        })
    }

    /// The widened blocks hold exactly the values of the 5-bit ones: both read back as F32 agree.
    #[test]
    fn widened_weights_are_the_same_values() {
        let weights: Vec<f32> = (0..(WIDTH * OUT) as usize).map(|i| value(i, 3) * 4.0).collect();
        let read_back = |widen: bool| {
            let g = GraphBuilder::new(16);
            let w = g.cast(g.input("w", DType::F32, &[WIDTH, OUT]), DType::Q5_0);
            let w = if widen { g.widened_to_q8_0(w) } else { w };
            let out = g.output(g.cast(w, DType::F32));
            let graph = g.finish(out);
            run_on_cpu(&graph, 3, |backend| backend.set_input(&graph, "w", &weights))
        };
        let (five_bit, widened) = (read_back(false), read_back(true));
        assert_eq!(five_bit.len(), weights.len());
        assert!(five_bit.iter().any(|v| *v != 0.0));
        assert_eq!(widened, five_bit);
    }

    /// A product over many rows with the weights widened is the 5-bit product: bit for bit on x86 (the
    /// same kernel), within rounding elsewhere; below the row threshold nothing is widened.
    #[test]
    fn products_with_widened_weights_equal_the_five_bit_products() {
        for (rows, threads) in [(super::WIDEN_FROM_ROWS, 1), (64, 3), (100, 2), (4, 2)] {
            let (five_bit, widened) = (product(rows, false, threads), product(rows, true, threads));
            assert_eq!(widened.len(), (OUT * rows) as usize);
            if cfg!(target_arch = "x86_64") || rows < super::WIDEN_FROM_ROWS {
                assert_eq!(widened, five_bit, "{rows} rows on {threads} threads");
            } else {
                let spread = five_bit.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (a, b) in widened.iter().zip(&five_bit) {
                    assert!((a - b).abs() <= 1e-5 * spread, "{rows} rows on {threads} threads: {a} against {b}");
                }
            }
        }
    }
}
