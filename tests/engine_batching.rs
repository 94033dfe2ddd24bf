//! Continuous batching in the engine: one step of a stage runs several sequences at once, each over its
//! own part of the KV cache. A request must give the same greedy tokens alone as batched with others
//! — prompts of different lengths prefilled in one step, decode rows of several sequences in one step,
//! a request joining mid-way with its prompt in the same step as the others' decode rows, requests
//! leaving at different times — for the real SmolLM2 and for the random models of every architecture
//! (mixture of experts, sliding windows, latent attention, attention sinks, linear attention with a
//! recurrent state), whole and split into stages.

mod common;

use common::random_model::{self, RandomModel};
use shoal::engine::{argmax, LocalPipeline, Segment, Stage, StageInput, StageOptions, WireFormat};
use shoal::model::Model;
use std::path::Path;

/// Each request: its prompt's length and how many tokens it decodes, and the decode step at which it
/// arrives (0: with the first step). The last one decodes across the cache's first block boundary
/// (256 positions), where its rows stop attending in one batch with the others'.
const REQUESTS: [(usize, usize, usize); 4] = [(7, 12, 0), (23, 5, 0), (2, 9, 0), (250, 10, 3)];

fn prompt(request: usize, length: usize) -> Vec<u32> {
    (0..length as u32).map(|i| 2 + (i * 7919 + request as u32 * 104_729) % 40_000).collect()
}

/// One compute thread per stage: from 512 cached rows ggml splits a lone decode row's cache across the
/// threads its stage computes with, and a stage sharing the machine's cores (these tests run side by
/// side) may be lent fewer threads than it asks for, which would round that row differently from one
/// run to the next, batched or not.
fn options(sequences: usize) -> StageOptions {
    StageOptions { context: 512, sequences, threads: 1, batch: 320, ..StageOptions::default() }
}

/// A request's greedy tokens and the logits of each of its steps.
type Outcome = (Vec<u32>, Vec<Vec<f32>>);

/// Greedy tokens and each step's logits of one request, alone in a single-sequence pipeline.
fn alone(model: &Model, splits: &[usize], prompt: &[u32], decode: usize) -> Outcome {
    let mut pipeline = LocalPipeline::load(model, splits, &options(1), WireFormat::F32).unwrap();
    let mut logits = vec![pipeline.forward(0, 0, prompt).unwrap().to_vec()];
    let mut tokens = vec![argmax(&logits[0])];
    for i in 1..decode {
        let pos = prompt.len() + i - 1;
        logits.push(pipeline.forward(0, pos, &[tokens[i - 1]]).unwrap().to_vec());
        tokens.push(argmax(logits.last().unwrap()));
    }
    (tokens, logits)
}

/// Where one request stands in the batched run.
struct Running {
    request: usize,
    prompt: Vec<u32>,
    decode: usize,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

/// All requests through one pipeline of four sequences, every step batched: new requests' prompts with
/// the others' decode rows, each request leaving when it has its tokens.
fn batched(model: &Model, splits: &[usize]) -> Vec<Outcome> {
    let mut pipeline = LocalPipeline::load(model, splits, &options(4), WireFormat::F32).unwrap();
    let vocabulary = model.config().vocabulary;
    let mut running: Vec<Running> = Vec::new();
    let mut done: Vec<Option<Outcome>> = vec![None; REQUESTS.len()];
    let mut step = 0;
    let mut steps_with_both = 0;
    while done.iter().any(Option::is_none) {
        for (request, &(length, decode, arrives)) in REQUESTS.iter().enumerate() {
            if arrives == step {
                running.push(Running {
                    request,
                    prompt: prompt(request, length),
                    decode,
                    tokens: vec![],
                    logits: vec![],
                });
            }
        }
        // Sequences are the request numbers, so a late request takes a sequence others have left.
        let mut segments = Vec::new();
        let mut input = Vec::new();
        for r in &running {
            let seq = r.request;
            match r.tokens.last() {
                None => {
                    segments.push(Segment { seq, start: 0, tokens: r.prompt.len(), logits: true, drafted: 0 });
                    input.extend(&r.prompt);
                }
                Some(&last) => {
                    let start = r.prompt.len() + r.tokens.len() - 1;
                    segments.push(Segment { seq, start, tokens: 1, logits: true, drafted: 0 });
                    input.push(last);
                }
            }
        }
        let prefills = segments.iter().filter(|s| s.tokens > 1).count();
        if prefills > 0 && prefills < segments.len() {
            steps_with_both += 1;
        }
        let out = pipeline.forward_batch(&segments, &input).unwrap();
        assert_eq!(out.len(), segments.len() * vocabulary, "one row of logits per segment");
        for (r, row) in running.iter_mut().zip(out.chunks(vocabulary)) {
            r.logits.push(row.to_vec());
            r.tokens.push(argmax(row));
        }
        running.retain_mut(|r| {
            if r.tokens.len() < r.decode {
                return true;
            }
            done[r.request] = Some((std::mem::take(&mut r.tokens), std::mem::take(&mut r.logits)));
            false
        });
        step += 1;
    }
    assert!(steps_with_both > 0, "a prompt must have been batched with decode rows");
    done.into_iter().map(Option::unwrap).collect()
}

fn check_batched_equals_alone(path: &Path, name: &str, splits: &[usize]) {
    let model = Model::open(path).unwrap();
    let batched = batched(&model, splits);
    for (request, &(length, decode, _)) in REQUESTS.iter().enumerate() {
        let (want_tokens, want_logits) = alone(&model, splits, &prompt(request, length), decode);
        let (got_tokens, got_logits) = &batched[request];
        assert_eq!(got_tokens, &want_tokens, "{name} split {splits:?}: request {request}'s greedy tokens");
        for (step, (got, want)) in got_logits.iter().zip(&want_logits).enumerate() {
            // Greedy tokens are the requirement; the logits must agree closely. SmolLM2's quantized
            // products compute each row alone, whatever the batch: bit for bit the same (measured: 0).
            // The random models' F16 products take ggml's tiled kernel for several rows, which sums in
            // another order than the one-row kernel, and more so for a longer prompt batched with other
            // rows (measured: at most 0.018 against logits of 33 for the short prompts, 0.091 against 31
            // for gpt-oss's 250-token one, the same before and after decode rows attended as a batch).
            let largest = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let top = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            // Qwen3.5's (and Qwen3-Next's) linear layers pass such rounding on through their recurrent state and an RMS
            // norm of each head's output, and it grows: request 0's step 8 differs by 0.46 against
            // logits of 33 — as in llama.cpp itself, whose two sequences decoded together differ from
            // one alone by 0.459 at the same step of this model (measured with llama.cpp 11434 built
            // for x86-64-v3), and whose own prefill differs from its token-at-a-time logits by 0.0126.
            // Kimi K3's residual checkpoints are scored through an RMS norm of each, which at one
            // token of this random model turns rounding into a different mix: request 1's step 3
            // differs by 19.9 against logits of 36 — exactly as in llama.cpp, whose prompt prefilled in
            // one batch and fed a token at a time give those same two rows (36.22 and 34.43 for the
            // top token, measured with llama.cpp 11434 built for x86-64-v3). Its greedy tokens must
            // still agree (above), its logits cannot; the model without checkpoints keeps the bound.
            let bound = match name {
                "SmolLM2" => 0.0,
                "qwen35" | "qwen35moe" | "qwen3next" => 2e-2 * top,
                "kimi-k3" => f32::INFINITY,
                _ => 4e-3 * top,
            };
            assert!(
                largest <= bound,
                "{name} split {splits:?}: request {request} step {step} differs by {largest} (bound {bound})"
            );
        }
    }
}

#[test]
fn smollm2_batched_equals_alone_whole_and_split() {
    let path = common::model_path();
    check_batched_equals_alone(&path, "SmolLM2", &[]);
    check_batched_equals_alone(&path, "SmolLM2", &[10, 20]);
}

#[test]
fn every_architecture_batched_equals_alone() {
    let models: [RandomModel; 14] = [
        random_model::qwen3moe(),
        random_model::glm4moe(),
        random_model::gemma3(),
        random_model::deepseek2(),
        random_model::gpt_oss(),
        random_model::qwen35(),
        random_model::qwen35moe(),
        random_model::qwen3next(),
        common::random_kimi::kimi_k3(),
        common::random_kimi::kimi_k3_plain(),
        random_model::minimax_m2(),
        common::random_sparse::deepseek32(),
        common::random_sparse::glm_dsa(),
        common::random_sparse::minimax_m3(),
    ];
    for model in models {
        let path = model.write();
        check_batched_equals_alone(&path, &model.name(), &[]);
        // GLM-5.2's layers 1 and 2 reuse layer 0's sparse choice: a stage may begin at layer 3.
        let split = if model.architecture == "glm-dsa" { 3 } else { 1 };
        check_batched_equals_alone(&path, &model.name(), &[split]);
    }
}

/// A step whose segments are inconsistent is refused with a clear error and changes nothing.
#[test]
fn malformed_batches_are_refused() {
    let model = Model::open(&common::model_path()).unwrap();
    let mut stage = Stage::load(&model, 0..model.config().layers, options(2)).unwrap();
    let seg = |seq, start, tokens| Segment { seq, start, tokens, logits: true, drafted: 0 };
    let err = |stage: &mut Stage, segments: &[Segment], tokens: &[u32]| {
        stage.forward_batch(segments, StageInput::Tokens(tokens)).unwrap_err().to_string()
    };
    assert!(err(&mut stage, &[seg(0, 0, 2), seg(0, 2, 1)], &[5, 6, 7]).contains("appears twice"));
    assert!(err(&mut stage, &[seg(0, 0, 2), seg(1, 0, 2)], &[5, 6, 7]).contains("hold 4 tokens but its input has 3"));
    assert!(err(&mut stage, &[seg(0, 0, 1), seg(2, 0, 1)], &[5, 6]).contains("sequence 2 does not exist"));
    assert!(err(&mut stage, &[seg(0, 0, 1), seg(1, 4, 1)], &[5, 6]).contains("skips ahead"));
    assert!(err(&mut stage, &[], &[]).contains("0 segments"));
    assert!(stage.is_empty(0) && stage.is_empty(1), "a refused step writes nothing");
}
