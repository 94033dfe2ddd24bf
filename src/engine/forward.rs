//! A stage's graph for one step: its input (token embeddings or the previous stage's hidden states),
//! each of its layers as the model's architecture declares it, and on the last stage the final norm and
//! the output head.

use super::blocks::{self, input, GraphShape, Parallel, StepContext};
use super::kv_cache::KvCache;
use super::parallel::Group;
use super::recurrent_state::RecurrentState;
use super::weights::StageWeights;
use crate::ggml::{DType, Graph, GraphBuilder, Tensor};
use crate::model::ModelConfig;
use std::ops::Range;

/// The parts of a stage a graph is built from.
pub(super) struct StageParts<'a> {
    pub config: &'a ModelConfig,
    pub layers: Range<usize>,
    pub weights: &'a StageWeights,
    pub cache: &'a KvCache,
    pub state: &'a RecurrentState,
    /// A tensor-parallel rank's group.
    pub group: Option<&'a Group>,
    /// Whether the stage computes on the CPU.
    pub on_cpu: bool,
}

/// Graph tensors per layer: about 40 for a dense layer, a mixture-of-experts layer adds one view and
/// one sum per chosen expert (and a dozen for group-limited routing), latent attention about 30; each
/// sequence of the step adds its attention's views, its attention and a concatenation; a dozen more
/// for weights widened before their products (on the CPU, see [`GraphBuilder::widen_many_row_products`]).
fn tensors_per_layer(config: &ModelConfig, segments: usize) -> usize {
    // A linear-attention layer adds about 30 per sequence of the step (its convolution and delta rule
    // run per sequence), and Kimi K3's separate Q/K/V projections a dozen; its mixes of residual
    // checkpoints about 30 more.
    let linear = config.linear_attention.as_ref().map_or(0, |_| 36 * segments + 56);
    // Sparse attention narrows each run's mask in about 16 ops (its indexer adds about 24 per layer);
    // MiniMax M3's block-sparse attention about 30 per run and 14 per key/value head of each run.
    let sparse = config.sparse_attention.as_ref().map_or(0, |_| 16 * segments + 24);
    let block_sparse = config.block_sparse.map_or(0, |_| (30 + 14 * config.kv_heads) * segments + 40);
    84 + config.moe.map_or(0, |m| 2 * m.experts_used + 56)
        + config.latent_attention.map_or(0, |_| 32)
        + config.residual_block.map_or(0, |_| 32)
        + 12 * segments
        + linear
        + sparse
        + block_sparse
}

pub(super) fn build(parts: &StageParts<'_>, shape: &GraphShape) -> Graph {
    let g = GraphBuilder::new(tensors_per_layer(parts.config, shape.segments.len()) * parts.layers.len() + 64);
    if parts.on_cpu {
        g.widen_many_row_products();
    }
    let out = forward(&g, parts, shape);
    let out = g.output(out);
    g.finish(out)
}

fn forward<'g>(g: &'g GraphBuilder, p: &StageParts<'_>, shape: &GraphShape) -> Tensor<'g> {
    let c = p.config;
    let graph = super::arch::graph(c.architecture);
    let t = shape.tokens as i64;
    let mut x = blocks::stage_input(g, p.weights.embedding.as_ref(), c.hidden_width(p.layers.start), t);
    if let (Some(scale), Some(_)) = (c.embedding_scale, &p.weights.embedding) {
        x = g.scale(x, scale);
    }
    let is_last = p.weights.output.is_some();
    let slides = p.layers.clone().any(|l| c.is_sliding(l));
    let sees_all = p.layers.clone().any(|l| !c.is_sliding(l) && !c.is_linear(l));
    let mask_len = |sliding| shape.mask_offsets(sliding).1 as i64;
    let rotations =
        if sees_all || slides { p.cache.kv_type().rotations(c.head_dim, c.value_dim) } else { (None, None) };
    let step = StepContext {
        config: c,
        layers: p.layers.clone(),
        cache: p.cache,
        state: p.state,
        shape: shape.clone(),
        rope_mode: c.architecture.declaration().rope_mode(),
        positions: g.input(input::POSITIONS, DType::I32, &[t]),
        position_sections: (c.rope_sections.is_some() && sees_all)
            .then(|| g.input(input::POSITION_SECTIONS, DType::I32, &[4 * t])),
        // Each only where a layer writes it: an input no node reads gets no memory.
        cache_rows: sees_all.then(|| g.input(input::CACHE_ROWS, DType::I64, &[t])),
        cache_rows_sliding: slides.then(|| g.input(input::CACHE_ROWS_SLIDING, DType::I64, &[t])),
        // Each mask only where a layer reads it: an input no node reads gets no memory. Each holds the
        // segments' masks one after the other ([attended, tokens] each).
        mask: sees_all.then(|| g.input(input::MASK, DType::F16, &[mask_len(false)])),
        mask_sliding: slides.then(|| g.input(input::MASK_SLIDING, DType::F16, &[mask_len(true)])),
        rope_factors: p.weights.rope_factors.as_ref().map(|f| g.stored(f)),
        // Only some rows' logits are wanted, so the model's last layer drops the other rows early.
        output_rows: (is_last && shape.outputs < shape.tokens)
            .then(|| g.input(input::OUTPUT_ROWS, DType::I32, &[shape.outputs as i64])),
        rotate_keys: rotations.0.map(|n| g.input(input::ROTATE_KEYS, DType::F32, &[n as i64, n as i64])),
        rotate_values: rotations.1.map(|n| g.input(input::ROTATE_VALUES, DType::F32, &[n as i64, n as i64])),
        rotate_indexer: c
            .sparse_attention
            .as_ref()
            .filter(|_| sees_all)
            .map(|s| g.input(input::ROTATE_INDEXER, DType::F32, &[s.width as i64, s.width as i64])),
        sparse_choices: Default::default(),
        parallel: p.group.map(|group| Parallel {
            slice: group.slice(),
            collective: group.collective(),
            on_cpu: p.on_cpu,
        }),
    };
    for (i, layer) in p.layers.clone().enumerate() {
        x = graph.layer(g, &step, layer, &p.weights.layers[i], x);
    }
    match (&p.weights.output_norm, &p.weights.output) {
        (Some(norm_weight), Some(head)) => {
            let x = graph.after_last_layer(g, &step, p.weights.output_mix.as_ref(), x);
            let h = blocks::norm(g, x, norm_weight, c.rms_epsilon);
            let logits = g.mul_mat_as_stored(g.stored(head), h);
            match c.logit_softcap {
                Some(cap) => g.scale(g.tanh(g.scale(logits, 1.0 / cap)), cap),
                None => logits,
            }
        }
        _ => x,
    }
}
