//! Hybrid attention against llama.cpp: random-weight `qwen35`, `qwen35moe`, `qwen3next` (split and
//! fused input) and `kimi-k3` (with and without residual checkpoints) models (linear-attention
//! layers with a recurrent state between gated full-attention layers; tests/common/random_model.rs)
//! give llama.cpp's logits at every position fed a token at a time, prefilled in one step and prefilled
//! in chunks; greedy tokens equal llama.cpp's and equal split at every layer; a stage's memory is its
//! layers' bytes plus the KV rows of its full-attention layers and the state of its linear ones, as
//! placement counts them; a sequence goes back only to a checkpoint of its state, exactly.

mod common;

use common::oracle;
use common::random_kimi;
use common::random_model::{self, RandomModel};
use shoal::engine::{Segment, Stage, StageInput, StageOptions, STATE_CHECKPOINTS};
use shoal::model::Model;

/// The recording of `model` by llama.cpp built for x86-64-v3 (as release builds are). Only builds
/// with those kernels compare greedy tokens exactly and logits tightly; others check the logits within
/// the loose tolerance.
fn recorded(model: &RandomModel) -> Vec<oracle::Recorded> {
    model.recorded_for_release_kernels()
}

/// Whether this build has the kernels of the recording.
fn same_kernels() -> bool {
    oracle::runs_the_x86_64_v3_kernels()
}

fn models() -> [RandomModel; 6] {
    [
        random_model::qwen35(),
        random_model::qwen35moe(),
        random_model::qwen3next(),
        random_model::qwen3next_fused(),
        random_kimi::kimi_k3(),
        random_kimi::kimi_k3_plain(),
    ]
}

#[test]
fn hybrid_models_give_llama_cpp_logits_at_every_position_a_token_at_a_time() {
    for model in models() {
        let cases = recorded(&model);
        let longest = cases.iter().map(|c| c.prompt_ids.len()).max().unwrap();
        assert!(longest > model.linear.unwrap().conv_kernel, "a prompt must be longer than the convolution");
        let file = Model::open(&model.path()).unwrap();
        oracle::check_logits_recorded_here(&file, &model.name(), &cases, same_kernels(), &oracle::options());
    }
}

/// Every prefix of the prompts prefilled in one step. Kimi K3's latent attention, like DeepSeek's, may
/// attend a prompt's first step in the expanded form (from 8 tokens at these widths), which llama.cpp
/// computes in the latent form: the same sums in another order, so within the loose tolerance.
#[test]
fn hybrid_models_prefilled_in_one_step_give_llama_cpp_logits() {
    for model in models() {
        let cases = recorded(&model);
        let file = Model::open(&model.path()).unwrap();
        let tight = same_kernels() && model.kimi.is_none();
        oracle::check_prefill_logits_with(&file, &model.name(), &cases, 1, tight, &oracle::options());
    }
}

/// Prompts prefilled in chunks of 3 tokens (each chunk continues the state the one before left) give
/// llama.cpp's logits at every chunk's last position, as fed a token at a time.
#[test]
fn hybrid_models_prefilled_in_chunks_continue_their_state() {
    for model in models() {
        let cases = recorded(&model);
        let file = Model::open(&model.path()).unwrap();
        oracle::check_chunked_prefill(&file, &model.name(), &cases, 3);
    }
}

/// Split at every layer: between two linear layers, after a linear layer before a full one, and after
/// a full one.
#[test]
fn hybrid_models_greedy_tokens_are_llama_cpp_and_equal_split_at_every_layer() {
    for model in models() {
        let cases = recorded(&model);
        let file = Model::open(&model.path()).unwrap();
        let mut split_sets: Vec<Vec<usize>> = (1..model.layers).map(|l| vec![l]).collect();
        split_sets.push((1..model.layers).collect());
        oracle::check_greedy_split(&file, &model.name(), &cases, &split_sets, same_kernels());
    }
}

/// A stage holds KV rows for its full-attention layers only and, per sequence, a fixed state for each
/// linear layer (the convolution's last inputs and a head-width square per value head, F32) with room
/// for its checkpoints; placement
/// counts the same bytes, and the weights are exactly the stage's layers' tensors.
#[test]
fn a_hybrid_stage_holds_kv_rows_for_full_layers_and_a_state_for_linear_ones() {
    let options = StageOptions { context: 512, sequences: 3, threads: 2, ..StageOptions::default() };
    for model in models() {
        let file = Model::open(&model.write()).unwrap();
        let linear = model.linear.unwrap();
        let (s, hk, hv, k) = (linear.head_width, linear.key_heads, linear.value_heads, linear.conv_kernel);
        let state_bytes = 4 * ((k - 1) * (2 * s * hk + s * hv) + s * s * hv) as u64;
        // F16 keys and values; Kimi K3's latent attention caches one row whose values are the latent.
        let rows_per_position = if model.kimi.is_some() { 1 } else { 2 };
        let kv_bytes = rows_per_position * 2 * (model.kv_heads * model.head_dim) as u64 * 512;
        let needs = shoal::placement::ModelNeeds::of(&file, options.context, options.sequences, options.batch);
        // A pipeline's widest boundary (Kimi K3's checkpoints) is what placement puts on every link.
        let widest = 4 * file.config().hidden_width(model.layers - 1) as u64;
        assert_eq!(needs.hidden_bytes_per_token, widest, "{}", model.name());
        assert_eq!(widest > 4 * model.embedding as u64, model.kimi.is_some_and(|k| k.residual_block > 0));
        // What the launch preview shows beside the KV cache: one request's state in every linear layer.
        let linear_layers = (0..model.layers).filter(|l| !(l + 1).is_multiple_of(linear.interval)).count() as u64;
        assert_eq!(needs.state_per_sequence, linear_layers * state_bytes, "{}", model.name());
        for range in [0..1, 0..2, 1..3, 2..model.layers, 0..model.layers] {
            let full = range.clone().filter(|l| (l + 1).is_multiple_of(linear.interval)).count() as u64;
            // Each sequence's state, and its checkpoints at most (a copy each).
            let states = state_bytes * (1 + STATE_CHECKPOINTS as u64);
            let want = (full * kv_bytes + (range.len() as u64 - full) * states) * options.sequences as u64;
            let stage = Stage::load(&file, range.clone(), options.clone()).unwrap();
            assert_eq!(stage.memory().kv_cache, want, "{} layers {range:?}", model.name());
            assert_eq!(needs.stage(range.clone()).kv_cache, want, "{} layers {range:?}", model.name());
            assert!(needs.stage(range.clone()).compute >= stage.memory().compute, "{} layers {range:?}", model.name());
            let in_file = common::stage_tensor_bytes(&file, &range, model.layers);
            assert_eq!(stage.weights().mapped_bytes(), in_file, "{} layers {range:?}", model.name());
            assert_eq!(file.layout().stage_bytes(range.clone()), in_file, "{} layers {range:?}", model.name());
        }
    }
}

/// A linear layer's state has passed the positions before it: a step may continue a sequence, start it
/// again from 0 (the same logits as the first time: the state is not carried over from the earlier
/// request) or go back to a checkpoint — the end of a prefill chunk that asked no logits, as stage 0
/// cuts a prompt a few tokens before its end — which gives, bit for bit, what a sequence that never
/// went past it gives; no other position.
#[test]
fn a_hybrid_sequence_continues_starts_again_or_goes_back_to_a_checkpoint() {
    for model in models() {
        let file = Model::open(&model.write()).unwrap();
        let options = StageOptions { sequences: 2, ..oracle::options() };
        let mut stage = Stage::load(&file, 0..model.layers, options).unwrap();
        let name = model.name();
        let prompt = [1u32, 2, 3, 4, 5, 6, 7];
        let chunk = |seq, tokens| Segment { seq, start: 0, tokens, logits: false, drafted: 0 };
        stage.forward_batch(&[chunk(0, 5)], StageInput::Tokens(&prompt[..5])).unwrap();
        let first = stage.forward(0, 5, StageInput::Tokens(&prompt[5..])).unwrap().to_vec();
        stage.forward(0, 7, StageInput::Tokens(&[8])).unwrap();
        assert_eq!(stage.checkpoints(0), [5], "{name}");
        let error = stage.forward(0, 3, StageInput::Tokens(&[4])).unwrap_err().to_string();
        assert!(
            error.contains("cannot go back to position 3") && error.contains("checkpoints at [5]"),
            "{name}: {error}"
        );

        // Back to the checkpoint, another way on: as a sequence that ran only the chunk.
        let back = stage.forward(0, 5, StageInput::Tokens(&[9, 10])).unwrap().to_vec();
        stage.forward_batch(&[chunk(1, 5)], StageInput::Tokens(&prompt[..5])).unwrap();
        let never_past = stage.forward(1, 5, StageInput::Tokens(&[9, 10])).unwrap().to_vec();
        assert_eq!(back, never_past, "{name}: gone back to position 5");
        assert_eq!(stage.len(0), 7, "{name}");
        // Twice, and past the first way on again: the checkpoint stays while nothing goes before it.
        assert_eq!(stage.forward(0, 5, StageInput::Tokens(&prompt[5..])).unwrap(), &first[..], "{name}");

        stage.forward(0, 0, StageInput::Tokens(&prompt)).unwrap();
        assert!(stage.checkpoints(0).is_empty(), "{name}: starting again forgets them");
        let again = stage.forward(0, 0, StageInput::Tokens(&prompt)).unwrap().to_vec();
        let whole = Stage::load(&file, 0..model.layers, oracle::options())
            .unwrap()
            .forward(0, 0, StageInput::Tokens(&prompt))
            .unwrap()
            .to_vec();
        assert_eq!(again, whole, "{name}: a sequence started again reads a zero state");
    }
}

/// A tensor-parallel group is refused with the reason, before anything loads.
#[test]
fn qwen3next_is_refused_across_tensor_parallel_ranks_with_the_reason() {
    for model in [random_model::qwen3next(), random_model::qwen3next_fused()] {
        let file = Model::open(&model.write()).unwrap();
        let reason = file.config().architecture.declaration().splits_across_ranks(file.config()).unwrap_err();
        assert!(reason.contains("--parallel pipeline"), "{reason}");
        assert!(shoal::model::slice::plan(&file, &[1.0, 1.0]).is_err(), "{} divided", model.name());
    }
    // Qwen3.5's and Kimi K3's divide by heads (tests/engine_tensor_parallel.rs).
    for model in [random_model::qwen35(), random_model::qwen35moe(), random_kimi::kimi_k3()] {
        let file = Model::open(&model.write()).unwrap();
        assert!(shoal::model::slice::plan(&file, &[1.0, 1.0]).is_ok(), "{}", model.name());
    }
}

/// A Kimi K3 file whose metadata shoal cannot run as llama.cpp does is refused when it opens, with the
/// key and what is wrong with it: attention layers of different KV head counts, no split latent
/// expansion, no situ parameters.
#[test]
fn a_kimi_k3_file_shoal_cannot_run_is_refused_with_the_key() {
    use common::gguf_writer::Meta;
    use shoal::model::Value;
    let model = random_kimi::kimi_k3();
    let per_layer = |counts: &[u32]| Meta::Value(Value::Array(counts.iter().map(|&n| Value::U32(n)).collect()));
    let set = |meta: &mut Vec<(String, Meta)>, key: &str, value: Meta| {
        meta.retain(|(k, _)| k != key);
        meta.push((key.into(), value));
    };
    type Edit = Box<dyn Fn(&mut Vec<(String, Meta)>)>;
    let cases: [(&str, Edit, &str); 3] = [
        (
            "kimi-k3-kv-heads-vary",
            Box::new(move |m| set(m, "kimi-k3.attention.head_count_kv", per_layer(&[0, 1, 0, 2, 0]))),
            "varies between attention layers",
        ),
        (
            "kimi-k3-no-split-latent",
            Box::new(|m| {
                m.retain(|(k, _)| !k.starts_with("kimi-k3.attention.key_length_mla"));
                m.retain(|(k, _)| !k.starts_with("kimi-k3.attention.value_length_mla"));
            }),
            "key_length_mla",
        ),
        ("kimi-k3-no-situ", Box::new(|m| m.retain(|(k, _)| k != "kimi-k3.activation.situ_beta")), "situ_beta"),
    ];
    for (name, edit, needle) in cases {
        let path = model.write_edited(name, |meta| edit(meta));
        let error = Model::open(&path).err().unwrap_or_else(|| panic!("{name} opened")).to_string();
        assert!(error.contains(needle), "{name}: {error}");
    }
}
