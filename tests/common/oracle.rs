//! What llama.cpp computed for a model (recorded by scripts/record-oracle with
//! tests/fixtures/oracle/record.cpp), and the checks of shoal's engine against it.

use serde::Deserialize;
use shoal::engine::{self, GenerateRequest, LocalPipeline, SamplingParams, StageOptions, WireFormat};
use shoal::ggml::WeightPlacement;
use shoal::model::Model;
use std::path::Path;

#[derive(Deserialize)]
pub struct Recorded {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    /// For each position: the ten largest logits as (token id, logit).
    pub top: Vec<Vec<(u32, f32)>>,
    /// For each prefix (1 token, 2, … the whole prompt) decoded in one batch from an empty cache: the ten
    /// largest logits at its last position. Empty in recordings made before llama.cpp's prefill was
    /// recorded (the native ones).
    #[serde(default)]
    pub prefill: Vec<Vec<(u32, f32)>>,
    pub greedy: Vec<u32>,
}

/// The recording in `path` (one JSON object per prompt).
pub fn read(path: &Path) -> Vec<Recorded> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

pub fn options() -> StageOptions {
    StageOptions { context: 512, threads: 2, ..StageOptions::default() }
}

/// [`options`] with the weights exactly as the file lays them out: what llama.cpp computes with
/// `SHOAL_ORACLE_NO_REPACK=1` (by default both move Q4_0, Q4_K, MXFP4, … matrices into the CPU's
/// repacked layout, whose kernels round differently).
pub fn options_as_in_file() -> StageOptions {
    StageOptions { weights: WeightPlacement::AsInFile, ..options() }
}

/// Logits after each token of `ids`, fed one at a time (as the recording did).
pub fn teacher_forced(pipeline: &mut LocalPipeline, ids: &[u32]) -> Vec<Vec<f32>> {
    pipeline.truncate(0, 0);
    ids.iter().enumerate().map(|(pos, &id)| pipeline.forward(0, pos, &[id]).unwrap().to_vec()).collect()
}

/// Whether ggml's kernels in this build are those of the machine that recorded the fixtures: compiled for
/// x86_64 with AVX-512 and AVX-512 VNNI (`-C target-cpu=native` on such a CPU). What the CPU could run does
/// not matter: ggml uses the instructions it was compiled for, and release builds target x86-64-v3 (AVX2)
/// wherever they run (.cargo/config.toml). Only with the recording kernels are greedy tokens compared
/// exactly.
pub fn runs_the_recording_kernels() -> bool {
    cfg!(all(target_arch = "x86_64", target_feature = "avx512f", target_feature = "avx512vnni"))
}

/// Whether ggml's kernels in this build are x86-64-v3's (AVX2, FMA, F16C; no AVX-512 or AVX-VNNI): those
/// of every release build on x86_64, whatever the CPU (.cargo/config.toml).
pub fn runs_the_x86_64_v3_kernels() -> bool {
    cfg!(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c",
        not(target_feature = "avx512f"),
        not(target_feature = "avxvnni")
    ))
}

/// The recording llama.cpp made with this build's kernels, as the suffix of its file name
/// (`NAME{suffix}.jsonl`), where there is one: `-x86-64-v3` for release builds on x86_64 (recorded by
/// `scripts/record-oracle --baseline x86-64-v3`), `` for builds with the recording machine's kernels.
pub fn same_kernels_suffix() -> Option<&'static str> {
    if runs_the_x86_64_v3_kernels() {
        Some("-x86-64-v3")
    } else if runs_the_recording_kernels() {
        Some("")
    } else {
        None
    }
}

/// Whether ggml was compiled with AVX512-FP16 (`-C target-cpu=native` on Intel Sapphire Rapids and later):
/// it then computes F16 vector operations in half precision, and Gemma 3 270M's logits move by up to 10%
/// from the recording machine's (llama.cpp built so computes them as shoal does).
pub fn runs_avx512fp16_kernels() -> bool {
    cfg!(all(target_arch = "x86_64", target_feature = "avx512fp16"))
}

/// `file`'s logits at every position of every recorded prompt (fed one token at a time, as recorded)
/// are llama.cpp's within a small tolerance, and its winner is llama.cpp's wherever that one is clear.
pub fn check_logits(file: &Model, name: &str, cases: &[Recorded]) {
    check_logits_recorded_here(file, name, cases, same_kernels_suffix().is_some(), &options());
}

/// [`check_logits`], told whether `cases` were recorded with this CPU's kernels, and run with the
/// `options` (the weights' layout of the recording: see [`options_as_in_file`]).
pub fn check_logits_recorded_here(
    file: &Model,
    name: &str,
    cases: &[Recorded],
    same_kernels: bool,
    options: &StageOptions,
) {
    let tokenizer = file.tokenizer().unwrap();
    let mut pipeline = LocalPipeline::load(file, &[], options, WireFormat::F32).unwrap();
    let relative = tolerance(same_kernels);
    let mut largest_difference = 0f32;
    for case in cases {
        assert_eq!(tokenizer.encode(&case.prompt).unwrap(), case.prompt_ids, "{name} prompt {:?}", case.prompt);
        let ours = teacher_forced(&mut pipeline, &case.prompt_ids);
        for (pos, (logits, top)) in ours.iter().zip(&case.top).enumerate() {
            let at = format!("{name} prompt {:?} position {pos}", case.prompt);
            largest_difference = largest_difference.max(check_position(&at, logits, top, relative));
        }
    }
    println!("{name}: largest difference from llama.cpp's logits {largest_difference}");
}

/// Every prefix of at least `shortest` tokens of every prompt, prefilled in one step from an empty
/// cache, gives llama.cpp's logits at its last position. Several rows take other kernels than one (tiled
/// products, flash attention's tiles, experts' rows gathered), which round differently from a token at a
/// time: by up to 7% on Gemma 3 270M in llama.cpp itself. So the reference is llama.cpp's own prefill
/// where it was recorded (the x86-64-v3 recordings), held as tightly as the token-at-a-time logits
/// where this build has the recording's kernels and `same_form` (shoal computes the step as llama.cpp
/// does: not deepseek2's expanded attention); elsewhere it is the token-at-a-time recording, loosely.
pub fn check_prefill_logits(file: &Model, name: &str, cases: &[Recorded], shortest: usize, same_form: bool) {
    let same_kernels = same_kernels_suffix().is_some();
    check_prefill_logits_with(file, name, cases, shortest, same_kernels && same_form, &options());
}

/// [`check_prefill_logits`], told whether `cases` were recorded with this build's kernels for a step
/// computed alike (`tight`), and run with `options` (the weights' layout of the recording: see
/// [`options_as_in_file`]).
pub fn check_prefill_logits_with(
    file: &Model,
    name: &str,
    cases: &[Recorded],
    shortest: usize,
    tight: bool,
    options: &StageOptions,
) {
    let prefill_recorded = cases.iter().all(|case| case.prefill.len() == case.prompt_ids.len());
    let relative = tolerance(prefill_recorded && tight);
    check_prefill_logits_within(file, name, cases, shortest, relative, options);
}

/// The relative tolerance of DeepSeek's prefill in the expanded first-step form against llama.cpp's in
/// the latent form, on the recording's kernels: the same sums in another order, rounded to F16 at
/// other points. Measured on random `deepseek2` models (two seeds): at most 0.033 and 0.038 against
/// logits near 27 (1.4e-3 of them), where llama.cpp's own one-step prefill and token-at-a-time logits
/// differ by up to 0.017 and 0.012 (6e-4); token-at-a-time logits and latent-form prefills agree
/// exactly (0).
pub const EXPANDED_LATENT_FORM: f32 = 2e-3;

/// [`check_prefill_logits_with`] within `relative` (plus 0.01) of llama.cpp's prefill where it was
/// recorded, else of its token-at-a-time logits.
pub fn check_prefill_logits_within(
    file: &Model,
    name: &str,
    cases: &[Recorded],
    shortest: usize,
    relative: f32,
    options: &StageOptions,
) {
    let mut pipeline = LocalPipeline::load(file, &[], options, WireFormat::F32).unwrap();
    let prefill_recorded = cases.iter().all(|case| case.prefill.len() == case.prompt_ids.len());
    let mut checked = 0;
    let mut largest_difference = 0f32;
    for case in cases {
        let reference = if prefill_recorded { &case.prefill } else { &case.top };
        for end in shortest..=case.prompt_ids.len() {
            pipeline.truncate(0, 0);
            let logits = pipeline.forward(0, 0, &case.prompt_ids[..end]).unwrap();
            let at = format!("{name} prompt {:?} prefilled to {end} tokens", case.prompt);
            largest_difference = largest_difference.max(check_position(&at, logits, &reference[end - 1], relative));
            checked += 1;
        }
    }
    assert!(checked > 0, "{name}: no prompt has {shortest} tokens");
    let against = if prefill_recorded { "prefill" } else { "logits a token at a time" };
    println!("{name}: largest difference from llama.cpp's {against} {largest_difference} (tolerance {relative})");
}

/// The relative tolerance of a logit. Other kernels than the recording machine's (AVX2 without
/// AVX-512) round dot products differently, and the differences add up over the layers: on one such
/// EPYC a random gpt-oss logit of 30.10 came out 30.06 (MXFP4 experts), and a Gemma 3 270M logit of
/// -25.73 came out -26.62 (Q4_K). The tight check runs on the recording kernels only; elsewhere a wrong
/// operation still shows (it moves logits by several units), a rounding difference does not.
pub fn tolerance(same_kernels: bool) -> f32 {
    if same_kernels {
        1e-3
    } else {
        5e-2
    }
}

/// Checks one position's logits against llama.cpp's ten largest (`top`) and, where its first is clearly
/// ahead, its argmax; returns the largest difference.
pub fn check_position(at: &str, logits: &[f32], top: &[(u32, f32)], relative: f32) -> f32 {
    let mut largest = 0f32;
    for &(id, value) in top {
        let got = logits[id as usize];
        largest = largest.max((got - value).abs());
        assert!(
            (got - value).abs() <= 1e-2 + relative * value.abs(),
            "{at}: logit of token {id} is {got}, llama.cpp's {value}"
        );
    }
    if top[0].1 - top[1].1 > 0.05f32.max(2.0 * relative * top[0].1.abs()) {
        assert_eq!(engine::argmax(logits), top[0].0, "{at}");
    }
    largest
}

pub fn greedy(file: &Model, splits: &[usize], prompt: &[u32], n: usize) -> Vec<u32> {
    greedy_with(file, splits, &options(), prompt, n)
}

/// [`greedy`] with these stage options.
pub fn greedy_with(file: &Model, splits: &[usize], options: &StageOptions, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut pipeline = LocalPipeline::load(file, splits, options, WireFormat::F32).unwrap();
    greedy_on(&mut pipeline, file, prompt, n)
}

/// The greedy continuation of `prompt` by `pipeline` (of `file`), from an empty cache.
pub fn greedy_on(pipeline: &mut LocalPipeline, file: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let tokenizer = file.tokenizer().unwrap();
    let request = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: n,
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        stop: vec![],
        ignore_eos: true,
    };
    pipeline.truncate(0, 0);
    engine::generate(pipeline, &tokenizer, &request, |_| true).unwrap().tokens
}

/// Each prompt prefilled in chunks of `chunk` tokens (each continuing the cache, and any recurrent
/// state, the one before left) gives llama.cpp's logits at every chunk's last position, as fed a token
/// at a time (within the loose tolerance).
pub fn check_chunked_prefill(file: &Model, name: &str, cases: &[Recorded], chunk: usize) {
    let mut pipeline = LocalPipeline::load(file, &[], &options(), WireFormat::F32).unwrap();
    let relative = tolerance(false);
    for case in cases {
        pipeline.truncate(0, 0);
        for (i, piece) in case.prompt_ids.chunks(chunk).enumerate() {
            let start = chunk * i;
            let logits = pipeline.forward(0, start, piece).unwrap();
            let last = start + piece.len() - 1;
            let at = format!("{name} prompt {:?} chunk ending at {last}", case.prompt);
            check_position(&at, logits, &case.top[last], relative);
        }
    }
}

/// Each prompt's greedy tokens, whole, are llama.cpp's (where this build has the recording's kernels:
/// `same_kernels`), and equal whole when split at each of `split_sets`.
pub fn check_greedy_split(file: &Model, name: &str, cases: &[Recorded], split_sets: &[Vec<usize>], same_kernels: bool) {
    for case in cases {
        let whole = greedy(file, &[], &case.prompt_ids, case.greedy.len());
        if same_kernels {
            assert_eq!(whole, case.greedy, "{name} greedy tokens of {:?}", case.prompt);
        }
        for splits in split_sets {
            let split = greedy(file, splits, &case.prompt_ids, case.greedy.len());
            assert_eq!(split, whole, "{name} split at {splits:?}");
        }
    }
}
