//! How fast this machine's CPU streams weights through a decode step: a matrix-vector product of a
//! matrix too large for the caches, timed with one thread and with every core, for a 4-bit (Q4_K), an
//! 8-bit (Q8_0) and a 16-bit (F16) type. A decode step reads each weight once, so this rate, not the
//! memory bandwidth alone, bounds a CPU stage's tokens per second (on the 2-core VM one thread turns
//! ~2.5 GB/s of Q4 weights into products while the memory delivers ~8), and it differs by type (F16
//! needs no unpacking). Placement predicts each stage's step time from the rate of the model's type.

use crate::ggml::{Backend, DType, Device, GraphBuilder, SetTensor, TensorSet};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// The types measured, one per class of weights (see [`class_of`]).
const MEASURED: [DType; 3] = [DType::Q4_K, DType::Q8_0, DType::F16];

/// The matrix's inputs; its outputs make it about 96 MB whatever the type: more than the last-level
/// caches (a 32 MB matrix ran from an EPYC's L3 at five times the rate a model gets).
const INPUTS: u64 = 4096;
const MATRIX_BYTES: u64 = 96 << 20;

/// One type's measured rate: bytes of weights per second with one thread and with every core.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
pub struct WeightRate {
    /// ggml's name of the type measured (`q4_K`, `q8_0`, `f16`).
    pub dtype: String,
    pub one_thread: u64,
    pub all_cores: u64,
}

/// Bytes of `dtype` weights one matrix-vector product on the CPU reads per second with `threads`
/// threads (the better of two runs after a warm-up). None when ggml cannot set it up (no memory).
pub fn measure_weight_rate(dtype: DType, threads: usize) -> Option<u64> {
    let threads = threads.max(1);
    let outputs = (MATRIX_BYTES / dtype.row_bytes(INPUTS)?).max(1);
    let shape = [INPUTS, outputs];
    let weights = TensorSet::allocate(&[SetTensor { name: "w", dtype, shape: &shape }], Device::cpu()).ok()?;
    let bytes = dtype.tensor_bytes(&shape)?;
    let mut backend = Backend::new(Device::cpu(), threads, false).ok()?;
    let g = GraphBuilder::new(8);
    let x = g.input("x", DType::F32, &[INPUTS as i64, 1]);
    let y = g.mul_mat(g.stored(&weights.get("w")?), x);
    let out = g.output(y);
    let graph = g.finish(out);
    backend.allocate(&graph).ok()?;
    backend.set_input(&graph, "x", &vec![0.5f32; INPUTS as usize]);
    let mut best = f64::MAX;
    for run in 0..3 {
        let started = Instant::now();
        backend.compute(&graph, threads).ok()?;
        if run > 0 {
            best = best.min(started.elapsed().as_secs_f64());
        }
    }
    Some((bytes as f64 / best.max(1e-9)) as u64)
}

/// Every measured type's rate with one thread and with `cores` threads (0.6-0.7 s on the
/// 2-core VM).
pub fn measure_all(cores: usize) -> Vec<WeightRate> {
    MEASURED
        .iter()
        .filter_map(|&dtype| {
            Some(WeightRate {
                dtype: dtype.name().to_string(),
                one_thread: measure_weight_rate(dtype, 1)?,
                all_cores: measure_weight_rate(dtype, cores)?,
            })
        })
        .collect()
}

static MEASURED_RATES: std::sync::OnceLock<Vec<WeightRate>> = std::sync::OnceLock::new();

/// Measures this machine's rates, once per process (0.6-0.7 s on the 2-core VM, added to a node's start:
/// done when a node starts, so that its first placement already has them).
pub fn measure_once() {
    MEASURED_RATES.get_or_init(|| measure_all(crate::engine::default_threads()));
}

/// The rates [`measure_once`] measured (none before it ran).
pub fn measured() -> Vec<WeightRate> {
    MEASURED_RATES.get().cloned().unwrap_or_default()
}

/// The measured type that stands for `dtype` (by ggml's name): 16- and 32-bit floats by F16, types of
/// more than 5 to 8 bits a weight by Q8_0, the rest (Q4_1 and below) by Q4_K.
pub fn class_of(dtype: &str) -> &'static str {
    let bits = (0..40u32)
        .filter_map(DType::from_id)
        .find(|t| t.name() == dtype)
        .map_or(4.5, |t| t.block_bytes() as f64 * 8.0 / t.block_elements().max(1) as f64);
    match bits {
        b if b >= 16.0 => "f16",
        b if b > 5.0 => "q8_0",
        _ => "q4_K",
    }
}

/// The rate a stage computing `dtype` weights with `threads` threads (None: every core) can expect on a
/// machine measured at `rates`: one thread's rate for each thread, up to what every core reached.
pub fn rate_for(rates: &[WeightRate], dtype: &str, threads: Option<usize>) -> Option<u64> {
    let class = class_of(dtype);
    let r = rates.iter().find(|r| r.dtype == class).or_else(|| rates.iter().find(|r| r.dtype == "q4_K"))?;
    Some(match threads {
        Some(t) if t > 0 => rate_with_threads(r.one_thread, r.all_cores, t),
        _ => r.all_cores,
    })
}

fn rate_with_threads(one_thread: u64, all_cores: u64, threads: usize) -> u64 {
    one_thread.saturating_mul(threads.max(1) as u64).min(all_cores.max(one_thread))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_is_measured_and_more_threads_are_capped_by_all_cores() {
        let rates = measure_all(2);
        assert_eq!(rates.iter().map(|r| r.dtype.as_str()).collect::<Vec<_>>(), ["q4_K", "q8_0", "f16"]);
        for r in &rates {
            // A real product of 96 MB: far slower than an untouched loop, far faster than a byte a µs.
            assert!((10_000_000..1_000_000_000_000).contains(&r.one_thread), "{r:?}");
        }
        assert_eq!(
            (class_of("q4_1"), class_of("q5_K"), class_of("q8_0"), class_of("bf16")),
            ("q4_K", "q8_0", "q8_0", "f16")
        );
        assert_eq!((class_of("mxfp4"), class_of("f32"), class_of("no such type")), ("q4_K", "f16", "q4_K"));
        let table = [WeightRate { dtype: "q4_K".into(), one_thread: 2_000, all_cores: 5_000 }];
        assert_eq!(rate_for(&table, "q4_0", Some(1)), Some(2_000));
        assert_eq!(rate_for(&table, "q4_0", Some(2)), Some(4_000));
        assert_eq!(rate_for(&table, "q4_0", Some(8)), Some(5_000));
        assert_eq!(rate_for(&table, "q4_0", None), Some(5_000));
        // A type whose class was not measured (an older member) falls back to the 4-bit rate.
        assert_eq!(rate_for(&table, "f16", Some(1)), Some(2_000));
        assert_eq!(rate_for(&[], "f16", Some(1)), None);
    }
}
