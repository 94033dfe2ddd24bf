//! The device-generic path, exercised on the one device this machine has (the CPU, driven through ggml's
//! device API and scheduler like a GPU would be): weights copied into the device's own buffer, as a
//! discrete GPU needs, compute exactly what weights mapped in place (as Apple Silicon's GPU and the CPU
//! use them) compute — for the real SmolLM2 and the random mixture-of-experts models (MXFP4 experts,
//! latent attention, a sliding window) — and a pipeline mixing both placements equals the model whole.
//! The oracle tests (llama.cpp's logits) run through the same scheduler with mapped weights.
//!
//! Not exercised here: a real GPU (Metal, CUDA, Vulkan), and the CPU taking over operations a GPU lacks.

mod common;

use shoal::engine::{LocalPipeline, Stage, StageInput, StageOptions, WireFormat};
use shoal::ggml::{Device, WeightPlacement};
use shoal::model::Model;
use std::path::PathBuf;

fn options(weights: WeightPlacement) -> StageOptions {
    StageOptions { context: 256, threads: 2, weights, ..StageOptions::default() }
}

/// Logits after each token of `ids` fed one at a time, then for all of them at once (a prefill).
fn logits(pipeline: &mut LocalPipeline, ids: &[u32]) -> Vec<Vec<f32>> {
    pipeline.truncate(0, 0);
    let mut out: Vec<Vec<f32>> =
        ids.iter().enumerate().map(|(pos, &id)| pipeline.forward(0, pos, &[id]).unwrap().to_vec()).collect();
    pipeline.truncate(0, 0);
    out.push(pipeline.forward(0, 0, ids).unwrap().to_vec());
    out
}

fn models() -> Vec<(String, PathBuf)> {
    let mut models = vec![("SmolLM2".to_string(), common::model_path())];
    for random in [common::random_model::gpt_oss(), common::random_model::deepseek2(), common::random_model::qwen3moe()]
    {
        models.push((random.name(), random.write()));
    }
    models
}

#[test]
fn copied_weights_compute_exactly_what_mapped_weights_compute() {
    let cpu = Device::cpu();
    assert!(cpu.maps_host_memory());
    for (name, path) in models() {
        let model = Model::open(&path).unwrap();
        let ids = model.tokenizer().unwrap().encode("The capital of France is Paris, and of Italy").unwrap();
        let mut mapped =
            LocalPipeline::load(&model, &[], &options(WeightPlacement::Automatic), WireFormat::F32).unwrap();
        let mut copied = LocalPipeline::load(&model, &[], &options(WeightPlacement::Copied), WireFormat::F32).unwrap();
        assert!(mapped.stages()[0].weights_mapped() && !copied.stages()[0].weights_mapped());
        assert_eq!(copied.stages()[0].device(), cpu);
        assert_eq!(copied.stages()[0].memory().weights, mapped.stages()[0].memory().weights, "{name}");
        let (a, b) = (logits(&mut mapped, &ids), logits(&mut copied, &ids));
        // Bit for bit: the same kernels on the same bytes; a tensor bound to the wrong bytes would show.
        assert!(a == b, "{name}: copied weights give other logits");
    }
}

#[test]
fn a_pipeline_mixing_copied_and_mapped_stages_equals_the_model_whole() {
    for (name, path) in models() {
        let model = Model::open(&path).unwrap();
        let layers = model.config().layers;
        let ids = model.tokenizer().unwrap().encode("Name three rivers of Europe").unwrap();
        let mut whole =
            LocalPipeline::load(&model, &[], &options(WeightPlacement::Automatic), WireFormat::F32).unwrap();
        let split = layers / 2;
        let stages = vec![
            Stage::load(&model, 0..split, options(WeightPlacement::Copied)).unwrap(),
            Stage::load(&model, split..layers, options(WeightPlacement::Automatic)).unwrap(),
        ];
        let mut mixed = LocalPipeline::from_stages(stages, WireFormat::F32).unwrap();
        assert!(logits(&mut whole, &ids) == logits(&mut mixed, &ids), "{name}: split at {split}");
    }
}

#[test]
fn a_stage_on_the_cpu_device_says_so_and_an_unknown_device_is_refused() {
    let model = Model::open(&common::model_path()).unwrap();
    let named = StageOptions { device: Some("cpu".into()), ..options(WeightPlacement::Automatic) };
    let mut stage = Stage::load(&model, 0..model.config().layers, named).unwrap();
    assert_eq!(stage.device(), Device::cpu());
    assert!(stage.forward(0, 0, StageInput::Tokens(&[1, 2, 3])).is_ok());
    let unknown = StageOptions { device: Some("gpu7".into()), ..options(WeightPlacement::Automatic) };
    let err = Stage::load(&model, 0..2, unknown).err().expect("no such device").to_string();
    assert!(err.contains("gpu7") && err.contains("CPU"), "{err}");
}
