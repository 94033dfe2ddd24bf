//! How fast this machine's CPU streams quantized weights through a decode step: a matrix-vector product
//! of a 4-bit (Q4_K) matrix too large for the caches, timed with one thread and with every core. A
//! decode step reads each weight once, so this rate, not the memory bandwidth alone, is what bounds a
//! CPU stage's tokens per second (on this 2-core VM one thread turns ~2-3 GB/s of Q4 weights into
//! products while the memory delivers ~8). Placement predicts each stage's step time from it.

use crate::ggml::{Backend, DType, Device, GraphBuilder, SetTensor, TensorSet};
use std::time::Instant;

/// The matrix: 4,096 inputs by 16,384 outputs of Q4_K, 37.7 MB.
const INPUTS: u64 = 4096;
const OUTPUTS: u64 = 16384;

/// Bytes of Q4_K weights one matrix-vector product on the CPU reads per second with `threads` threads
/// (the best of a few runs after a warm-up: about 0.1 s with one thread here). None when ggml cannot
/// set it up (no memory).
pub fn measure_weight_rate(threads: usize) -> Option<u64> {
    let threads = threads.max(1);
    let shape = [INPUTS, OUTPUTS];
    let weights =
        TensorSet::allocate(&[SetTensor { name: "w", dtype: DType::Q4_K, shape: &shape }], Device::cpu()).ok()?;
    let bytes = DType::Q4_K.tensor_bytes(&shape)?;
    let mut backend = Backend::new(Device::cpu(), threads, false).ok()?;
    let g = GraphBuilder::new(8);
    let x = g.input("x", DType::F32, &[INPUTS as i64, 1]);
    let y = g.mul_mat(g.stored(&weights.get("w")?), x);
    let out = g.output(y);
    let graph = g.finish(out);
    backend.allocate(&graph).ok()?;
    backend.set_input(&graph, "x", &vec![0.5f32; INPUTS as usize]);
    let mut best = f64::MAX;
    for run in 0..4 {
        let started = Instant::now();
        backend.compute(&graph, threads).ok()?;
        if run > 0 {
            best = best.min(started.elapsed().as_secs_f64());
        }
    }
    Some((bytes as f64 / best.max(1e-9)) as u64)
}

/// The rate a stage computing with `threads` threads can expect on a machine measured at `one_thread`
/// and `all_cores`: one thread's rate for each thread, up to what every core reached together.
pub fn rate_with_threads(one_thread: u64, all_cores: u64, threads: usize) -> u64 {
    one_thread.saturating_mul(threads.max(1) as u64).min(all_cores.max(one_thread))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_measured_and_more_threads_are_capped_by_all_cores() {
        let one = measure_weight_rate(1).expect("ggml computes on the CPU");
        // A real product of 37.7 MB: far slower than an untouched loop, far faster than a byte a µs.
        assert!((10_000_000..1_000_000_000_000).contains(&one), "{one} B/s");
        assert_eq!(rate_with_threads(2_000, 5_000, 1), 2_000);
        assert_eq!(rate_with_threads(2_000, 5_000, 2), 4_000);
        assert_eq!(rate_with_threads(2_000, 5_000, 8), 5_000);
    }
}
