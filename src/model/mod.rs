//! Models on disk: GGUF reading, architecture and hyper-parameters, per-layer tensor bytes, the tokenizer
//! and chat templates. Opening a [`Model`] validates the whole file's structure, so later stages can trust it.

pub mod arch;
mod chat_template;
pub mod config;
pub mod gguf;
pub mod layout;
pub mod library;
mod linear_attention;
pub mod names;
pub mod peer_copy;
pub mod pull;
pub mod shard;
pub mod slice;
pub mod split;
mod tokenizer;
mod user_text;

pub use chat_template::{CallFormat, ChatMessage, ChatTemplate, ReplyFormat, ThinkTags};
pub use config::{
    Architecture, BlockSparseAttention, CacheRow, ExpertActivation, ExpertGroups, Gating, LatentAttention,
    LinearAttention, ModelConfig, MoeParams, RopeConfig, SlidingWindow, SparseAttention,
};
pub use gguf::{GgufFile, GgufHeader, TensorInfo, Value};
pub use layout::ModelLayout;
pub use slice::{SliceSource, TensorSlice};
pub use tokenizer::{TextStream, Tokenizer};
pub use user_text::{Literals, Markup};

use crate::ggml::VocabError;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Why a model file cannot be used; every message names the file and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot open the model file {}: {source}", path.display())]
    Open { path: PathBuf, source: std::io::Error },
    #[error("{} is not a GGUF model file: {reason}. shoal runs GGUF files (*.gguf), such as those published on Hugging Face", path.display())]
    NotGguf { path: PathBuf, reason: String },
    #[error("{} is GGUF version {version}; shoal reads versions 2 and 3. Download a newer conversion of the model", path.display())]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error("{} is truncated: {what} runs past the end of the file ({file_len} bytes). The download is probably incomplete; download the file again", path.display())]
    Truncated { path: PathBuf, what: String, file_len: u64 },
    #[error("{} is damaged: {reason}. Download the file again", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("{} uses the tensor type {type_id} for {tensor}, which this build of ggml does not know. Use another quantization of the model (Q4_K_M, Q8_0, F16, …)", path.display())]
    UnsupportedTensorType { path: PathBuf, tensor: String, type_id: u32 },
    #[error("{} is a {architecture:?} model; shoal runs {}", path.display(), Architecture::SUPPORTED)]
    UnsupportedArchitecture { path: PathBuf, architecture: String },
    #[error("{} lacks the metadata key {key}; the file is damaged or was converted by an incompatible tool", path.display())]
    MissingKey { path: PathBuf, key: String },
    #[error("{}: metadata {key} {problem}", path.display())]
    InvalidKey { path: PathBuf, key: String, problem: String },
    #[error("{} lacks the tensor {tensor}; the file is damaged or is not a complete model", path.display())]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{} is part {part} of a split GGUF set of {parts} files; open its first part{}", path.display(), first.as_ref().map(|f| format!(", {}", f.display())).unwrap_or_default())]
    SplitPart { path: PathBuf, part: u64, parts: u64, first: Option<PathBuf> },
    #[error("the split GGUF set {} cannot be used: {problem}", path.display())]
    SplitSet { path: PathBuf, problem: String },
    #[error("{}: tensor {tensor} has shape {found:?} but the model's hyper-parameters need {expected:?}; the file is damaged", path.display())]
    TensorShape { path: PathBuf, tensor: String, found: Vec<u64>, expected: Vec<u64> },
    #[error("{} has a tensor {tensor} that shoal's {architecture} graph does not use: a variant of the architecture that shoal does not run yet (say which model it is in an issue)", path.display())]
    UnexpectedTensor { path: PathBuf, tensor: String, architecture: &'static str },
    #[error("{} is a shard holding only layers {layers} of the model: tensor {tensor} ({bytes} bytes at byte {offset}) was never fetched. Fetch the layers this stage runs with `shoal pull REPO:FILE --layers FIRST-LAST` (a tensor-parallel node's slice with `--rank RANK/NODES`), or the whole file without either", path.display())]
    ShardIncomplete { path: PathBuf, layers: String, tensor: String, offset: u64, bytes: u64 },
    #[error("cannot read {}, which records what a shard of a model holds: {reason}. Delete it and the model file beside it, and fetch again", path.display())]
    ShardRecord { path: PathBuf, reason: String },
    #[error(transparent)]
    Tokenizer(#[from] VocabError),
    #[error("{0}")]
    ChatTemplate(String),
}

/// A validated model: its GGUF file (or every part of a split set), hyper-parameters and exact tensor
/// layout.
pub struct Model {
    /// The file, or the parts of a split set in order (the first holds the metadata).
    parts: Vec<GgufFile>,
    index: split::TensorIndex,
    config: ModelConfig,
    layout: ModelLayout,
}

impl Model {
    /// Opens `path` (a GGUF file, or the first part of a split set, whose other parts must lie beside
    /// it) and checks everything the engine relies on: the GGUF structure, the parts of a set, the
    /// architecture, the hyper-parameters, and the presence and shape of every tensor. Tensor data is
    /// not read.
    pub fn open(path: &Path) -> Result<Model, ModelError> {
        let parts = split::open_parts(GgufFile::open(path)?)?;
        let index = split::TensorIndex::new(&parts);
        let config = ModelConfig::from_gguf(&parts[0], &|name| index.find(&parts, name).is_some())?;
        let layout = ModelLayout::check(&parts, &index, &config)?;
        Ok(Model { parts, index, config, layout })
    }

    /// The file opened (the first part of a split set).
    pub fn path(&self) -> &Path {
        self.parts[0].path()
    }

    /// The file opened: the model's metadata (the first part of a split set).
    pub fn file(&self) -> &GgufFile {
        &self.parts[0]
    }

    /// Every file of the model, in order: one, or the parts of a split set.
    pub fn parts(&self) -> &[GgufFile] {
        &self.parts
    }

    pub fn is_split(&self) -> bool {
        self.parts.len() > 1
    }

    /// Bytes of every file of the model.
    pub fn file_bytes(&self) -> u64 {
        self.parts.iter().map(GgufFile::file_bytes).sum()
    }

    /// Tensor `name`, in whichever part holds it.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.find(&self.parts, name).map(|(_, t)| t)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    /// The tensors a stage running `layers` reads, in file order (part by part for a split set): its
    /// layers' tensors, RoPE factors when the model has them, the token embedding on the first stage,
    /// and the final norm with the output head on the last (the embedding matrix when the head is tied
    /// to it) and whatever else the architecture holds there (Kimi K3's final residual mix).
    pub fn stage_tensors(&self, layers: Range<usize>) -> Vec<&TensorInfo> {
        self.stage_tensors_by_part(layers).into_iter().flatten().collect()
    }

    /// [`Model::stage_tensors`] grouped by the part that holds them: one list per part, in part order.
    pub fn stage_tensors_by_part(&self, layers: Range<usize>) -> Vec<Vec<&TensorInfo>> {
        let config = &self.config;
        // The layers' and the globals their place calls for, as the architecture declares them (a
        // tensor the file lacks is skipped); a tied head is the embedding matrix.
        let mut names: Vec<String> =
            layout::stage_tensors(config, layers.clone()).into_iter().map(|t| t.name).collect();
        if layers.end == config.layers && self.layout.tied_output {
            names.push(layout::TOKEN_EMBEDDING.into());
        }
        let mut by_part: Vec<Vec<&TensorInfo>> = vec![Vec::new(); self.parts.len()];
        for (part, info) in names.iter().filter_map(|n| self.index.find(&self.parts, n)) {
            by_part[part].push(info);
        }
        for infos in &mut by_part {
            infos.sort_by_key(|t| t.offset);
            infos.dedup_by_key(|t| t.offset);
        }
        by_part
    }

    /// The model's display name (`general.name`), or its file name.
    pub fn name(&self) -> String {
        match self.file().get("general.name").and_then(Value::as_str) {
            Some(name) => name.to_string(),
            None => self.path().file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
        }
    }

    /// Loads the tokenizer (llama.cpp's vocabulary code) of this model.
    pub fn tokenizer(&self) -> Result<Tokenizer, ModelError> {
        Tokenizer::load(self.file())
    }

    /// The model's chat template, or its architecture's usual one, or ChatML when neither exists.
    pub fn chat_template(&self, tokenizer: &Tokenizer) -> Result<ChatTemplate, ModelError> {
        ChatTemplate::new(self.chat_template_source(), tokenizer.bos_text(), tokenizer.eos_text())
    }

    /// Whether the model's chat template compiles and finishes rendering (see [`ChatTemplate::new`]).
    pub fn check_chat_template(&self) -> Result<(), ModelError> {
        self.chat_template(&self.tokenizer()?).map(drop)
    }

    /// The source of the model's chat template, or of its architecture's usual one (None: ChatML).
    pub fn chat_template_source(&self) -> Option<&str> {
        let source = self.file().get("tokenizer.chat_template").and_then(Value::as_str);
        source.or_else(|| self.config.architecture.declaration().default_chat_template())
    }
}
