//! Prefill and decode throughput, measured the way llama.cpp's `llama-bench` does (pp512 / tg128):
//! random tokens, an empty cache for every repetition, one warm-up run, and medians over repetitions.
//! With several sequences, also the decode rate of that many sequences batched in every step (each
//! from an empty cache), as llama-bench's `-pg`/batched runs compare.

use super::pipeline::LocalPipeline;
use super::stage::{Segment, StageOptions};
use super::{EngineError, WireFormat};
use crate::model::Model;
use crate::os::peak_resident_bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub repetitions: usize,
    /// Sequences decoding at once, batched (1: only the one-sequence tests).
    pub concurrency: usize,
    pub threads: usize,
    /// Split points, to measure a pipeline of in-process stages.
    pub splits: Vec<usize>,
    /// Ranks of a tensor-parallel group on threads of this process (0 or 1: none).
    pub tensor_parallel: usize,
    /// The device and weight placement of the stages (their sizes and threads come from the fields above).
    pub stage: StageOptions,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub model: String,
    pub model_bytes: u64,
    pub threads: usize,
    pub stages: usize,
    /// The device of each stage.
    pub devices: Vec<String>,
    /// Where the first stage's weights are: `mapped` (computed on the mapped file), `copied into huge
    /// pages` (the CPU on Linux) or `copied` (into the device's memory).
    pub weights: &'static str,
    /// Bytes of weights copied into the CPU's repacked layout at load (ggml's interleaved kernels).
    pub repacked_bytes: u64,
    /// The CPU this binary was compiled for (`x86-64-v3` for release builds, `native` for a benchmark
    /// build): ggml's CPU kernels use that CPU's instructions and no newer ones.
    pub built_for_cpu: &'static str,
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub repetitions: usize,
    /// Median prompt-processing rate (tokens/s) over the repetitions.
    pub prefill_tokens_per_second: f64,
    /// Median generation rate (tokens/s) over the repetitions.
    pub decode_tokens_per_second: f64,
    pub prefill_samples: Vec<f64>,
    pub decode_samples: Vec<f64>,
    /// With several sequences: their decode rates, batched.
    pub batched: Option<BatchedDecode>,
    /// Opening the file and setting up the stages (mapped weights load on first use; repacked ones are
    /// read and copied here).
    pub load_seconds: f64,
    pub peak_resident_bytes: Option<u64>,
}

/// Several sequences decoding together, one token each per step.
#[derive(Clone, Debug, Serialize)]
pub struct BatchedDecode {
    pub sequences: usize,
    /// Median over repetitions of all sequences' tokens per second.
    pub aggregate_tokens_per_second: f64,
    /// The same, per sequence.
    pub per_sequence_tokens_per_second: f64,
    pub samples: Vec<f64>,
}

pub fn run(path: &Path, options: &BenchOptions) -> Result<BenchReport, EngineError> {
    let started = Instant::now();
    let model = Model::open(path)?;
    let stage_options = StageOptions {
        context: (options.prompt_tokens + options.gen_tokens).max(1),
        sequences: options.concurrency.max(1),
        threads: options.threads,
        batch: options.prompt_tokens.clamp(1, 512).max(options.concurrency),
        ..options.stage.clone()
    };
    let mut pipeline = if options.tensor_parallel > 1 {
        LocalPipeline::load_group(&model, &vec![1.0; options.tensor_parallel], &stage_options)?
    } else {
        LocalPipeline::load(&model, &options.splits, &stage_options, WireFormat::F32)?
    };
    let load_seconds = started.elapsed().as_secs_f64();
    let vocabulary = model.config().vocabulary as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let prompt: Vec<u32> = (0..options.prompt_tokens).map(|_| rng.random_range(0..vocabulary)).collect();

    let prefill = |pipeline: &mut LocalPipeline| -> Result<f64, EngineError> {
        pipeline.truncate(0, 0);
        let t = Instant::now();
        let mut pos = 0;
        for chunk in prompt.chunks(pipeline.batch()) {
            pipeline.forward(0, pos, chunk)?;
            pos += chunk.len();
        }
        Ok(super::rate(prompt.len(), t.elapsed()))
    };
    let mut decode = |pipeline: &mut LocalPipeline, n: usize| -> Result<f64, EngineError> {
        pipeline.truncate(0, 0);
        let mut token = rng.random_range(0..vocabulary);
        let t = Instant::now();
        for pos in 0..n {
            let logits = pipeline.forward(0, pos, &[token])?;
            token = super::argmax(logits);
        }
        Ok(super::rate(n, t.elapsed()))
    };

    // Warm-up: fault in the weights and size the buffers.
    if options.prompt_tokens > 0 {
        prefill(&mut pipeline)?;
    }
    if options.gen_tokens > 0 {
        decode(&mut pipeline, 1)?;
    }
    let mut prefill_samples = Vec::new();
    let mut decode_samples = Vec::new();
    for _ in 0..options.repetitions.max(1) {
        if options.prompt_tokens > 0 {
            prefill_samples.push(prefill(&mut pipeline)?);
        }
        if options.gen_tokens > 0 {
            decode_samples.push(decode(&mut pipeline, options.gen_tokens)?);
        }
    }
    let sequences = options.concurrency.max(1);
    let mut batched = |pipeline: &mut LocalPipeline, n: usize| -> Result<f64, EngineError> {
        let mut tokens: Vec<u32> = (0..sequences).map(|_| rng.random_range(0..vocabulary)).collect();
        for seq in 0..sequences {
            pipeline.truncate(seq, 0);
        }
        let t = Instant::now();
        for pos in 0..n {
            let segments: Vec<Segment> =
                (0..sequences).map(|seq| Segment { seq, start: pos, tokens: 1, logits: true, drafted: 0 }).collect();
            let logits = pipeline.forward_batch(&segments, &tokens)?;
            for (token, row) in tokens.iter_mut().zip(logits.chunks(logits.len() / sequences)) {
                *token = super::argmax(row);
            }
        }
        Ok(super::rate(n * sequences, t.elapsed()))
    };
    let mut batched_samples = Vec::new();
    if sequences > 1 && options.gen_tokens > 0 {
        batched(&mut pipeline, 1)?;
        for _ in 0..options.repetitions.max(1) {
            batched_samples.push(batched(&mut pipeline, options.gen_tokens)?);
        }
    }

    Ok(BenchReport {
        model: model.name(),
        model_bytes: model.file_bytes(),
        threads: options.threads,
        stages: pipeline.stages().len(),
        devices: pipeline.stages().iter().map(|s| s.device().name()).collect(),
        weights: pipeline.stages().first().map_or("mapped", |s| s.weights_kept()),
        repacked_bytes: pipeline.stages().iter().map(|s| s.repacked_bytes()).sum(),
        built_for_cpu: crate::BUILT_FOR_CPU,
        prompt_tokens: options.prompt_tokens,
        gen_tokens: options.gen_tokens,
        repetitions: options.repetitions.max(1),
        prefill_tokens_per_second: median(&prefill_samples),
        decode_tokens_per_second: median(&decode_samples),
        prefill_samples,
        decode_samples,
        batched: (!batched_samples.is_empty()).then(|| BatchedDecode {
            sequences,
            aggregate_tokens_per_second: median(&batched_samples),
            per_sequence_tokens_per_second: median(&batched_samples) / sequences as f64,
            samples: batched_samples,
        }),
        load_seconds,
        peak_resident_bytes: peak_resident_bytes(),
    })
}

/// The median of `values` (0 for none).
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}
