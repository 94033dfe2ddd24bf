//! Gemma 3 (`gemma3`): token embeddings scaled by √embedding; in each layer attention with per-head
//! Q/K norms whose Q is scaled before the product (and the product then left unscaled), norms after
//! the attention and after the feed-forward as well as before them, and a GELU-gated feed-forward.
//! Five of every six layers (or the file's own pattern) attend through a sliding window with their own
//! RoPE base; the others see the whole context.

use super::groups::{Attention, FeedForward};
use super::tensor_group::{tensor_group, Declared};
use super::Declare;
use crate::model::config::Keys;
use crate::model::{ModelConfig, ModelError};

pub struct Gemma3;

tensor_group! {
    /// A Gemma 3 layer.
    pub struct Gemma3Layer {
        attn_norm: tensor "attn_norm.weight",
        attention: group Attention,
        post_attention_norm: tensor "post_attention_norm.weight",
        ffn_norm: tensor "ffn_norm.weight",
        feed_forward: group FeedForward,
        post_ffw_norm: tensor "post_ffw_norm.weight",
    }
}

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

impl Declare for Gemma3 {
    type Layer = Gemma3Layer<Declared>;

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

    fn layer(&self, config: &ModelConfig, _layer: usize) -> Self::Layer {
        let norm = || Declared::new(&[config.embedding]);
        Gemma3Layer {
            attn_norm: norm(),
            attention: Attention::declare(config, Some(true)),
            post_attention_norm: norm(),
            ffn_norm: norm(),
            feed_forward: FeedForward::declare(config, config.feed_forward),
            post_ffw_norm: norm(),
        }
    }
}
