//! Gemma 3 (`gemma3`), as llama.cpp's `src/models/gemma3.cpp` computes it: token embeddings scaled by
//! √embedding; in each layer attention with per-head Q/K norms whose Q is scaled before the product
//! (and the product then left unscaled), norms after the attention and after the feed-forward as well
//! as before them, and a GELU-gated feed-forward. Five of every six layers (or the file's own pattern)
//! attend through a sliding window with their own RoPE base; the others see the whole context.

use super::ArchSpec;
use crate::engine::blocks::{self, Activation, AttentionParams, StepContext};
use crate::engine::weights::LayerWeights;
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::config::Keys;
use crate::model::layout::{self, ExpectedTensor};
use crate::model::{ModelConfig, ModelError};

pub struct Gemma3;

pub static GEMMA3: Gemma3 = Gemma3;

/// Gemma's turns, for files without a template: no system role (a system message opens the first user
/// turn), the assistant is `model`. The tokenizer adds the BOS token itself.
const CHAT_TEMPLATE: &str = "{%- if messages and messages[0].role == 'system' -%}\
{%- set prefix = messages[0].content ~ '\n\n' -%}{%- set turns = messages[1:] -%}\
{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}\
{%- for m in turns -%}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n\
{{ (prefix if loop.first else '') ~ (m.content | trim) }}<end_of_turn>\n{% endfor -%}\
{%- if add_generation_prompt -%}<start_of_turn>model\n{% endif -%}";

/// Gemma 3's default: every sixth layer is global.
const DEFAULT_PATTERN: usize = 6;

impl ArchSpec for Gemma3 {
    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        config.sliding_window = super::sliding_window(keys, config, DEFAULT_PATTERN, 10_000.0)?;
        config.embedding_scale = Some((config.embedding as f32).sqrt());
        config.logit_softcap =
            keys.arch_optional_float("final_logit_softcapping")?.filter(|&c| c != 0.0).map(|c| c as f32);
        // Gemma 3 27B (62 layers) scales by the width per head of the embedding, the others by the head size.
        config.attention_scale = if config.layers == 62 {
            1.0 / ((config.embedding / config.heads) as f32).sqrt()
        } else {
            1.0 / (config.head_dim as f32).sqrt()
        };
        Ok(())
    }

    fn rope_mode(&self) -> i32 {
        2
    }

    fn default_chat_template(&self) -> Option<&'static str> {
        Some(CHAT_TEMPLATE)
    }

    fn layer_tensors(&self, config: &ModelConfig, layer: usize) -> Vec<ExpectedTensor> {
        let e = config.embedding;
        let mut list = layout::attention_tensors(config, layer, Some(true));
        list.push(ExpectedTensor::layer(layer, "post_attention_norm.weight", &[e], true));
        list.push(ExpectedTensor::layer(layer, "ffn_norm.weight", &[e], true));
        list.extend(layout::feed_forward_tensors(config, layer, "", config.feed_forward));
        list.push(ExpectedTensor::layer(layer, "post_ffw_norm.weight", &[e], true));
        list
    }

    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &LayerWeights,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let eps = c.rms_epsilon;
        let params =
            AttentionParams { q_scale: Some(c.attention_scale), kq_scale: 1.0, ..AttentionParams::of(c, layer) };
        let h = blocks::attention(g, step, layer, w, blocks::norm(g, x, w.req("attn_norm.weight"), eps), &params);
        let (h, residual) = step.prune_last_layer(g, layer, h, x);
        let h = blocks::norm(g, h, w.req("post_attention_norm.weight"), eps);
        let attended = g.add(h, residual);
        let h = blocks::norm(g, attended, w.req("ffn_norm.weight"), eps);
        let h = blocks::gated_feed_forward(g, step, w, "", h, Activation::Gelu);
        let h = blocks::norm(g, h, w.req("post_ffw_norm.weight"), eps);
        g.add(h, attended)
    }
}
