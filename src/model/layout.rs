//! Which tensors a model must have (as its architecture declares them in [`super::arch`]), their expected
//! shapes, and the exact bytes each layer, the embeddings and the output head occupy: the numbers a
//! stage maps and placement budgets.

use super::config::ModelConfig;
use super::gguf::GgufFile;
use super::split::TensorIndex;
use super::ModelError;
use std::collections::HashMap;
use std::ops::Range;

/// One tensor a model may contain.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpectedTensor {
    pub name: String,
    pub shape: Vec<u64>,
    pub required: bool,
    /// How the ranks of a tensor-parallel group divide it (every rank holds it whole unless declared).
    pub split: Split,
}

impl ExpectedTensor {
    /// The same tensor, divided among a tensor-parallel group's ranks along dimension `dim` (ggml order:
    /// 0 is the row length) by their share of `part`.
    pub fn split(self, dim: usize, part: Part) -> ExpectedTensor {
        ExpectedTensor { split: Split::Along { dim, part }, ..self }
    }
}

/// A tensor outside the layers, declared by name.
pub fn global(name: &str, shape: &[usize], required: bool) -> ExpectedTensor {
    tensor(name.into(), shape, required)
}

fn tensor(name: String, shape: &[usize], required: bool) -> ExpectedTensor {
    ExpectedTensor { name, shape: shape.iter().map(|&n| n as u64).collect(), required, split: Split::Whole }
}

/// What the ranks of a tensor-parallel group divide among themselves ([`super::TensorSlice`] says which
/// part of each a rank holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    /// Attention heads, by share (a rank holds the key/value heads its query heads read).
    QueryHeads,
    /// The key/value heads (grouped-query attention's groups).
    KvHeads,
    /// The inner width of the dense feed-forward.
    FeedForward,
    /// The inner width of the shared experts' feed-forward.
    SharedFeedForward,
    /// The routed experts of a mixture-of-experts layer, whole.
    Experts,
    /// The output head's rows: the vocabulary.
    Vocabulary,
}

/// How a tensor-parallel group divides one tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Split {
    /// Every rank holds it whole (norms, the router, the token embeddings).
    #[default]
    Whole,
    /// Each rank holds its share of `part` along dimension `dim`.
    Along { dim: usize, part: Part },
    /// Along the last dimension (rows), every rank holds the first `whole` rows and its share of `part`
    /// of the rest (Qwen3.5's mixed projection: the keys and queries every value head may read, then
    /// the values by head).
    AfterWhole { whole: u64, part: Part },
}

/// Whether two shapes are the same tensor's: equal but for trailing dimensions of 1, which ggml treats
/// as absent (Kimi K3's convolution kernels are written with four dimensions or, once quantized, three).
fn same_shape(a: &[u64], b: &[u64]) -> bool {
    let trimmed = |s: &[u64]| s.len() - s.iter().rev().take_while(|&&n| n == 1).count();
    let (a, b) = (&a[..trimmed(a)], &b[..trimmed(b)]);
    a == b
}

/// Tensors of layer `layer`, as its architecture declares them.
pub fn layer_tensors(config: &ModelConfig, layer: usize) -> Vec<ExpectedTensor> {
    config.architecture.declaration().layer_tensors(config, layer)
}

pub const TOKEN_EMBEDDING: &str = "token_embd.weight";
pub const OUTPUT_NORM: &str = "output_norm.weight";
pub const OUTPUT: &str = "output.weight";
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// Tensors outside the layers, as the model's architecture declares them.
pub fn global_tensors(config: &ModelConfig) -> Vec<ExpectedTensor> {
    config.architecture.declaration().global_tensors(config)
}

/// Which stages hold a tensor outside the layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlobalPlace {
    /// The stage of the first layers (the token embedding).
    First,
    /// The stage of the last layers (the final norm and the output head).
    Last,
    /// Every stage (RoPE factors).
    Every,
}

/// Where the global tensor `name` is held.
pub fn global_place(name: &str) -> GlobalPlace {
    match name {
        TOKEN_EMBEDDING => GlobalPlace::First,
        OUTPUT | OUTPUT_NORM | super::arch::OUTPUT_RESIDUAL_SCORE => GlobalPlace::Last,
        _ => GlobalPlace::Every,
    }
}

/// The tensors a stage of `layers` binds, as declared: its layers', and those outside the layers its
/// place calls for ([`global_place`]).
pub fn stage_tensors(config: &ModelConfig, layers: Range<usize>) -> Vec<ExpectedTensor> {
    let (first, last) = (layers.start == 0, layers.end == config.layers);
    let mut list: Vec<ExpectedTensor> = layers.flat_map(|l| layer_tensors(config, l)).collect();
    list.extend(global_tensors(config).into_iter().filter(|t| match global_place(&t.name) {
        GlobalPlace::First => first,
        GlobalPlace::Last => last,
        GlobalPlace::Every => true,
    }));
    list
}

/// The usual tensors outside the layers: the token embedding, the final norm, the output head (absent
/// when tied to the embedding) and Llama 3's RoPE factors.
pub fn standard_globals(config: &ModelConfig) -> Vec<ExpectedTensor> {
    vec![
        tensor(TOKEN_EMBEDDING.into(), &[config.embedding, config.vocabulary], true),
        tensor(OUTPUT_NORM.into(), &[config.embedding], true),
        tensor(OUTPUT.into(), &[config.embedding, config.vocabulary], false).split(1, Part::Vocabulary),
        tensor(ROPE_FREQS.into(), &[config.head_dim / 2], false),
    ]
}

/// Exact tensor bytes of each part of a model.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelLayout {
    /// Bytes of each layer's tensors.
    pub layers: Vec<u64>,
    pub embedding: u64,
    /// The final norm's bytes, with those of any other tensor only the last stage holds beside the
    /// head (Kimi K3's final residual mix).
    pub output_norm: u64,
    /// The output head's own bytes; 0 when it is tied to (shares) the embedding matrix.
    pub output_head: u64,
    pub tied_output: bool,
    /// Llama 3's RoPE frequency factors, needed by every stage (0 when absent).
    pub rope_factors: u64,
}

impl ModelLayout {
    /// Checks that the model's files (one, or the parts of a split set) have every tensor `config` needs, with the right shapes and no tensors the engine
    /// would ignore, and totals their bytes.
    pub fn check(parts: &[GgufFile], index: &TensorIndex, config: &ModelConfig) -> Result<ModelLayout, ModelError> {
        let file = &parts[0];
        let mut seen: HashMap<&str, bool> =
            parts.iter().flat_map(|p| p.tensors()).map(|t| (t.name.as_str(), false)).collect();
        let mut bytes_of = |expected: &ExpectedTensor| -> Result<u64, ModelError> {
            let Some((_, info)) = index.find(parts, &expected.name) else {
                return if expected.required {
                    Err(ModelError::MissingTensor { path: file.path().into(), tensor: expected.name.clone() })
                } else {
                    Ok(0)
                };
            };
            seen.insert(info.name.as_str(), true);
            if !same_shape(&info.shape, &expected.shape) {
                return Err(ModelError::TensorShape {
                    path: file.path().into(),
                    tensor: info.name.clone(),
                    found: info.shape.clone(),
                    expected: expected.shape.clone(),
                });
            }
            Ok(info.bytes)
        };
        let mut layers = Vec::with_capacity(config.layers);
        for layer in 0..config.layers {
            let mut total = 0;
            for t in layer_tensors(config, layer) {
                total += bytes_of(&t)?;
            }
            layers.push(total);
        }
        let globals = global_tensors(config);
        let [embedding, output_norm, output_head, rope_factors] = [0, 1, 2, 3].map(|i| bytes_of(&globals[i]));
        let (embedding, mut output_norm, output_head, rope_factors) =
            (embedding?, output_norm?, output_head?, rope_factors?);
        // An architecture's own globals (Kimi K3's final residual mix) sit with the final norm.
        for extra in &globals[4..] {
            output_norm += bytes_of(extra)?;
        }
        // The layers after the model's own (next-token prediction) are known and left alone.
        let skipped = |name: &str| {
            let layer = name.strip_prefix("blk.").and_then(|rest| rest.split('.').next()?.parse::<usize>().ok());
            layer.is_some_and(|l| l >= config.layers && l < config.layers + config.skipped_layers)
        };
        if let Some((name, _)) = seen.iter().find(|(name, used)| !**used && !skipped(name)) {
            return Err(ModelError::UnexpectedTensor {
                path: file.path().into(),
                tensor: name.to_string(),
                architecture: config.architecture.gguf_name(),
            });
        }
        Ok(ModelLayout { layers, embedding, output_norm, output_head, tied_output: output_head == 0, rope_factors })
    }

    /// Exact tensor bytes a stage running `layers` maps: its layers, plus the embeddings on the first
    /// stage, plus the final norm and output head on the last (the embedding matrix again when tied).
    pub fn stage_bytes(&self, layers: Range<usize>) -> u64 {
        let n = self.layers.len();
        let mut total: u64 = self.layers[layers.clone()].iter().sum::<u64>() + self.rope_factors;
        let first = layers.start == 0;
        let last = layers.end == n;
        if first {
            total += self.embedding;
        }
        if last {
            total += self.output_norm;
            total += if self.tied_output {
                if first {
                    0
                } else {
                    self.embedding
                }
            } else {
                self.output_head
            };
        }
        total
    }

    /// All tensor bytes of the model.
    pub fn total_bytes(&self) -> u64 {
        self.stage_bytes(0..self.layers.len())
    }
}
