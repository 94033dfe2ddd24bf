//! Weights in the CPU's repacked layout (src/ggml/repack.rs): a stage copies exactly the matrices of the
//! types this CPU has interleaved kernels for, counts every weight byte once, lets the copied tensors'
//! pages of the file go, and computes what it computes on the file's layout, within rounding.
//! llama.cpp's own numbers for both layouts are checked in engine_gemma3.rs (Q4_K) and
//! engine_architectures.rs (gpt-oss's MXFP4 experts); stage_memory.rs checks the pages left.

mod common;

use common::random_model;
use shoal::engine::{LocalPipeline, Stage, StageOptions, WireFormat};
use shoal::ggml::WeightPlacement;
use shoal::model::Model;
use std::ops::Range;

/// The types ggml repacks on x86_64 with AVX2 (every release build there: x86-64-v3).
const REPACKED_ON_AVX2: [&str; 4] = ["q4_0", "q4_K", "iq4_nl", "mxfp4"];

fn runs_avx2_kernels() -> bool {
    if cfg!(all(target_arch = "x86_64", target_feature = "avx2")) {
        return true;
    }
    common::cannot_run("the repacked types are listed here for x86_64 with AVX2 only");
    false
}

fn options(weights: WeightPlacement) -> StageOptions {
    StageOptions { context: 256, threads: 2, weights, ..StageOptions::default() }
}

/// Bytes of the matrices of `layers` in a type AVX2 repacks: what a stage of them should copy. Every
/// such matrix here has a multiple of 8 rows, which the interleaved kernels need.
fn repackable_bytes(file: &Model, layers: Range<usize>) -> u64 {
    let layer_of = |name: &str| name.strip_prefix("blk.")?.split('.').next()?.parse::<usize>().ok();
    let matrices = file.file().tensors().iter().filter(|t| {
        layer_of(&t.name).is_some_and(|l| layers.contains(&l)) && REPACKED_ON_AVX2.contains(&t.dtype.name())
    });
    matrices
        .map(|t| {
            assert!(t.shape.len() >= 2 && t.shape[1] % 8 == 0, "{} has {:?}", t.name, t.shape);
            t.bytes
        })
        .sum()
}

/// Stages of `file` at `ranges` repack exactly its AVX2-repackable matrices (more than nothing), and
/// count the same weight bytes as stages on the file's layout, which repack nothing; so does a stage
/// whose weights are copied.
fn check_repacked_bytes(file: &Model, ranges: &[Range<usize>]) {
    for range in ranges {
        let repacked = Stage::load(file, range.clone(), options(WeightPlacement::Automatic)).unwrap();
        let as_in_file = Stage::load(file, range.clone(), options(WeightPlacement::AsInFile)).unwrap();
        let copied = Stage::load(file, range.clone(), options(WeightPlacement::Copied)).unwrap();
        let expected = repackable_bytes(file, range.clone());
        assert!(expected > 0, "layers {range:?} have no repackable matrix");
        assert_eq!(repacked.repacked_bytes(), expected, "layers {range:?}");
        assert_eq!((as_in_file.repacked_bytes(), copied.repacked_bytes()), (0, 0), "layers {range:?}");
        assert_eq!(repacked.weights().mapped_bytes(), as_in_file.weights().mapped_bytes(), "layers {range:?}");
        assert_eq!(repacked.memory(), as_in_file.memory(), "layers {range:?}");
    }
}

/// Gemma 3 270M Q4_K_M: its Q4_K matrices (the attention outputs and half the down projections) move;
/// its Q5_0, Q6_K and Q8_0 ones, and the Q8_0 token embeddings it looks rows up in, stay.
#[test]
fn gemma3_repacks_its_q4_k_matrices_and_nothing_else() {
    if !runs_avx2_kernels() {
        return;
    }
    let file = Model::open(&common::gemma3_path()).unwrap();
    check_repacked_bytes(&file, &[0..18, 0..6, 6..18]);
}

#[test]
fn gpt_oss_repacks_its_mxfp4_experts_and_computes_as_on_the_files_layout() {
    if !runs_avx2_kernels() {
        return;
    }
    let model = random_model::gpt_oss();
    let file = Model::open(&model.write()).unwrap();
    check_repacked_bytes(&file, &[0..model.layers, 1..3]);
    // Teacher-forced logits of both layouts, split and whole: the interleaved kernels add up the
    // same products in another order, so they differ by rounding only.
    let prompt: Vec<u32> = (0..12).map(|i| 100 + 37 * i).collect();
    for splits in [&[][..], &[2]] {
        let mut logits = [WeightPlacement::Automatic, WeightPlacement::AsInFile].map(|weights| {
            let mut pipeline = LocalPipeline::load(&file, splits, &options(weights), WireFormat::F32).unwrap();
            common::oracle::teacher_forced(&mut pipeline, &prompt)
        });
        let as_in_file = logits[1].split_off(0);
        let mut largest = 0f32;
        for (pos, (a, b)) in logits[0].iter().zip(&as_in_file).enumerate() {
            let top = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (id, (x, y)) in a.iter().zip(b).enumerate() {
                largest = largest.max((x - y).abs());
                assert!((x - y).abs() <= 2e-3 * top, "splits {splits:?} position {pos} token {id}: {x} repacked, {y}");
            }
        }
        println!("splits {splits:?}: largest difference between the layouts {largest}");
    }
    // The whole prompt in one step: its rows are multiplied several at a time (gemm), not one by one.
    let [repacked, as_in_file] = [WeightPlacement::Automatic, WeightPlacement::AsInFile].map(|weights| {
        let mut pipeline = LocalPipeline::load(&file, &[], &options(weights), WireFormat::F32).unwrap();
        pipeline.forward(0, 0, &prompt).unwrap().to_vec()
    });
    let top = as_in_file.iter().fold(0f32, |m, v| m.max(v.abs()));
    let largest = repacked.iter().zip(&as_in_file).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    println!("prompt in one step: largest difference between the layouts {largest} (top {top})");
    assert!(largest <= 2e-3 * top, "prompt in one step: the layouts differ by {largest}, top logit {top}");
}
