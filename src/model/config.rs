//! A model's architecture and hyper-parameters, read from GGUF metadata with llama.cpp's defaults.

use super::gguf::{GgufFile, Value};
pub use super::linear_attention::LinearAttention;
use super::ModelError;

/// The model families the engine can run. All are decoder-only transformers with RMSNorm, RoPE,
/// grouped-query attention and a SwiGLU feed-forward block; they differ in the details below.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama 2 and 3, Mistral 7B, SmolLM 1 and 2 (GGUF architecture `llama`).
    Llama,
    /// Qwen 2 and 2.5: NeoX RoPE and biases on Q, K and V.
    Qwen2,
    /// Qwen 3 (dense): NeoX RoPE and an RMSNorm on each head of Q and K.
    Qwen3,
    /// Qwen 3 mixture-of-experts (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen 3 attention, every layer's
    /// feed-forward a softmax-routed set of experts.
    #[serde(rename = "qwen3moe")]
    Qwen3Moe,
    /// GLM-4.5/4.6/4.7 (`glm4moe`): leading dense layers, sigmoid-routed experts with a selection bias
    /// and a shared expert, partial RoPE, biases on Q, K and V.
    #[serde(rename = "glm4moe")]
    Glm4Moe,
    /// GLM-5 / 5.1 / 5.2 (`glm-dsa`): DeepSeek V3.2's sparse latent attention (GLM-5.2: only some layers
    /// with an indexer of their own), sigmoid-routed experts.
    #[serde(rename = "glm-dsa")]
    GlmDsa,
    /// Gemma 3 (270M to 27B, text): sliding-window and global layers, norms before and after attention
    /// and feed-forward, GELU, scaled embeddings.
    Gemma3,
    /// DeepSeek V2/V3, Kimi K2 (`deepseek2`): multi-head latent attention, leading dense layers, routed
    /// experts (grouped, sigmoid or softmax) and shared experts.
    Deepseek2,
    /// DeepSeek V3.2 (`deepseek32`): DeepSeek V3 with sparse attention, each query attending to the
    /// positions a lightning indexer scores highest.
    Deepseek32,
    /// OpenAI's gpt-oss 20B and 120B (`gpt-oss`): attention sinks, alternating sliding-window layers,
    /// biased experts with a clamped SwiGLU, usually in MXFP4.
    #[serde(rename = "gpt-oss")]
    GptOss,
    /// Qwen3.5 / 3.6 dense (`qwen35`): three gated delta-net (linear attention) layers to one of gated
    /// full attention with interleaved M-RoPE, norms before attention and feed-forward.
    Qwen35,
    /// Qwen3.5 / 3.6 mixture-of-experts (`qwen35moe`): Qwen3.5's layers with softmax-routed experts and
    /// a shared expert behind a sigmoid gate.
    #[serde(rename = "qwen35moe")]
    Qwen35Moe,
    /// Qwen3-Next (`qwen3next`): Qwen3.5's hybrid layers before it, with value heads grouped by key
    /// head, fused beta/alpha projections, partial NeoX RoPE, and experts plus a gated shared expert in
    /// every layer.
    Qwen3Next,
    /// Kimi K3 (`kimi-k3`): Kimi delta attention (linear, with a decay per key channel) between layers
    /// of gated latent attention without RoPE, attention over earlier layers' residual checkpoints,
    /// the situ activation, and routed experts that run in a narrower latent width.
    #[serde(rename = "kimi-k3")]
    KimiK3,
    /// MiniMax M2 / M2.1 / M2.5 (`minimax-m2`): grouped-query attention with Q and K normed across all
    /// heads at once and RoPE on part of each head, sigmoid-routed experts with a selection bias.
    #[serde(rename = "minimax-m2")]
    MinimaxM2,
    /// MiniMax M3 (`minimax-m3`): MiniMax M2's attention with Q and K normed per head and, after the
    /// leading dense layers, sparse by blocks of positions; swigluoai experts plus a shared expert.
    #[serde(rename = "minimax-m3")]
    MinimaxM3,
}

impl Architecture {
    pub const SUPPORTED: &'static str = "llama (Llama 2/3, Mistral, SmolLM), qwen2, qwen3, qwen3moe, glm4moe, glm-dsa (GLM-5), gemma3, deepseek2 (DeepSeek V2/V3, Kimi K2), deepseek32 (DeepSeek V3.2), gpt-oss, qwen35 and qwen35moe (Qwen3.5/3.6), qwen3next (Qwen3-Next), kimi-k3 (Kimi K3), minimax-m2 (MiniMax M2), minimax-m3 (MiniMax M3)";

    pub fn from_gguf_name(name: &str) -> Option<Architecture> {
        match name {
            "llama" => Some(Architecture::Llama),
            "qwen2" => Some(Architecture::Qwen2),
            "qwen3" => Some(Architecture::Qwen3),
            "qwen3moe" => Some(Architecture::Qwen3Moe),
            "glm4moe" => Some(Architecture::Glm4Moe),
            "glm-dsa" => Some(Architecture::GlmDsa),
            "gemma3" => Some(Architecture::Gemma3),
            "deepseek2" => Some(Architecture::Deepseek2),
            "deepseek32" => Some(Architecture::Deepseek32),
            "gpt-oss" => Some(Architecture::GptOss),
            "qwen35" => Some(Architecture::Qwen35),
            "qwen35moe" => Some(Architecture::Qwen35Moe),
            "qwen3next" => Some(Architecture::Qwen3Next),
            "kimi-k3" => Some(Architecture::KimiK3),
            "minimax-m2" => Some(Architecture::MinimaxM2),
            "minimax-m3" => Some(Architecture::MinimaxM3),
            _ => None,
        }
    }

    /// The name GGUF uses, which also prefixes the architecture's metadata keys.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::Glm4Moe => "glm4moe",
            Architecture::GlmDsa => "glm-dsa",
            Architecture::Gemma3 => "gemma3",
            Architecture::Deepseek2 => "deepseek2",
            Architecture::Deepseek32 => "deepseek32",
            Architecture::GptOss => "gpt-oss",
            Architecture::Qwen35 => "qwen35",
            Architecture::Qwen35Moe => "qwen35moe",
            Architecture::Qwen3Next => "qwen3next",
            Architecture::KimiK3 => "kimi-k3",
            Architecture::MinimaxM2 => "minimax-m2",
            Architecture::MinimaxM3 => "minimax-m3",
        }
    }

    /// What the architecture declares: its own metadata, tensors and caches.
    pub fn declaration(self) -> &'static dyn super::arch::Declaration {
        super::arch::declaration(self)
    }
}

/// How positions are encoded.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct RopeConfig {
    pub dimensions: u32,
    pub freq_base: f32,
    /// 1 / the scaling factor (linear or YaRN).
    pub freq_scale: f32,
    pub original_context: u32,
    /// YaRN: 1 when the model uses YaRN scaling, else 0 (ggml's `ext_factor`).
    pub ext_factor: f32,
    /// The magnitude correction ggml's RoPE multiplies by (`attn_factor`, as llama.cpp computes it).
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

impl RopeConfig {
    /// The YaRN magnitude scale for a context stretched `factor` times with the coefficient `mscale`
    /// (DeepSeek's `yarn_get_mscale`).
    pub fn yarn_mscale(factor: f32, mscale: f32) -> f32 {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * mscale * factor.ln() + 1.0
        }
    }

    /// ggml's `attn_factor`, as llama.cpp sets it: under YaRN the ratio of the two magnitude scales
    /// (`mscale` and `mscale_all_dims`: 1 and 0 unless the model says otherwise) with the scale ggml's
    /// RoPE applies by itself cancelled; times the file's own `rope.scaling.attn_factor`.
    pub fn yarn_attn_factor(&self, mscale: f32, mscale_all_dims: f32, file_factor: f32) -> f32 {
        if self.ext_factor == 0.0 {
            return file_factor;
        }
        let factor = 1.0 / self.freq_scale;
        let ratio = Self::yarn_mscale(factor, mscale) / Self::yarn_mscale(factor, mscale_all_dims);
        ratio / (1.0 + 0.1 * factor.ln()) * file_factor
    }
}

/// What one layer's KV cache holds per position: F16 keys `key_width` wide and values `value_width` wide,
/// or, with `values_in_keys`, no values of their own: they are the first `value_width` of each key row
/// (DeepSeek's latent attention caches one compressed latent that serves as both). A sliding-window
/// layer (`window`) needs only its window's positions, not the whole context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CacheRow {
    pub key_width: usize,
    pub value_width: usize,
    pub values_in_keys: bool,
    pub window: Option<usize>,
    /// The last this many values of each key row are the lightning indexer's key (DeepSeek V3.2), not
    /// attention's: attention reads the `key_width - indexer_width` before them.
    pub indexer_width: usize,
}

impl CacheRow {
    /// Bytes one position takes in this layer's cache.
    pub fn bytes_per_position(&self) -> u64 {
        let values = if self.values_in_keys { 0 } else { self.value_width };
        2 * (self.key_width + values) as u64
    }
}

/// Multi-head latent attention (DeepSeek V2/V3, Kimi K2): queries through an optional low-rank
/// bottleneck, keys and values compressed into one latent of `kv_lora_rank` values per position plus a
/// shared rotary part.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct LatentAttention {
    /// Rank of the query bottleneck (`attn_q_a` → `attn_q_b`); 0: one plain `attn_q`.
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    /// Per head, the query/key width (the part without RoPE plus the rotary part) and the value width.
    pub key_head: usize,
    pub value_head: usize,
    /// The split `attn_k_b`/`attn_v_b` form: attention runs over the cached latent itself (the cache
    /// holds `kv_lora_rank` + rotary values per position for all heads). Otherwise the older combined
    /// `attn_kv_b` expands full keys and values per head, and the cache holds those.
    pub absorbed: bool,
    /// YaRN's `mscale_all_dim` (`rope.scaling.yarn_log_multiplier` / 0.1), which also scales attention.
    pub yarn_log_multiplier: f32,
}

/// Hyper-parameters of a llama-family model.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub layers: usize,
    pub embedding: usize,
    pub feed_forward: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Width of one head's values (the key width unless the architecture allows otherwise).
    pub value_dim: usize,
    pub rms_epsilon: f32,
    /// Attention logit scale; 1/√head_dim unless the model sets one.
    pub attention_scale: f32,
    pub rope: RopeConfig,
    pub training_context: usize,
    pub vocabulary: usize,
    /// The mixture-of-experts feed-forward, for architectures that have one.
    pub moe: Option<MoeParams>,
    /// Layers that attend only to the most recent positions (Gemma 3), if any.
    pub sliding_window: Option<SlidingWindow>,
    /// The token embeddings are multiplied by this (Gemma: √embedding).
    pub embedding_scale: Option<f32>,
    /// Logits are squashed to ±this by tanh (Gemma 2).
    pub logit_softcap: Option<f32>,
    /// Multi-head latent attention (DeepSeek), for the architectures that have it.
    pub latent_attention: Option<LatentAttention>,
    /// Layers the file holds after the model's own (GLM's next-token-prediction layers): neither
    /// loaded nor counted.
    pub skipped_layers: usize,
    /// Linear attention with a recurrent state in some layers (Qwen3.5), for the architectures that
    /// have it.
    pub linear_attention: Option<LinearAttention>,
    /// RoPE by position sections (`rope.dimension_sections`, Qwen3.5's interleaved M-RoPE): how many
    /// rotated pairs each of the four sections turns.
    pub rope_sections: Option<[i32; 4]>,
    /// Attention over residual checkpoints (Kimi K3's `attn_res.block_size`): every this many layers the
    /// layer's input is banked, and each layer's input and feed-forward input are a learned mix of the
    /// banked inputs and the running stream. `None`: the plain residual stream.
    pub residual_block: Option<usize>,
    /// The width routed experts compute in, when narrower than the embedding (Kimi K3's
    /// `expert_latent_length`: projected down before the experts and back up after).
    pub expert_latent: Option<usize>,
    /// DeepSeek sparse attention's lightning indexer (DeepSeek V3.2), for the architectures that have it.
    pub sparse_attention: Option<SparseAttention>,
    /// MiniMax sparse attention by blocks of positions (MiniMax M3), in the layers with experts.
    pub block_sparse: Option<BlockSparseAttention>,
}

/// MiniMax sparse attention (MiniMax M3): positions come in blocks of `block`; an indexer head per
/// key/value head scores each cached position for each query over one key per position (`width` wide,
/// cached beside the layer's keys), a block scores its best position, and each key/value head's
/// queries attend only to the `top_blocks` best blocks and the `local_blocks` blocks up to their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BlockSparseAttention {
    pub width: usize,
    pub block: usize,
    pub top_blocks: usize,
    pub local_blocks: usize,
}

/// DeepSeek sparse attention: a lightning indexer scores every cached position for each query with
/// `heads` small heads of `width` over one key per position (cached beside the layer's latent), and
/// the query attends only to the `top_k` positions it scores highest.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SparseAttention {
    pub heads: usize,
    pub width: usize,
    pub top_k: usize,
    /// ggml's RoPE mode of the indexer's queries and keys (DeepSeek V3.2: NeoX, 2; GLM-5: 0).
    pub rope_mode: i32,
    /// Per layer, whether it has an indexer of its own; a layer without one attends to the positions
    /// the last layer before it with one chose (GLM-5.2). Empty: every layer has its own.
    pub own_indexer: Vec<bool>,
}

impl SparseAttention {
    /// Whether layer `layer` has an indexer of its own (else it reuses the last choice before it).
    pub fn has_indexer(&self, layer: usize) -> bool {
        self.own_indexer.get(layer).copied().unwrap_or(true)
    }
}

/// Sliding-window attention: which layers look back only `size` positions, and the RoPE those layers use.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SlidingWindow {
    /// A position sees the positions less than `size` before it (and itself).
    pub size: usize,
    /// For each layer: whether it slides (the others attend to the whole context).
    pub layers: Vec<bool>,
    pub freq_base: f32,
    pub freq_scale: f32,
}

impl ModelConfig {
    /// Values per token of the hidden state entering layer `layer` (`layers` for the state after the
    /// last): the embedding, plus one embedding-wide residual checkpoint per banked layer before it when
    /// the model mixes checkpoints ([`ModelConfig::residual_block`]). This is what a pipeline sends
    /// between stages.
    pub fn hidden_width(&self, layer: usize) -> usize {
        self.embedding * (1 + self.residual_checkpoints(layer))
    }

    /// Residual checkpoints banked before layer `layer`: its inputs of layers 0, block, 2·block, ….
    pub fn residual_checkpoints(&self, layer: usize) -> usize {
        self.residual_block.map_or(0, |block| layer.div_ceil(block))
    }

    /// Whether `layer` attends through a sliding window.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding_window.as_ref().is_some_and(|w| w.layers.get(layer).copied().unwrap_or(false))
    }
}

/// How a router's logits become expert weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Gating {
    /// Softmax over all experts; the chosen experts keep their share.
    Softmax,
    /// A sigmoid per expert.
    Sigmoid,
    /// The raw logits choose; a softmax over the chosen experts' logits weighs them (gpt-oss).
    #[serde(rename = "softmax_weight")]
    SoftmaxWeight,
}

/// The activation of the experts' gated feed-forward.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertActivation {
    /// SwiGLU.
    Silu,
    /// gpt-oss's clamped SwiGLU (α 1.702, limit 7).
    SwigluOai,
    /// Kimi K3's situ: `β·tanh(gate/β)·σ(gate) · λ·tanh(up/λ)` (the up branch untouched when λ ≤ 0).
    Situ { beta: f32, linear_beta: f32 },
}

/// A mixture-of-experts feed-forward's hyper-parameters (llama.cpp's `build_moe_ffn` arguments).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct MoeParams {
    /// Experts per layer.
    pub experts: usize,
    /// Experts each token is routed to.
    pub experts_used: usize,
    /// Inner width of one expert.
    pub expert_feed_forward: usize,
    pub gating: Gating,
    pub activation: ExpertActivation,
    /// Divide the chosen experts' weights by their sum.
    pub normalize: bool,
    /// Multiply the weights by this (0 or 1: unscaled).
    pub scale: f32,
    /// Experts every token goes through besides the routed ones (`ffn_*_shexp`, one dense
    /// feed-forward `shared_experts` experts wide).
    pub shared_experts: usize,
    /// The first layers have a dense feed-forward instead (GLM-4.5, DeepSeek V3).
    pub leading_dense_layers: usize,
    /// Group-limited routing (DeepSeek V3): experts come in groups, and a token's experts are chosen
    /// only from its best groups.
    pub groups: Option<ExpertGroups>,
}

/// Experts split into `count` equal groups; each token picks its `used` best groups (a group's score is
/// the sum of its two best experts' scores), then its experts among those.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ExpertGroups {
    pub count: usize,
    pub used: usize,
}

impl MoeParams {
    /// Qwen's routing (Qwen 3 MoE, Qwen3.5 MoE, Qwen3-Next): softmax gates, SiLU-gated experts, the
    /// chosen experts' weights normalized, then multiplied by `scale` (0: unscaled); no leading dense
    /// layers, no expert groups, no shared experts counted here (the shared expert is its own tensors).
    pub fn qwen(experts: usize, experts_used: usize, expert_feed_forward: usize, scale: f32) -> MoeParams {
        MoeParams {
            experts,
            experts_used,
            expert_feed_forward,
            gating: Gating::Softmax,
            activation: ExpertActivation::Silu,
            normalize: true,
            scale,
            shared_experts: 0,
            leading_dense_layers: 0,
            groups: None,
        }
    }

    /// Whether `layer` routes its tokens to experts (or is one of the leading dense layers).
    pub fn is_sparse(&self, layer: usize) -> bool {
        layer >= self.leading_dense_layers
    }
}

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile, has_tensor: &dyn Fn(&str) -> bool) -> Result<ModelConfig, ModelError> {
        let arch_name = Keys { file, arch: String::new(), has_tensor }.string("general.architecture")?;
        let keys = Keys { file, arch: arch_name.clone(), has_tensor };
        let architecture = Architecture::from_gguf_name(&arch_name).ok_or_else(|| {
            ModelError::UnsupportedArchitecture { path: file.path().into(), architecture: arch_name.clone() }
        })?;
        let p = |key: &str| keys.arch_key(key);
        let layers = keys.count(&p("block_count"))?;
        let embedding = keys.count(&p("embedding_length"))?;
        // A mixture-of-experts file may lack the dense width when no layer is dense (Qwen3.5-MoE): its
        // architecture reads the shared expert's width instead.
        let feed_forward = match keys.optional_count(&p("feed_forward_length"))? {
            Some(width) => width,
            None if matches!(
                architecture,
                Architecture::Qwen35Moe | Architecture::Qwen3Next | Architecture::KimiK3
            ) =>
            {
                0
            }
            None => return Err(keys.missing(&p("feed_forward_length"))),
        };
        let heads = keys.count(&p("attention.head_count"))?;
        // Per layer in hybrid files (Kimi K3: 0 marks a linear layer): the attention layers' count.
        let kv_heads = match keys.arch_integers("attention.head_count_kv") {
            Some(per_layer) => match per_layer.iter().copied().filter(|&n| n > 0).max() {
                Some(n) if per_layer.iter().all(|&k| k == 0 || k == n) && n <= heads as u64 => n as usize,
                _ => {
                    return Err(keys.invalid(
                        &p("attention.head_count_kv"),
                        "varies between attention layers (or has none), which this engine does not support",
                    ))
                }
            },
            None => keys.optional_count(&p("attention.head_count_kv"))?.unwrap_or(heads),
        };
        let head_dim = match keys.optional_count(&p("attention.key_length"))? {
            Some(d) => d,
            None if embedding % heads == 0 => embedding / heads,
            None => return Err(keys.invalid(&p("attention.head_count"), "does not divide the embedding length")),
        };
        let value_dim = keys.optional_count(&p("attention.value_length"))?.unwrap_or(head_dim);
        if value_dim != head_dim && !architecture.declaration().values_may_differ() {
            return Err(keys.invalid(
                &p("attention.value_length"),
                "differs from the key length, which this engine does not support",
            ));
        }
        if heads % kv_heads != 0 {
            return Err(keys.invalid(&p("attention.head_count_kv"), "does not divide the number of attention heads"));
        }
        let rms_epsilon = keys.float(&p("attention.layer_norm_rms_epsilon"))? as f32;
        let training_context = keys.count(&p("context_length"))?;
        let rope_dims = keys.optional_count(&p("rope.dimension_count"))?.unwrap_or(head_dim);
        if rope_dims > head_dim || (rope_dims != head_dim && !architecture.declaration().partial_rotary()) {
            return Err(keys.invalid(
                &p("rope.dimension_count"),
                "differs from the head size, which this engine does not support",
            ));
        }
        let freq_base = keys.optional_float(&p("rope.freq_base"))?.unwrap_or(10_000.0) as f32;
        let scaling = match file.get(&p("rope.scaling.type")) {
            None => "none".to_string(),
            Some(v) => v.as_str().ok_or_else(|| keys.wrong_type(&p("rope.scaling.type"), "string", v))?.to_string(),
        };
        let factor = keys.optional_float(&p("rope.scaling.factor"))?.unwrap_or(1.0);
        let (freq_scale, ext_factor) = match scaling.as_str() {
            "none" => (1.0, 0.0),
            "linear" if factor > 0.0 => ((1.0 / factor) as f32, 0.0),
            "yarn" if factor > 0.0 => ((1.0 / factor) as f32, 1.0),
            other => {
                return Err(keys.invalid(
                    &p("rope.scaling.type"),
                    &format!("is {other:?} with factor {factor}; only none, linear and yarn scaling are supported"),
                ))
            }
        };
        let file_attn_factor = keys.optional_float(&p("rope.scaling.attn_factor"))?.unwrap_or(1.0) as f32;
        let original_context =
            keys.optional_count(&p("rope.scaling.original_context_length"))?.unwrap_or(training_context);
        let attention_scale = match keys.optional_float(&p("attention.scale"))? {
            Some(s) if s != 0.0 => s as f32,
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let vocabulary = match keys.optional_count(&p("vocab_size"))? {
            Some(n) => n,
            None => match file.get("tokenizer.ggml.tokens") {
                Some(Value::Array(tokens)) => tokens.len(),
                _ => {
                    return Err(ModelError::MissingKey {
                        path: file.path().into(),
                        key: "tokenizer.ggml.tokens".into(),
                    })
                }
            },
        };
        let mut config = ModelConfig {
            architecture,
            layers,
            embedding,
            feed_forward,
            heads,
            kv_heads,
            head_dim,
            value_dim,
            rms_epsilon,
            attention_scale,
            rope: RopeConfig {
                dimensions: rope_dims as u32,
                freq_base,
                freq_scale,
                original_context: original_context as u32,
                ext_factor,
                attn_factor: 1.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
            },
            training_context,
            vocabulary,
            moe: None,
            sliding_window: None,
            embedding_scale: None,
            logit_softcap: None,
            latent_attention: None,
            skipped_layers: 0,
            linear_attention: None,
            rope_sections: None,
            residual_block: None,
            expert_latent: None,
            sparse_attention: None,
            block_sparse: None,
        };
        config.rope.attn_factor = config.rope.yarn_attn_factor(1.0, 0.0, file_attn_factor);
        architecture.declaration().hyper_parameters(&keys, &mut config)?;
        Ok(config)
    }

    /// What layer `layer` caches per position, as its architecture declares, and its sliding window.
    pub fn cache_row(&self, layer: usize) -> CacheRow {
        if self.is_linear(layer) {
            // A linear layer keeps a recurrent state per sequence instead (`linear_state_bytes`).
            return CacheRow { key_width: 0, value_width: 0, values_in_keys: false, window: None, indexer_width: 0 };
        }
        let window = self.sliding_window.as_ref().filter(|_| self.is_sliding(layer)).map(|w| w.size);
        CacheRow { window, ..self.architecture.declaration().cache_row(self, layer) }
    }

    /// Whether a pipeline stage may begin at `layer`: not at a sparse-attention layer that reuses the
    /// positions an earlier layer's indexer chose (GLM-5.2), since the choice does not cross stages.
    pub fn may_begin_stage(&self, layer: usize) -> bool {
        self.sparse_attention.as_ref().is_none_or(|s| s.has_indexer(layer))
    }

    /// Whether `layer` is a linear-attention layer with a recurrent state.
    pub fn is_linear(&self, layer: usize) -> bool {
        self.linear_attention.as_ref().is_some_and(|l| l.is_linear(layer))
    }

    /// Bytes one sequence's recurrent state takes in `layer` (0 unless it is linear).
    pub fn linear_state_bytes(&self, layer: usize) -> u64 {
        match &self.linear_attention {
            Some(l) if l.is_linear(layer) => l.state_bytes(),
            _ => 0,
        }
    }

    /// Keys and values of every head, one row each per position: the usual cache.
    pub fn standard_cache_row(&self) -> CacheRow {
        CacheRow {
            key_width: self.kv_heads * self.head_dim,
            value_width: self.kv_heads * self.value_dim,
            values_in_keys: false,
            window: None,
            indexer_width: 0,
        }
    }
}

/// Typed access to metadata, with errors that name the key.
pub struct Keys<'a> {
    file: &'a GgufFile,
    /// The architecture's key prefix (`qwen3moe`).
    arch: String,
    /// Whether the model (any part of a split set) has the tensor of this name.
    has_tensor: &'a dyn Fn(&str) -> bool,
}

impl Keys<'_> {
    /// Whether the model has tensor `name`: for architectures whose files come in more than one
    /// layout (Qwen3-Next's fused or split input projection).
    pub fn has_tensor(&self, name: &str) -> bool {
        (self.has_tensor)(name)
    }

    /// The full name of the architecture's key `key` (`expert_count` → `qwen3moe.expert_count`).
    pub fn arch_key(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }

    /// A required count of the architecture's own (`expert_count`).
    pub fn arch_count(&self, key: &str) -> Result<usize, ModelError> {
        self.count(&self.arch_key(key))
    }

    pub fn arch_optional_count(&self, key: &str) -> Result<Option<usize>, ModelError> {
        self.optional_count(&self.arch_key(key))
    }

    /// An optional count of the architecture's own that may be 0 (`attention.q_lora_rank`).
    pub fn arch_optional_size(&self, key: &str) -> Result<Option<usize>, ModelError> {
        let key = self.arch_key(key);
        let Some(v) = self.file.get(&key) else { return Ok(None) };
        match v.as_u64() {
            Some(n) if n <= (1 << 31) => Ok(Some(n as usize)),
            Some(n) => Err(self.invalid(&key, &format!("is {n}"))),
            None => Err(self.wrong_type(&key, "integer", v)),
        }
    }

    pub fn arch_optional_float(&self, key: &str) -> Result<Option<f64>, ModelError> {
        self.optional_float(&self.arch_key(key))
    }

    /// The architecture's array of flags `key`, when the file has one (not a single number).
    pub fn arch_bools(&self, key: &str) -> Option<Vec<bool>> {
        let values = self.file.get(&self.arch_key(key))?.as_array()?;
        values.iter().map(|v| if let Value::Bool(b) = v { Some(*b) } else { None }).collect()
    }

    /// The architecture's per-layer flags `key` (an array of booleans, or of integers where 0 is false),
    /// when the file has them; any other value is refused.
    pub fn arch_flags(&self, key: &str) -> Result<Option<Vec<bool>>, ModelError> {
        let full = self.arch_key(key);
        let Some(value) = self.file.get(&full) else { return Ok(None) };
        if let Some(flags) = self.arch_bools(key) {
            return Ok(Some(flags));
        }
        match self.arch_integers(key) {
            Some(values) => Ok(Some(values.iter().map(|&v| v != 0).collect())),
            None => Err(self.wrong_type(&full, "array of booleans", value)),
        }
    }

    /// The architecture's array of non-negative integers `key`, when the file has one.
    pub fn arch_integers(&self, key: &str) -> Option<Vec<u64>> {
        let values = self.file.get(&self.arch_key(key))?.as_array()?;
        values.iter().map(Value::as_u64).collect()
    }

    /// Whether the array `key` of the architecture's own has its first two entries above zero (how
    /// llama.cpp tells that `rope.dimension_sections` asks for multimodal RoPE).
    pub fn arch_sections_in_use(&self, key: &str) -> bool {
        let values = self.file.get(&self.arch_key(key)).and_then(Value::as_array).unwrap_or(&[]);
        values.len() >= 2 && values[..2].iter().all(|v| v.as_u64().is_some_and(|n| n > 0))
    }

    /// An optional flag of the architecture's own (`expert_weights_norm`).
    pub fn arch_optional_bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        let key = self.arch_key(key);
        match self.file.get(&key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong_type(&key, "bool", v)),
        }
    }

    /// An error naming the architecture's key `key`.
    pub fn arch_invalid(&self, key: &str, problem: &str) -> ModelError {
        self.invalid(&self.arch_key(key), problem)
    }

    fn missing(&self, key: &str) -> ModelError {
        ModelError::MissingKey { path: self.file.path().into(), key: key.into() }
    }

    fn wrong_type(&self, key: &str, expected: &str, found: &Value) -> ModelError {
        ModelError::InvalidKey {
            path: self.file.path().into(),
            key: key.into(),
            problem: format!("is a {} where a {expected} is expected", found.type_name()),
        }
    }

    fn invalid(&self, key: &str, problem: &str) -> ModelError {
        ModelError::InvalidKey { path: self.file.path().into(), key: key.into(), problem: problem.into() }
    }

    fn string(&self, key: &str) -> Result<String, ModelError> {
        let v = self.file.get(key).ok_or_else(|| self.missing(key))?;
        v.as_str().map(str::to_string).ok_or_else(|| self.wrong_type(key, "string", v))
    }

    fn optional_count(&self, key: &str) -> Result<Option<usize>, ModelError> {
        let Some(v) = self.file.get(key) else { return Ok(None) };
        if matches!(v, Value::Array(_)) {
            return Err(self.invalid(key, "varies per layer, which this engine does not support"));
        }
        match v.as_u64() {
            Some(n) if n > 0 && n <= (1 << 31) => Ok(Some(n as usize)),
            Some(n) => Err(self.invalid(key, &format!("is {n}"))),
            None => Err(self.wrong_type(key, "integer", v)),
        }
    }

    fn count(&self, key: &str) -> Result<usize, ModelError> {
        self.optional_count(key)?.ok_or_else(|| self.missing(key))
    }

    fn optional_float(&self, key: &str) -> Result<Option<f64>, ModelError> {
        let Some(v) = self.file.get(key) else { return Ok(None) };
        match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            Some(x) => Err(self.invalid(key, &format!("is {x}"))),
            None => Err(self.wrong_type(key, "number", v)),
        }
    }

    fn float(&self, key: &str) -> Result<f64, ModelError> {
        self.optional_float(key)?.ok_or_else(|| self.missing(key))
    }
}
