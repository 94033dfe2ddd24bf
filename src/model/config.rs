//! A model's architecture and hyper-parameters, read from GGUF metadata with llama.cpp's defaults.

use super::gguf::{GgufFile, Value};
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
    /// Gemma 3 (270M to 27B, text): sliding-window and global layers, norms before and after attention
    /// and feed-forward, GELU, scaled embeddings.
    Gemma3,
}

impl Architecture {
    pub const SUPPORTED: &'static str = "llama (Llama 2/3, Mistral, SmolLM), qwen2, qwen3, qwen3moe, glm4moe, gemma3";

    pub fn from_gguf_name(name: &str) -> Option<Architecture> {
        match name {
            "llama" => Some(Architecture::Llama),
            "qwen2" => Some(Architecture::Qwen2),
            "qwen3" => Some(Architecture::Qwen3),
            "qwen3moe" => Some(Architecture::Qwen3Moe),
            "glm4moe" => Some(Architecture::Glm4Moe),
            "gemma3" => Some(Architecture::Gemma3),
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
            Architecture::Gemma3 => "gemma3",
        }
    }

    /// What the architecture declares: its own metadata, tensors and graph.
    pub fn spec(self) -> &'static dyn crate::engine::arch::ArchSpec {
        crate::engine::arch::spec(self)
    }
}

/// How positions are encoded.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct RopeConfig {
    pub dimensions: u32,
    pub freq_base: f32,
    /// 1 / the linear scaling factor.
    pub freq_scale: f32,
    pub original_context: u32,
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
    /// Layers the file holds after the model's own (GLM's next-token-prediction layers): neither
    /// loaded nor counted.
    pub skipped_layers: usize,
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
    /// Whether `layer` attends through a sliding window.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding_window.as_ref().is_some_and(|w| w.layers.get(layer).copied().unwrap_or(false))
    }
}

/// How a router's logits become expert weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Gating {
    Softmax,
    Sigmoid,
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
    /// Divide the chosen experts' weights by their sum.
    pub normalize: bool,
    /// Multiply the weights by this (0 or 1: unscaled).
    pub scale: f32,
    /// Experts every token goes through besides the routed ones (`ffn_*_shexp`, one dense
    /// feed-forward `shared_experts` experts wide).
    pub shared_experts: usize,
    /// The first layers have a dense feed-forward instead (GLM-4.5, DeepSeek V3).
    pub leading_dense_layers: usize,
}

impl MoeParams {
    /// Whether `layer` routes its tokens to experts (or is one of the leading dense layers).
    pub fn is_sparse(&self, layer: usize) -> bool {
        layer >= self.leading_dense_layers
    }
}

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        let arch_name = Keys { file, arch: String::new() }.string("general.architecture")?;
        let keys = Keys { file, arch: arch_name.clone() };
        let architecture = Architecture::from_gguf_name(&arch_name).ok_or_else(|| {
            ModelError::UnsupportedArchitecture { path: file.path().into(), architecture: arch_name.clone() }
        })?;
        let p = |key: &str| keys.arch_key(key);
        let layers = keys.count(&p("block_count"))?;
        let embedding = keys.count(&p("embedding_length"))?;
        let feed_forward = keys.count(&p("feed_forward_length"))?;
        let heads = keys.count(&p("attention.head_count"))?;
        let kv_heads = keys.optional_count(&p("attention.head_count_kv"))?.unwrap_or(heads);
        let head_dim = match keys.optional_count(&p("attention.key_length"))? {
            Some(d) => d,
            None if embedding % heads == 0 => embedding / heads,
            None => return Err(keys.invalid(&p("attention.head_count"), "does not divide the embedding length")),
        };
        if let Some(v) = keys.optional_count(&p("attention.value_length"))? {
            if v != head_dim {
                return Err(keys.invalid(
                    &p("attention.value_length"),
                    "differs from the key length, which this engine does not support",
                ));
            }
        }
        if heads % kv_heads != 0 {
            return Err(keys.invalid(&p("attention.head_count_kv"), "does not divide the number of attention heads"));
        }
        let rms_epsilon = keys.float(&p("attention.layer_norm_rms_epsilon"))? as f32;
        let training_context = keys.count(&p("context_length"))?;
        let rope_dims = keys.optional_count(&p("rope.dimension_count"))?.unwrap_or(head_dim);
        if rope_dims > head_dim || (rope_dims != head_dim && !architecture.spec().partial_rotary()) {
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
        let freq_scale = match scaling.as_str() {
            "none" => 1.0,
            "linear" if factor > 0.0 => (1.0 / factor) as f32,
            other => {
                return Err(keys.invalid(
                    &p("rope.scaling.type"),
                    &format!("is {other:?}; only none and linear scaling are supported"),
                ))
            }
        };
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
            rms_epsilon,
            attention_scale,
            rope: RopeConfig {
                dimensions: rope_dims as u32,
                freq_base,
                freq_scale,
                original_context: original_context as u32,
            },
            training_context,
            vocabulary,
            moe: None,
            sliding_window: None,
            embedding_scale: None,
            logit_softcap: None,
            skipped_layers: 0,
        };
        architecture.spec().hyper_parameters(&keys, &mut config)?;
        Ok(config)
    }

    /// Width of the K (and V) rows of one layer: kv_heads × head_dim.
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// Typed access to metadata, with errors that name the key.
pub struct Keys<'a> {
    file: &'a GgufFile,
    /// The architecture's key prefix (`qwen3moe`).
    arch: String,
}

impl Keys<'_> {
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

    pub fn arch_optional_float(&self, key: &str) -> Result<Option<f64>, ModelError> {
        self.optional_float(&self.arch_key(key))
    }

    /// The architecture's array of flags `key`, when the file has one (not a single number).
    pub fn arch_bools(&self, key: &str) -> Option<Vec<bool>> {
        let values = self.file.get(&self.arch_key(key))?.as_array()?;
        values.iter().map(|v| if let Value::Bool(b) = v { Some(*b) } else { None }).collect()
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
