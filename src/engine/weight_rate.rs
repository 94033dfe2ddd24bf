//! How fast this machine's CPU streams weights through a decode step: a matrix-vector product of a
//! matrix too large for the caches, timed with one thread and with every core, for each type models
//! are commonly quantized in, laid out as the engine lays them out (ggml's repacked layout where it has
//! kernels for the type). A decode step reads each weight once, so this rate, not the memory bandwidth
//! alone, bounds a CPU stage's tokens per second, and it differs by type more than the bytes do (on the
//! 2-core VM one thread multiplied MXFP4 at about half the rate of Q4_K). Placement predicts each
//! stage's step time from the rates of the model's own types, weighted by their bytes.
//!
//! Each row of a product also costs a fixed time (quantizing nothing, but summing and storing its dot
//! product), so short rows are read more slowly per byte: SmolLM2's 576-weight rows of Q4_1 ran at
//! 0.7 to 0.85 of the rate of 4096-weight ones in this VM's runs. Each type is timed with rows of both
//! lengths, and a model's rate is read at its own rows' length (a row's time taken as fixed plus
//! proportional).
use crate::ggml::{Backend, DType, Device, GraphBuilder, Repacking, SetTensor, TensorSet};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// The types measured, by ggml's name: the usual quantizations of the models shoal runs.
const MEASURED: [&str; 8] = ["q4_0", "q4_1", "q4_K", "q5_K", "q6_K", "q8_0", "f16", "mxfp4"];

/// The matrix's inputs (a row's weights), long and short; its outputs make it about 96 MB whatever the
/// type: more than the last-level caches (a 32 MB matrix ran from an EPYC's L3 at five times the rate a
/// model gets).
const LONG_ROW: u64 = 4096;
const SHORT_ROW: u64 = 512;
const MATRIX_BYTES: u64 = 96 << 20;
const TIMED_RUNS: u32 = 3;

/// One type's measured rate: bytes of weights per second with one thread and with every core, with
/// rows of [`LONG_ROW`] weights and of [`SHORT_ROW`] weights.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
pub struct WeightRate {
    /// ggml's name of the type measured (`q4_K`, `q8_0`, `f16`, …).
    pub dtype: String,
    pub one_thread: u64,
    pub all_cores: u64,
    /// With short rows (0: not measured, as by an older member: every row is taken as long).
    #[serde(default)]
    pub short_one_thread: u64,
    #[serde(default)]
    pub short_all_cores: u64,
}

/// Bytes of weights of one type that a decode step reads, in how many rows (0: not known, taken as
/// long rows).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeReads {
    pub dtype: String,
    pub bytes: u64,
    #[serde(default)]
    pub rows: u64,
}

/// The type ggml names `name`.
fn dtype_named(name: &str) -> Option<DType> {
    (0..64u32).filter_map(DType::from_id).find(|t| t.name() == name)
}

/// Bytes of `dtype` weights one matrix-vector product on the CPU reads per second with each of
/// `threads`, in the layout the engine would give them: the mean of three runs after a warm-up, not the
/// best, as a model's decode rate is its mean (on the shared VM one run of the same product read from
/// 9 to 17 GB/s, and the best of a few predicted a rate the model never kept up). None when ggml cannot
/// set it up (no memory).
fn measure(dtype: DType, inputs: u64, threads: &[usize]) -> Option<Vec<u64>> {
    let outputs = (MATRIX_BYTES / dtype.row_bytes(inputs)?).max(1);
    let shape = [inputs, outputs];
    let plain = TensorSet::allocate(&[SetTensor { name: "w", dtype, shape: &shape }], Device::cpu()).ok()?;
    let bytes = dtype.tensor_bytes(&shape)?;
    // As a stage does: into the repacked layout where ggml has a kernel for the type (else it stays).
    let repacked = Repacking::for_device(Device::cpu())
        .and_then(|repacking| TensorSet::repacked(&repacking, &[("w", plain.get("w")?)], |_| {}).ok());
    let weights = repacked.as_ref().unwrap_or(&plain).get("w")?;
    threads
        .iter()
        .map(|&threads| {
            let threads = threads.max(1);
            let mut backend = Backend::new(Device::cpu(), threads, false).ok()?;
            let g = GraphBuilder::new(8);
            let x = g.input("x", DType::F32, &[inputs as i64, 1]);
            let y = g.mul_mat(g.stored(&weights), x);
            let out = g.output(y);
            let graph = g.finish(out);
            backend.allocate(&graph).ok()?;
            backend.set_input(&graph, "x", &vec![0.5f32; inputs as usize]);
            backend.compute(&graph, threads).ok()?;
            let started = Instant::now();
            for _ in 0..TIMED_RUNS {
                backend.compute(&graph, threads).ok()?;
            }
            let seconds = started.elapsed().as_secs_f64();
            Some((bytes as f64 * TIMED_RUNS as f64 / seconds.max(1e-9)) as u64)
        })
        .collect()
}

/// Every measured type's rate with one thread and with `cores` threads, with long and short rows
/// (about 1.8 s on the 2-core VM).
pub fn measure_all(cores: usize) -> Vec<WeightRate> {
    MEASURED
        .iter()
        .filter_map(|&name| {
            let dtype = dtype_named(name)?;
            let long = measure(dtype, LONG_ROW, &[1, cores])?;
            // A row's fixed time is spent by the thread computing it, so every core gains on short rows
            // what it gains on long ones (not timed: it would add half the measurement's time).
            let short_one_thread = measure(dtype, SHORT_ROW, &[1]).map_or(0, |r| r[0]);
            let short_all_cores = (short_one_thread as f64 * long[1] as f64 / long[0].max(1) as f64) as u64;
            Some(WeightRate {
                dtype: name.to_string(),
                one_thread: long[0],
                all_cores: long[1],
                short_one_thread,
                short_all_cores,
            })
        })
        .collect()
}

static MEASURED_RATES: std::sync::OnceLock<Vec<WeightRate>> = std::sync::OnceLock::new();

/// Measures this machine's rates, once per process (about 1.8 s on the 2-core VM, added to a node's start:
/// done when a node starts, so that its first placement already has them).
pub fn measure_once() {
    MEASURED_RATES.get_or_init(|| measure_all(crate::engine::default_threads()));
}

/// The rates [`measure_once`] measured (none before it ran).
pub fn measured() -> Vec<WeightRate> {
    MEASURED_RATES.get().cloned().unwrap_or_default()
}

/// The measured type that stands for `dtype` (by ggml's name) where it was not measured itself (a rarer
/// type, or a member that measured fewer): 16- and 32-bit floats by F16, types of more than 5 to 8 bits
/// a weight by Q8_0, the rest by Q4_K.
pub fn class_of(dtype: &str) -> &'static str {
    let bits = dtype_named(dtype).map_or(4.5, |t| t.block_bytes() as f64 * 8.0 / t.block_elements().max(1) as f64);
    match bits {
        b if b >= 16.0 => "f16",
        b if b > 5.0 => "q8_0",
        _ => "q4_K",
    }
}

/// The rate a stage computing `dtype` weights in rows of `row` weights (None: long rows) with `threads`
/// threads (None: every core) can expect on a machine measured at `rates`: one thread's rate for each
/// thread, up to what every core reached. The type's own rate where measured, else its class's (see
/// [`class_of`]), else the 4-bit one.
pub fn rate_for(rates: &[WeightRate], dtype: &str, row: Option<u64>, threads: Option<usize>) -> Option<u64> {
    let r = measured_as(rates, dtype)?;
    let with_threads = |one_thread: u64, all_cores: u64| match threads {
        Some(t) if t > 0 => rate_with_threads(one_thread, all_cores, t),
        _ => all_cores,
    };
    let long = with_threads(r.one_thread, r.all_cores);
    let (Some(row), true) = (row, r.short_one_thread > 0 && r.short_all_cores > 0) else { return Some(long) };
    let short = with_threads(r.short_one_thread, r.short_all_cores);
    Some(rate_at_row(long, short, row))
}

/// The rate with rows of `row` weights, from the rates with long and short rows: a row takes a fixed
/// time plus a time per byte, the two found from the two measurements (a short row measured faster
/// than a long one, which noise can give, means no fixed time).
fn rate_at_row(long: u64, short: u64, row: u64) -> u64 {
    let (per_byte_long, per_byte_short) = (1.0 / long.max(1) as f64, 1.0 / short.max(1) as f64);
    // Seconds per byte = fixed / row + per_byte, row in weights (bytes are proportional for one type).
    let fixed = ((per_byte_short - per_byte_long) / (1.0 / SHORT_ROW as f64 - 1.0 / LONG_ROW as f64)).max(0.0);
    let per_byte = (per_byte_long - fixed / LONG_ROW as f64).max(per_byte_long * 0.1);
    (1.0 / (fixed / row.max(1) as f64 + per_byte)) as u64
}

/// The rate a decode step reading `mix` is read at with `threads` threads (None: every core): its
/// bytes over the time each type's bytes take at that type's rate for its rows' length. None when no
/// type's rate is known.
pub fn rate_for_mix(rates: &[WeightRate], mix: &[TypeReads], threads: Option<usize>) -> Option<u64> {
    let total: u64 = mix.iter().map(|t| t.bytes).sum();
    if total == 0 {
        return rate_for(rates, "q4_K", None, threads);
    }
    let seconds: f64 = mix
        .iter()
        .filter(|t| t.bytes > 0)
        .map(|t| Some(t.bytes as f64 / rate_for(rates, &t.dtype, row_weights(t), threads)?.max(1) as f64))
        .sum::<Option<f64>>()?;
    Some((total as f64 / seconds.max(1e-12)) as u64)
}

/// The average row of `reads`, in weights (None when its rows or its type are not known).
fn row_weights(reads: &TypeReads) -> Option<u64> {
    let dtype = dtype_named(&reads.dtype)?;
    let weights = reads.bytes as u128 * dtype.block_elements() as u128 / dtype.block_bytes().max(1) as u128;
    (reads.rows > 0).then(|| (weights / reads.rows as u128) as u64)
}

/// The measurement that stands for `dtype`: its own, its class's, or the 4-bit one.
fn measured_as<'r>(rates: &'r [WeightRate], dtype: &str) -> Option<&'r WeightRate> {
    let class = class_of(dtype);
    rates
        .iter()
        .find(|r| r.dtype == dtype)
        .or_else(|| rates.iter().find(|r| r.dtype == class))
        .or_else(|| rates.iter().find(|r| r.dtype == "q4_K"))
}

fn rate_with_threads(one_thread: u64, all_cores: u64, threads: usize) -> u64 {
    one_thread.saturating_mul(threads.max(1) as u64).min(all_cores.max(one_thread))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_is_measured_and_more_threads_are_capped_by_all_cores() {
        let started = std::time::Instant::now();
        let rates = measure_all(2);
        eprintln!("measured {} types in {:?}: {rates:?}", rates.len(), started.elapsed());
        assert_eq!(rates.iter().map(|r| r.dtype.as_str()).collect::<Vec<_>>(), MEASURED);
        for r in &rates {
            // A real product of 96 MB: far slower than an untouched loop, far faster than a byte a µs.
            assert!((10_000_000..1_000_000_000_000).contains(&r.one_thread), "{r:?}");
            assert!((10_000_000..1_000_000_000_000).contains(&r.short_one_thread), "{r:?}");
        }
        assert_eq!(
            (class_of("q4_1"), class_of("q5_K"), class_of("q8_0"), class_of("bf16")),
            ("q4_K", "q8_0", "q8_0", "f16")
        );
        assert_eq!((class_of("mxfp4"), class_of("f32"), class_of("no such type")), ("q4_K", "f16", "q4_K"));
        let table = [WeightRate { dtype: "q4_K".into(), one_thread: 2_000, all_cores: 5_000, ..Default::default() }];
        assert_eq!(rate_for(&table, "q4_0", None, Some(1)), Some(2_000));
        assert_eq!(rate_for(&table, "q4_0", None, Some(2)), Some(4_000));
        assert_eq!(rate_for(&table, "q4_0", None, Some(8)), Some(5_000));
        assert_eq!(rate_for(&table, "q4_0", None, None), Some(5_000));
        // A type whose class was not measured (an older member) falls back to the 4-bit rate.
        assert_eq!(rate_for(&table, "f16", None, Some(1)), Some(2_000));
        assert_eq!(rate_for(&[], "f16", None, Some(1)), None);
        // A type measured itself is read at its own rate; a mix at the rate its bytes take together.
        let rate = |dtype: &str, one_thread, all_cores| WeightRate {
            dtype: dtype.into(),
            one_thread,
            all_cores,
            ..Default::default()
        };
        let table = [rate("q4_K", 2_000, 5_000), rate("q4_1", 1_000, 2_000), rate("q8_0", 4_000, 8_000)];
        assert_eq!(rate_for(&table, "q4_1", None, Some(1)), Some(1_000));
        assert_eq!(rate_for(&table, "q4_0", None, Some(1)), Some(2_000));
        let reads = |dtype: &str, bytes| TypeReads { dtype: dtype.into(), bytes, rows: 0 };
        let mix = [reads("q4_1", 3_000), reads("q8_0", 4_000)];
        // 3 s for the Q4_1 bytes and 1 s for the Q8_0 ones: 7,000 bytes in 4 s; with two threads in 2 s.
        assert_eq!(rate_for_mix(&table, &mix, Some(1)), Some(1_750));
        assert_eq!(rate_for_mix(&table, &mix, Some(2)), Some(3_500));
        assert_eq!(rate_for_mix(&[], &mix, Some(1)), None);
    }

    #[test]
    fn short_rows_are_read_more_slowly_by_a_fixed_time_per_row() {
        // 4096-weight rows at 4,000 B/s and 512-weight ones at 2,000 B/s: a row costs as much as 683
        // weights' bytes on top of its own, so 576-weight rows run at just over 2,000 and 1,536-weight
        // ones at about 3,200. (Rates are rounded down: within one of the exact figure.)
        let near = |got: u64, want: u64| got.abs_diff(want) <= 1;
        let q = WeightRate {
            dtype: "q8_0".into(),
            one_thread: 4_000,
            all_cores: 8_000,
            short_one_thread: 2_000,
            short_all_cores: 3_000,
        };
        let table = [q.clone()];
        let at = |row, threads| rate_for(&table, "q8_0", Some(row), Some(threads)).unwrap();
        assert!(near(at(4096, 1), 4_000) && near(at(512, 1), 2_000));
        assert!((2_000..2_200).contains(&at(576, 1)), "{}", at(576, 1));
        assert!((3_100..3_300).contains(&at(1536, 1)), "{}", at(1536, 1));
        assert!(at(16384, 1) > 4_000 && at(16384, 1) < 5_000, "longer rows approach the rate per byte");
        // Threads scale each up to what every core reached.
        assert!(near(at(4096, 2), 8_000) && near(at(512, 2), 3_000));
        // Without a short measurement (an older member), or where rows are not known, rows are long.
        let old = [WeightRate { short_one_thread: 0, short_all_cores: 0, ..q.clone() }];
        let at_with = |table: &[WeightRate], row| rate_for(table, "q8_0", Some(row), Some(1)).unwrap();
        assert_eq!(at_with(&old, 576), 4_000);
        assert_eq!(rate_for(&table, "q8_0", None, Some(1)), Some(4_000));
        // Short rows measured faster than long ones (noise) mean no fixed time.
        let noisy = [WeightRate { short_one_thread: 5_000, ..q }];
        assert!(near(at_with(&noisy, 576), 4_000));
        // A mix's rows: 1,088 bytes of Q8_0 in 2 rows are rows of 512 weights (34 bytes per 32).
        let mix = [TypeReads { dtype: "q8_0".into(), bytes: 1_088, rows: 2 }];
        assert!(near(rate_for_mix(&table, &mix, Some(1)).unwrap(), 2_000));
    }
}
