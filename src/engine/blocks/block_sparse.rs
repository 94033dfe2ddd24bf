//! MiniMax sparse attention (MiniMax M3's layers with experts), as llama.cpp's
//! `src/models/minimax-m3.cpp` computes a step of several tokens: the layer's queries, keys and values
//! as standard attention has them (Q and K normed per head, RoPE), an indexer key per position cached
//! beside the keys, and for each run of the step's segments and each key/value head, the causal mask
//! narrowed to the blocks of positions that head's indexer query scores best (a block scores its best
//! position) plus the blocks up to the query's own, through which that head's queries attend.

use super::sparse_attention::only_chosen;
use super::{attention::rope_params, concat_rows, linear, norm, AttentionParams, AttentionRun, StepContext};
use crate::ggml::{DType, GraphBuilder, SetTensorRef, Tensor};
use crate::model::arch::groups::Attention;
use crate::model::arch::BlockIndexer;
use std::ops::Range;

/// A layer's block-sparse self-attention over `x` (normed): the output projection's result.
pub fn block_sparse_attention<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &Attention<SetTensorRef>,
    indexer: &BlockIndexer<SetTensorRef>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let c = step.config;
    let sparse = c.block_sparse.expect("a block-sparse model reads its indexer parameters when it opens");
    // A tensor-parallel rank computes its query and key/value heads and their indexer queries.
    let (hd, t, heads, kv_heads) = (c.head_dim as i64, step.tokens(), step.heads() as i64, step.kv_heads() as i64);
    let local = layer - step.layers.start;
    let rope = rope_params(step, &AttentionParams::of(c, layer));
    let turn = |x: Tensor<'g>| g.rope(x, step.positions, step.rope_factors, &rope);
    let q = norm(
        g,
        g.reshape_3d(linear(g, &w.q, None, x), hd, heads, t),
        w.q_norm.as_ref().expect("MiniMax M3 declares its per-head Q norm as required"),
        c.rms_epsilon,
    );
    let k = norm(
        g,
        g.reshape_3d(linear(g, &w.k, None, x), hd, kv_heads, t),
        w.k_norm.as_ref().expect("MiniMax M3 declares its per-head K norm as required"),
        c.rms_epsilon,
    );
    let v = g.reshape_3d(linear(g, &w.v, None, x), hd, kv_heads, t);
    let (q, k) = (turn(q), turn(k));
    let width = sparse.width as i64;
    let index_q =
        norm(g, g.reshape_3d(g.mul_mat(g.stored(&indexer.q), x), width, kv_heads, t), &indexer.q_norm, c.rms_epsilon);
    let index_k =
        norm(g, g.reshape_3d(g.mul_mat(g.stored(&indexer.k), x), width, 1, t), &indexer.k_norm, c.rms_epsilon);
    let (index_q, index_k) = (turn(index_q), turn(index_k));

    let k_rows = g.concat(g.reshape_2d(g.cont(k), hd * kv_heads, t), g.reshape_2d(index_k, width, t), 0);
    let v_rows = g.reshape_2d(g.cont(v), hd * kv_heads, t);
    let rows = step.cache_rows.expect("a stage with global layers has their cache rows");
    step.cache.store(g, local, k_rows, Some(v_rows), rows);

    let mask = step.mask.expect("the stage's graph has the causal mask");
    let parts: Vec<Tensor<'g>> = step
        .shape
        .located_runs(false)
        .iter()
        .map(|run| {
            let first = step.shape.segments[run.segments.start];
            let (rt, n, attended) = (first.tokens, run.segments.len(), first.attended);
            let mask_bytes = attended * rt * 2;
            let run_mask = g.view(
                mask,
                &[attended as i64, rt as i64, 1, n as i64],
                &[attended * 2, mask_bytes, mask_bytes],
                run.mask * 2,
            );
            let blocks = chosen_blocks(g, step, run, index_q, local, run_mask);
            attend_by_head(g, step, run, q, local, run_mask, blocks)
        })
        .collect();
    let merged = g.reshape_2d(concat_rows(g, &parts), hd * heads, t);
    step.complete(g, g.mul_mat(g.stored(&w.output), merged))
}

/// For the run's rows, each key/value head's positions mask: 0 in the blocks its indexer query scores
/// best and the blocks up to the row's own position, -∞ elsewhere; [attended, kv_heads, tokens,
/// sequences] (F32), before the causal mask.
fn chosen_blocks<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    run: &AttentionRun,
    index_q: Tensor<'g>,
    layer: usize,
    run_mask: Tensor<'g>,
) -> Tensor<'g> {
    let c = step.config;
    let sparse = c.block_sparse.expect("a block-sparse model reads its indexer parameters when it opens");
    let first = step.shape.segments[run.segments.start];
    let (t, n, attended) = (first.tokens as i64, run.segments.len() as i64, first.attended as i64);
    let [width, kv_heads, ..] = index_q.shape();
    let block = sparse.block as i64;
    let blocks = attended / block;
    // Every cached position's indexer key, as F32 (llama.cpp gathers them from the F16 cache so).
    let keys = step.cache.indexer_view(g, layer, first.seq..first.seq + n as usize, attended as usize);
    let keys = g.reshape_4d(g.cast(keys, DType::F32), [width, attended, 1, n]);
    let st = index_q.strides();
    let queries = g.view(
        index_q,
        &[width, kv_heads * t, 1, n],
        &[st[1], t as usize * st[2], t as usize * st[2]],
        run.row * st[2],
    );
    let queries = g.cont(queries);
    let scores = g.reshape_4d(g.mul_mat(keys, queries), [attended, kv_heads, t, n]);
    // Positions a row may not see score -∞ (the causal mask, the same for every head).
    let visible = g.reshape_4d(g.cast(g.cont(run_mask), DType::F32), [attended, 1, t, n]);
    let scores = g.add(scores, visible);
    let best = g.max_pool_rows(scores, block as usize); // [blocks, kv_heads, t, n]
    let best = g.add(best, local_blocks(g, step, run, blocks, sparse.block, sparse.local_blocks));
    let kept = sparse.top_blocks.min(blocks as usize) as i64;
    let chosen = g.top_k(best, kept); // I32 [kept, kv_heads, t, n]
    let rows = kv_heads * t * n;
    let opened = g.reshape_4d(only_chosen(g, best, chosen), [1, blocks, rows, 1]);
    // Each block's value over its positions.
    let by_position = g.repeat(opened, [block, blocks, rows, 1]);
    g.reshape_4d(by_position, [attended, kv_heads, t, n])
}

/// 10³⁰ in each row's blocks from its own back over `local` blocks (so they always rank first), else
/// 0: [blocks, 1, tokens, sequences].
fn local_blocks<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    run: &AttentionRun,
    blocks: i64,
    block: usize,
    local: usize,
) -> Tensor<'g> {
    let first = step.shape.segments[run.segments.start];
    let (t, n) = (first.tokens as i64, run.segments.len() as i64);
    let positions = g.view(step.positions, &[t * n], &[], run.row * 4);
    let own = g.floor(g.scale(g.cast(g.cont(positions), DType::F32), 1.0 / block as f32)); // [t · n]
    let own = g.repeat(g.reshape_2d(own, 1, t * n), [blocks, t * n, 1, 1]);
    // How many blocks back each block is from the row's own: 0 for its own.
    let back = g.sub(own, g.arange(blocks as usize));
    let near = g.mul(g.step(g.scale_bias(back, 1.0, 0.5)), g.step(g.scale_bias(back, -1.0, local as f32 - 0.5)));
    g.reshape_4d(g.scale(near, 1e30), [blocks, 1, t, n])
}

/// Each key/value head's queries of the run over its cached keys and values, through the causal mask
/// plus that head's chosen blocks; [head, heads, tokens · sequences]. On a tensor-parallel rank, its
/// key/value heads and the query heads it holds of each.
fn attend_by_head<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    run: &AttentionRun,
    q: Tensor<'g>,
    layer: usize,
    run_mask: Tensor<'g>,
    blocks: Tensor<'g>,
) -> Tensor<'g> {
    let c = step.config;
    let first = step.shape.segments[run.segments.start];
    let (t, n, attended) = (first.tokens as i64, run.segments.len() as i64, first.attended);
    let hd = c.head_dim as i64;
    let (k, v) = step.cache.view(g, layer, first.seq..first.seq + n as usize, attended, c.head_dim, c.head_dim);
    let q_st = q.strides();
    let causal = g.cast(g.cont(run_mask), DType::F32); // [attended, t, 1, n]
    let b_st = blocks.strides();
    // Which query heads read each key/value head (of this graph's; a rank may hold part of a group).
    let groups: Vec<(usize, Range<usize>)> = step
        .head_runs()
        .into_iter()
        .flat_map(|(heads, kv)| {
            let per = heads.len() / kv.len();
            kv.clone().map(move |h| (h, heads.start + (h - kv.start) * per..heads.start + (h - kv.start + 1) * per))
        })
        .collect();
    let outputs: Vec<Tensor<'g>> = groups
        .into_iter()
        .map(|(h, reading)| {
            let queries = g.view(
                q,
                &[hd, reading.len() as i64, t, n],
                &[q_st[1], q_st[2], t as usize * q_st[2]],
                reading.start * q_st[1] + run.row * q_st[2],
            );
            let of_head = |x: Tensor<'g>| {
                let st = x.strides();
                g.view(x, &[hd, 1, attended as i64, n], &[st[1], st[2], st[3]], h * st[1])
            };
            let head_blocks = g.view(blocks, &[attended as i64, t, 1, n], &[b_st[2], b_st[3], b_st[3]], h * b_st[1]);
            let mask = g.cast(g.add(g.cont(head_blocks), causal), DType::F16);
            let perm = |x: Tensor<'g>| g.permute(x, [0, 2, 1, 3]);
            let scale = 1.0 / (c.head_dim as f32).sqrt();
            // [hd, the group's query heads, t, n]
            g.flash_attention(perm(queries), perm(of_head(k)), perm(of_head(v)), mask, scale)
        })
        .collect();
    let joined = outputs.into_iter().reduce(|a, b| g.concat(a, b, 1)).expect("a graph holds a key/value head");
    g.reshape_3d(joined, hd, step.heads() as i64, t * n)
}
