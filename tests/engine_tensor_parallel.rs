//! Tensor parallelism in the engine: the ranks of a group (threads of this process, linked by channels)
//! each hold a slice of every layer and sum their parts twice per layer. The group must compute what
//! the model whole computes, teacher-forced on the whole model's greedy tokens: every step's logits
//! within a bound, and the same greedy choice at three steps in four at least (at a near tie the
//! rounding below may swap the two best: SmolLM2 made another choice at 2 of 24 steps; the random
//! models at none).
//!
//! Why a bound and not equality: a rank sums its share of each dot product and the group adds the
//! shares, so the hidden states differ from the whole model's in their last bits (about 1e-7 of their
//! size). A quantized model quantizes every layer's input to 8 bits on the fly, and a last-bit difference
//! that moves a value across a rounding boundary moves it by a whole quantization step; over 30 layers
//! that adds up. So the bound is the model's own sensitivity, measured here: how far its logits move
//! when the hidden state after its first layer is nudged by 1e-7 to 1e-5 of itself (for SmolLM2 Q4_1
//! this moved the largest logit, about 29, by 0.5 to 0.9; the group moved it by 0.9 at most). The group
//! may differ by 3 times that, plus 1e-3 of the largest logit. A wrong slice, a head or a bias added
//! twice or missed, moves logits by tens.
//!
//! Checked for SmolLM2 over 2 and 3 ranks, and for random mixture-of-experts models with their experts
//! split 2:1 (Qwen3-MoE, GLM-4.5 with dense layers, biases and a shared expert, Mixtral, gpt-oss with
//! sinks, biases and MXFP4 experts, DeepSeek V3 with latent attention, group-limited routing and a
//! shared expert in both its attention forms). Every rank's memory is its slice: the weights the ranks map add up
//! to the model's, with the whole tensors (norms, embeddings) once per rank.

mod common;

use common::random_model::{self, RandomModel};
use shoal::engine::parallel::{self, local::channel_group, Group};
use shoal::engine::{argmax, LocalPipeline, Stage, StageInput, StageOptions};
use shoal::model::{slice, Model};
use std::path::{Path, PathBuf};
use std::time::Duration;

const PROMPTS: [&[u32]; 2] = [&[1, 504, 3458, 282, 4649, 314, 2], &[9, 17, 2024, 33, 71, 5000, 123, 12, 8, 901, 77]];
const DECODE: usize = 12;

fn options() -> StageOptions {
    StageOptions { context: 256, sequences: 2, threads: 1, batch: 32, ..StageOptions::default() }
}

/// The tokens each prompt continues with, and the logits of every step.
type Run = Vec<(Vec<u32>, Vec<Vec<f32>>)>;

/// Each prompt (a sequence each), then `tokens[p]` fed one by one, or the greedy choice where `tokens`
/// is empty.
fn run(stage: &mut Stage, forced: Option<&Run>) -> Run {
    run_with(&mut |seq, start, tokens| stage.forward(seq, start, StageInput::Tokens(tokens)).unwrap().to_vec(), forced)
}

/// A step of sequence `seq` from position `start` (the arguments), returning its last token's logits.
type Forward<'a> = dyn FnMut(usize, usize, &[u32]) -> Vec<f32> + 'a;

/// [`run`] through `forward`.
fn run_with(forward: &mut Forward<'_>, forced: Option<&Run>) -> Run {
    PROMPTS
        .iter()
        .enumerate()
        .map(|(seq, prompt)| {
            let mut logits = vec![forward(seq, 0, prompt)];
            let mut tokens = Vec::new();
            for i in 0..DECODE {
                let next = match forced {
                    Some(reference) => reference[seq].0[i],
                    None => argmax(&logits[i]),
                };
                tokens.push(next);
                if i + 1 < DECODE {
                    logits.push(forward(seq, prompt.len() + i, &[next]));
                }
            }
            (tokens, logits)
        })
        .collect()
}

/// The model whole, in one stage, greedy.
fn whole(path: &Path) -> Run {
    let model = Model::open(path).unwrap();
    let mut stage = Stage::load(&model, 0..model.config().layers, options()).unwrap();
    run(&mut stage, None)
}

/// The model over a group of ranks holding `shares`, teacher-forced on `reference`: followers on
/// threads, the leader here. Returns the leader's run and the bytes each rank mapped.
fn grouped(path: &Path, shares: &[f64], reference: &Run) -> (Run, Vec<u64>) {
    let model = Model::open(path).unwrap();
    let slices = slice::plan(&model, shares).unwrap();
    let mut links = channel_group(shares.len(), Duration::from_secs(60)).into_iter();
    let leader_links = links.next().unwrap();
    let followers: Vec<_> = links
        .map(|l| {
            let (path, slices) = (path.to_path_buf(), slices.clone());
            std::thread::spawn(move || {
                let model = Model::open(&path).unwrap();
                let group = Group::new(slices, Box::new(l)).unwrap();
                let mut stage = Stage::load_rank(&model, 0..model.config().layers, options(), group).unwrap();
                let bytes = stage.memory().weights;
                parallel::follow(&mut stage).unwrap();
                bytes
            })
        })
        .collect();
    let group = Group::new(slices, Box::new(leader_links)).unwrap();
    let mut stage = Stage::load_rank(&model, 0..model.config().layers, options(), group).unwrap();
    let forced = run(&mut stage, Some(reference));
    stage.group().unwrap().stop();
    let mut bytes = vec![stage.memory().weights];
    bytes.extend(followers.into_iter().map(|f| f.join().unwrap()));
    // Placement counts each rank's weights exactly as the rank maps them.
    // (the divider it plans with reckons them without reading the tensors: the same bytes).
    let divider = slice::Divider::of(&model).unwrap();
    for (rank, s) in slice::plan(&model, shares).unwrap().iter().enumerate() {
        assert_eq!(slice::rank_bytes(&model, s).unwrap(), bytes[rank], "rank {rank} of {shares:?}: the file's bytes");
        assert_eq!(divider.bytes(s), bytes[rank], "rank {rank} of {shares:?}: placement's bytes");
    }
    (forced, bytes)
}

/// How far the model's logits move when the hidden state after its first layers is nudged by 1e-7 to
/// 1e-5 of itself (every third value), over each prompt's first step: its sensitivity to rounding.
/// The first stage ends before the first layer a stage may begin at (GLM-5.2's next layers reuse the
/// first one's sparse-attention choice).
fn sensitivity(path: &Path) -> f32 {
    let model = Model::open(path).unwrap();
    let layers = model.config().layers;
    let cut = (1..layers).find(|&l| model.config().may_begin_stage(l)).expect("a stage may begin after layer 0");
    let mut first = Stage::load(&model, 0..cut, options()).unwrap();
    let mut rest = Stage::load(&model, cut..layers, options()).unwrap();
    let mut worst = 0f32;
    for prompt in PROMPTS {
        let hidden = first.forward(0, 0, StageInput::Tokens(prompt)).unwrap().to_vec();
        let tokens = prompt.len();
        let base = rest.forward(0, 0, StageInput::Hidden { values: &hidden, tokens }).unwrap().to_vec();
        for nudge in [1e-7f32, 1e-6, 1e-5] {
            let nudged: Vec<f32> =
                hidden.iter().enumerate().map(|(i, v)| if i % 3 == 0 { v * (1.0 + nudge) } else { *v }).collect();
            let out = rest.forward(0, 0, StageInput::Hidden { values: &nudged, tokens }).unwrap();
            worst = base.iter().zip(out).map(|(x, y)| (x - y).abs()).fold(worst, f32::max);
        }
    }
    worst
}

/// The group's teacher-forced run against the whole model's: logits within the bound at every step,
/// and the whole model's greedy choice wherever it leads the runner-up by more than twice the bound.
fn assert_same(label: &str, path: &Path, whole: &Run, group: &Run) {
    let sensitivity = sensitivity(path);
    let (mut checked, mut steps) = (0, 0);
    for (p, ((tokens, logits), (_, group_logits))) in whole.iter().zip(group).enumerate() {
        for (step, (a, b)) in logits.iter().zip(group_logits).enumerate() {
            assert_eq!(a.len(), b.len(), "{label}: the group's logits have another width");
            let largest = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            let bound = 3.0 * sensitivity + 1e-3 * largest;
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(
                worst <= bound,
                "{label}: prompt {p} step {step}: logits differ by {worst}, more than {bound} (the model moves by \
                 {sensitivity} when nudged; largest logit {largest})"
            );
            steps += 1;
            if argmax(b) == tokens[step] {
                checked += 1;
            }
        }
    }
    // Rounding can swap two near-equal logits (SmolLM2: 2 of 24 steps); a wrong slice swaps most.
    assert!(4 * checked >= 3 * steps, "{label}: only {checked} of {steps} steps made the same greedy choice");
}

#[test]
fn smollm2_over_two_three_and_four_ranks_computes_the_whole_model() {
    let path = common::model_path();
    let reference = whole(&path);
    let table = common::tensor_table::read(&path);
    let bytes_of =
        |keep: &dyn Fn(&str) -> bool| -> u64 { table.tensors.iter().filter(|t| keep(&t.name)).map(|t| t.bytes).sum() };
    let model = Model::open(&path).unwrap();
    // 9 query heads in 3 key/value groups: 2 ranks divide a group (5 and 4 heads), 3 hold one each,
    // 4 (more ranks than groups) share groups.
    for ranks in [2, 3, 4] {
        let shares = vec![1.0; ranks];
        let slices = slice::plan(&model, &shares).unwrap();
        let heads: Vec<usize> = slices.iter().map(|s| s.query_heads.len()).collect();
        assert!(heads.iter().max().unwrap() - heads.iter().min().unwrap() <= 1, "{ranks} ranks: heads {heads:?}");
        let (forced, bytes) = grouped(&path, &shares, &reference);
        assert_same(&format!("SmolLM2 over {ranks} ranks"), &path, &reference, &forced);
        // Every rank maps the norms and the token embeddings whole and its slice of everything else,
        // the output head (tied to the embeddings) included: together, the file's tensors, the whole
        // ones once more for each further rank, the head once more, and the keys and values of a
        // group once more for each further rank holding it.
        let all = bytes_of(&|_| true);
        let embedding = bytes_of(&|n| n == "token_embd.weight");
        let whole_tensors = bytes_of(&|n| n.ends_with("norm.weight") || n == "token_embd.weight");
        let kv_per_head = bytes_of(&|n| n.ends_with("attn_k.weight") || n.ends_with("attn_v.weight")) / 3;
        let kv_held: usize = slices.iter().map(|s| s.kv_heads.len()).sum();
        let expected = all + (ranks as u64 - 1) * whole_tensors + embedding + (kv_held as u64 - 3) * kv_per_head;
        assert_eq!(bytes.iter().sum::<u64>(), expected, "{ranks} ranks: the ranks' weights are the model's, sliced");
    }
}

fn random(model: RandomModel) -> PathBuf {
    model.write()
}

#[test]
fn random_models_split_unevenly_compute_the_whole_model() {
    // Gemma 3's one key/value head is held by both ranks; the others' 2:1 split divides a group.
    for (label, model) in [
        ("Gemma 3", random_model::gemma3()),
        ("Qwen3-MoE", random_model::qwen3moe()),
        ("GLM-4.5", random_model::glm4moe()),
        ("Mixtral", random_model::mixtral()),
        ("gpt-oss", random_model::gpt_oss()),
        ("DeepSeek V3", random_model::deepseek2()),
        ("DeepSeek V2 (combined kv_b)", random_model::deepseek2_legacy()),
        ("Qwen3.5", random_model::qwen35()),
        ("Qwen3.5-MoE", random_model::qwen35moe()),
        ("Kimi K3 (no checkpoints)", common::random_kimi::kimi_k3_plain()),
        ("Kimi K3 (checkpoints)", common::random_kimi::kimi_k3_softplus()),
        // Q and K normed across heads: the ranks complete the queries' sum of squares.
        ("MiniMax M2", random_model::minimax_m2()),
        // Every rank holds the lightning indexer whole and chooses the same positions.
        ("DeepSeek V3.2", common::random_sparse::deepseek32()),
        // Layers without an indexer reuse the choice every rank made alike.
        ("GLM-5.2", common::random_sparse::glm_dsa()),
        // Each rank selects blocks for its key/value heads; at 2:1 one rank holds part of a group.
        ("MiniMax M3", common::random_sparse::minimax_m3()),
    ] {
        let path = random(model);
        let reference = whole(&path);
        let (forced, _) = grouped(&path, &[2.0, 1.0], &reference);
        assert_same(label, &path, &reference, &forced);
    }
}

/// Tensor-parallel groups chained as pipeline stages (a model too large for one group, or links fast
/// within groups and slow between them): each group's ranks hold slices of its layers only, a later
/// group starts from the hidden states the previous stage sends its leader (which passes them on to its
/// ranks), and the last group's ranks each compute rows of the logits. SmolLM2 (its head tied to the
/// embeddings, so the last group maps rows of a tensor the first holds whole), and random models with
/// groups meeting at the dense/mixture-of-experts boundary (GLM-4.5, DeepSeek V3) and sliding-window
/// layers with sinks (gpt-oss).
#[test]
fn groups_chained_as_pipeline_stages_compute_the_whole_model() {
    let cases = [
        ("SmolLM2", common::model_path(), vec![(0..12, vec![1.0, 1.0]), (12..20, vec![1.0]), (20..30, vec![2.0, 1.0])]),
        ("GLM-4.5", random(random_model::glm4moe()), vec![(0..2, vec![1.0, 1.0]), (2..5, vec![1.0, 2.0])]),
        ("DeepSeek V3", random(random_model::deepseek2()), vec![(0..1, vec![1.0]), (1..4, vec![1.0, 1.0])]),
        ("DeepSeek V3.2", random(common::random_sparse::deepseek32()), vec![(0..2, vec![1.0, 2.0]), (2..4, vec![1.0])]),
        // Groups meet where a layer has its own indexer (the next ones reuse its choice).
        ("GLM-5.2", random(common::random_sparse::glm_dsa()), vec![(0..3, vec![1.0, 1.0]), (3..5, vec![2.0, 1.0])]),
        // The dense layer alone, then the block-sparse layers over a group.
        ("MiniMax M3", random(common::random_sparse::minimax_m3()), vec![(0..1, vec![1.0]), (1..4, vec![1.0, 1.0])]),
        ("gpt-oss", random(random_model::gpt_oss()), vec![(0..2, vec![2.0, 1.0]), (2..4, vec![1.0, 1.0, 1.0])]),
        // A gated delta-net layer alone, then a group over linear and full layers with experts.
        ("Qwen3.5-MoE", random(random_model::qwen35moe()), vec![(0..1, vec![1.0]), (1..4, vec![1.0, 2.0])]),
        // Residual checkpoints cross from one group to the next; a group of delta-attention layers only.
        (
            "Kimi K3",
            random(common::random_kimi::kimi_k3_softplus()),
            vec![(0..1, vec![1.0, 1.0]), (1..5, vec![2.0, 1.0])],
        ),
    ];
    for (label, path, chain) in cases {
        let reference = whole(&path);
        let model = Model::open(&path).unwrap();
        assert_eq!(chain.last().unwrap().0.end, model.config().layers, "{label}: the chain covers the model");
        let mut pipeline = LocalPipeline::load_chain(&model, &chain, &options()).unwrap();
        // Each group's leader maps its slice of its own layers only: the embeddings on the first group,
        // the head on the last. Placement's divider counts the same bytes without reading the tensors,
        // and a node fetching the rank's share fetches as many.
        let divider = slice::Divider::of(&model).unwrap();
        for (stage, (layers, shares)) in pipeline.stages().iter().zip(&chain) {
            if shares.len() > 1 {
                let leader = &slice::plan(&model, shares).unwrap()[0];
                let expected = slice::rank_bytes_in(&model, leader, layers.clone()).unwrap();
                assert_eq!(stage.memory().weights, expected, "{label}: the leader of {layers:?}");
                assert!(expected < slice::rank_bytes(&model, leader).unwrap(), "{label}: {layers:?} is not the model");
                assert_eq!(
                    divider.bytes_in(leader, layers.clone()),
                    expected,
                    "{label}: placement's bytes of {layers:?}"
                );
                let ranges = slice::rank_ranges_in(&model, leader, layers.clone()).unwrap();
                let fetched: u64 = ranges.iter().flatten().map(|r| r.end - r.start).sum();
                assert_eq!(fetched, expected, "{label}: the bytes a share fetch of {layers:?} reads");
            }
            // Over every layer, the divider counts what the file holds for the whole model.
            for s in slice::plan(&model, shares).unwrap() {
                let whole = divider.bytes_in(&s, 0..model.config().layers);
                assert_eq!(whole, slice::rank_bytes(&model, &s).unwrap(), "{label}: the whole model's bytes");
            }
        }
        let label = format!("{label} over {chain:?}");
        let forced = run_with(
            &mut |seq, start, tokens| pipeline.forward(seq, start, tokens).unwrap().to_vec(),
            Some(&reference),
        );
        assert_same(&label, &path, &reference, &forced);
    }
}

#[test]
fn a_group_the_model_cannot_divide_is_refused_with_the_reason() {
    let model = Model::open(&common::model_path()).unwrap();
    let error = slice::plan(&model, &[1.0; 10]).unwrap_err();
    assert!(error.contains("9 attention heads"), "{error}");
}

/// A layer sums the ranks' parts twice, whatever its feed-forward: after attention, and after the
/// feed-forward, where the routed experts' parts and the shared experts' are summed as one (DeepSeek
/// V3, GLM-4.5).
#[test]
fn every_layer_sums_twice_per_step_shared_experts_included() {
    for model in [random_model::deepseek2(), random_model::glm4moe()] {
        let path = random(model);
        let model = Model::open(&path).unwrap();
        let layers = model.config().layers as u64;
        let slices = slice::plan(&model, &[1.0, 1.0]).unwrap();
        let mut links = channel_group(2, Duration::from_secs(60)).into_iter();
        let leader_links = links.next().unwrap();
        let follower_links = links.next().unwrap();
        let follower = {
            let (path, slices) = (path.clone(), slices.clone());
            std::thread::spawn(move || {
                let model = Model::open(&path).unwrap();
                let group = Group::new(slices, Box::new(follower_links)).unwrap();
                let mut stage = Stage::load_rank(&model, 0..layers as usize, options(), group).unwrap();
                parallel::follow(&mut stage).unwrap();
            })
        };
        let group = Group::new(slices, Box::new(leader_links)).unwrap();
        let mut stage = Stage::load_rank(&model, 0..layers as usize, options(), group).unwrap();
        let before = stage.group().unwrap().sums_taken();
        stage.forward(0, 0, StageInput::Tokens(&[1, 2, 3])).unwrap();
        let after_prompt = stage.group().unwrap().sums_taken();
        stage.forward(0, 3, StageInput::Tokens(&[4])).unwrap();
        let after_decode = stage.group().unwrap().sums_taken();
        stage.group().unwrap().stop();
        follower.join().unwrap();
        let label = &model.config().architecture;
        assert_eq!(after_prompt - before, 2 * layers, "{label:?}: sums of a prompt step");
        assert_eq!(after_decode - after_prompt, 2 * layers, "{label:?}: sums of a decode step");
    }
}

/// DeepSeek's latent attention caches one latent per position that every query head reads: each rank
/// holds it whole (and computes it), while its heads' expansions are its own; the combined kv_b form
/// caches keys and values per head, so each rank its own heads'.
#[test]
fn deepseek2_ranks_hold_the_latent_whole_and_their_own_heads() {
    let deepseek = Model::open(&random(random_model::deepseek2())).unwrap();
    let slices = slice::plan(&deepseek, &[2.0, 1.0]).unwrap();
    let heads = deepseek.config().heads;
    assert_eq!(slices.iter().map(|s| s.query_heads.len()).sum::<usize>(), heads);
    assert!(slices.iter().all(|s| s.kv_heads == (0..1)), "{slices:?}");
    let legacy = Model::open(&random(random_model::deepseek2_legacy())).unwrap();
    for s in slice::plan(&legacy, &[2.0, 1.0]).unwrap() {
        assert_eq!(s.kv_heads, s.query_heads, "the combined form caches each head's keys and values");
    }
}
