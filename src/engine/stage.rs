//! A stage: layers [a, b) of a model with their own KV cache, run on one device (the best ggml offers
//! unless told: a GPU where this build has one, else the CPU) with the CPU for what the device lacks.
//! The first stage takes token ids, the others hidden states; the last returns logits.

use super::blocks::{input, GraphShape, SegmentShape};
use super::cores::{Cores, Lease};
use super::forward::{self, StageParts};
use super::kv_cache::{KvCache, CACHE_BLOCK};
use super::parallel::Group;
use super::recurrent_state::RecurrentState;
pub use super::stage_options::StageOptions;
use super::weights::StageWeights;
use super::EngineError;

mod checkpoints;
mod checks;

use crate::ggml::{Backend, Device, DeviceKind, Graph, Repacking, WeightPlacement};
use crate::model::{Model, ModelConfig};
pub use checkpoints::STATE_CHECKPOINTS;
use half::f16;
use std::ops::Range;

/// What a step feeds a stage.
pub enum StageInput<'a> {
    /// Token ids (first stage only).
    Tokens(&'a [u32]),
    /// Hidden states from the previous stage: `tokens` rows of the model's embedding width.
    Hidden { values: &'a [f32], tokens: usize },
}

impl StageInput<'_> {
    fn tokens(&self) -> usize {
        match self {
            StageInput::Tokens(ids) => ids.len(),
            StageInput::Hidden { tokens, .. } => *tokens,
        }
    }
}

/// One sequence's part of a batched step: positions `start..start + tokens` of sequence `seq`, whose
/// rows follow the previous segment's in the step's input; on the last stage, `logits` asks for the
/// logits of its last position — and, when its last `drafted` tokens are drafts to verify (speculative
/// decoding), of the positions before them too: `drafted + 1` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub seq: usize,
    pub start: usize,
    pub tokens: usize,
    pub logits: bool,
    pub drafted: usize,
}

impl Segment {
    /// Rows of logits the segment asks of the last stage.
    pub fn outputs(&self) -> usize {
        if self.logits {
            self.drafted + 1
        } else {
            0
        }
    }
}

/// Memory a stage uses, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, ts_rs::TS)]
pub struct StageMemory {
    pub weights: u64,
    pub kv_cache: u64,
    pub compute: u64,
}

pub struct Stage {
    config: ModelConfig,
    layers: Range<usize>,
    options: StageOptions,
    weights: StageWeights,
    pub(super) cache: KvCache,
    /// The recurrent state of the stage's linear-attention layers (empty without such layers).
    pub(super) state: RecurrentState,
    /// Copies of the recurrent state at earlier positions, so that a sequence can go back to them.
    checkpoints: checkpoints::StateCheckpoints,
    backend: Backend,
    /// The graph of the previous step, reused while the shape stays the same (a decode step usually does).
    graph: Option<(GraphShape, Graph)>,
    /// A tensor-parallel rank's group (then the stage holds its slice of every layer).
    group: Option<Group>,
    compute_bytes: u64,
    /// Bytes of the weights copied into the CPU's repacked layout at load.
    repacked_bytes: u64,
    /// Bytes of weights copied as they are from the mapped file into huge pages at load.
    copied_bytes: u64,
    // Buffers reused across steps so a decode step allocates nothing.
    output: Vec<f32>,
    positions: Vec<i32>,
    position_sections: Vec<i32>,
    rows: Vec<i64>,
    rows_sliding: Vec<i64>,
    mask: Vec<f16>,
    mask_sliding: Vec<f16>,
    token_ids: Vec<i32>,
    output_rows: Vec<i32>,
    /// The leader of a tensor-parallel group assembles the ranks' logits here.
    gathered: Vec<f32>,
    /// With a quantized KV cache: the Walsh-Hadamard matrices that rotate keys and values (empty when
    /// they are not rotated).
    rotate_keys: Vec<f32>,
    /// The lightning indexer's rotation (sparse attention), as its input wants it.
    rotate_indexer: Vec<f32>,
    rotate_values: Vec<f32>,
}

impl Stage {
    /// Maps the tensors of `layers`, allocates the KV cache and sizes the compute buffer for the largest
    /// step. Fails with a clear error for a bad range or a tensor type the CPU back end cannot compute.
    pub fn load(model: &Model, layers: Range<usize>, options: StageOptions) -> Result<Stage, EngineError> {
        Self::load_in(model, layers, options, None, &mut |_| {})
    }

    /// Loads one rank of a tensor-parallel group: its slice of each of `layers` (see [`Group`]; the
    /// whole model, or one group's range of groups chained as pipeline stages), with a KV cache of its
    /// own heads. The leader takes steps as any stage of those layers does, the others run
    /// [`super::parallel::follow`].
    pub fn load_rank(
        model: &Model,
        layers: Range<usize>,
        options: StageOptions,
        group: Group,
    ) -> Result<Stage, EngineError> {
        Self::load_in(model, layers, options, Some(group), &mut |_| {})
    }

    /// Loads a stage (`layers`), or a rank of `group`, and reads all its weights into memory now, so
    /// that the first request does not wait on the disk; `progress` receives the fraction of the
    /// weights' bytes read (0 to 1).
    pub fn load_resident(
        model: &Model,
        layers: Range<usize>,
        options: StageOptions,
        group: Option<Group>,
        mut progress: impl FnMut(f32),
    ) -> Result<Stage, EngineError> {
        let stage = Self::load_in(model, layers, options, group, &mut progress)?;
        // The weights copied at load (repacked, or gathered) were read then; the fractions continue.
        let total = stage.weights.mapped_bytes().max(1) as f32;
        let in_place = stage.weights.bytes_in_place() as f32;
        let read = total - in_place;
        stage.weights.prefault(|fraction| progress((read + fraction * in_place) / total));
        Ok(stage)
    }

    fn load_in(
        model: &Model,
        layers: Range<usize>,
        options: StageOptions,
        group: Option<Group>,
        progress: &mut dyn FnMut(f32),
    ) -> Result<Stage, EngineError> {
        let config = model.config().clone();
        if layers.start >= layers.end || layers.end > config.layers {
            return Err(EngineError::InvalidLayers { layers, model_layers: config.layers });
        }
        if !config.may_begin_stage(layers.start) {
            return Err(EngineError::StageStart { layer: layers.start });
        }
        // Attention reads the cache in runs of CACHE_BLOCK positions, which must hold whole blocks.
        if let Some(block) = config.block_sparse.map(|b| b.block).filter(|&b| !CACHE_BLOCK.is_multiple_of(b)) {
            return Err(EngineError::BlockSize { block });
        }
        let options = StageOptions {
            context: options.context.max(1),
            sequences: options.sequences.max(1),
            threads: options.threads.max(1),
            batch: options.batch.clamp(1, options.context.max(1)),
            ..options
        };
        let device = options.device()?;
        let weights = match &group {
            Some(group) => StageWeights::map_slice(model, layers.clone(), device, options.weights, group.slice())?,
            None => StageWeights::map(model, layers.clone(), device, options.weights)?,
        };
        // A rank caches the keys and values of its own heads, and the recurrent state of its share of
        // the linear layers' heads.
        let cache_config = match &group {
            Some(group) => ModelConfig {
                kv_heads: group.slice().kv_heads.len(),
                linear_attention: config
                    .linear_attention
                    .as_ref()
                    .map(|l| l.for_rank(group.slice().query_heads.clone(), config.heads)),
                ..config.clone()
            },
            None => config.clone(),
        };
        let kv_type = options.kv_type;
        kv_type.check_model(&config).map_err(EngineError::Unsupported)?;
        let rows: Vec<_> = layers.clone().map(|l| cache_config.cache_row(l)).collect();
        let cache = KvCache::new(&rows, options.context, options.sequences, options.batch, device, kv_type)?;
        let state = RecurrentState::new(&cache_config, layers.clone(), options.sequences, device)?;
        // Where stages share the machine's cores, a thread without work sleeps rather than polling.
        let sharing_cores = device.kind() == DeviceKind::Cpu && Cores::machine().is_some();
        let backend = Backend::new(device, options.threads, sharing_cores).map_err(EngineError::Backend)?;
        let mut stage = Stage {
            config,
            layers,
            options,
            weights,
            checkpoints: checkpoints::StateCheckpoints::new(cache.sequences()),
            cache,
            state,
            backend,
            graph: None,
            group,
            compute_bytes: 0,
            repacked_bytes: 0,
            copied_bytes: 0,
            output: Vec::new(),
            positions: Vec::new(),
            position_sections: Vec::new(),
            rows: Vec::new(),
            rows_sliding: Vec::new(),
            mask: Vec::new(),
            mask_sliding: Vec::new(),
            token_ids: Vec::new(),
            output_rows: Vec::new(),
            gathered: Vec::new(),
            rotate_keys: Vec::new(),
            rotate_values: Vec::new(),
            rotate_indexer: Vec::new(),
        };
        let (keys, values) = kv_type.rotations(stage.config.head_dim, stage.config.value_dim);
        stage.rotate_keys = keys.map(super::kv_cache::hadamard).unwrap_or_default();
        stage.rotate_values = values.map(super::kv_cache::hadamard).unwrap_or_default();
        stage.rotate_indexer =
            stage.config.sparse_attention.as_ref().map(|s| super::kv_cache::hadamard(s.width)).unwrap_or_default();
        let worst = stage.worst_shapes();
        let mut graphs: Vec<Graph> = worst.iter().map(|shape| stage.build(shape)).collect();
        if let Some(repacking) = Repacking::for_device(device).filter(|_| stage.options.weights.repacks()) {
            // The graphs name the weights they read: those that moved need graphs of their own.
            if stage.repack_weights(&repacking, &graphs, progress)? {
                graphs = worst.iter().map(|shape| stage.build(shape)).collect();
            }
        }
        if stage.copies_into_huge_pages() {
            let (total, repacked) = (stage.weights.mapped_bytes().max(1) as f32, stage.repacked_bytes as f32);
            stage.copied_bytes =
                stage.weights.copy_mapped_to_cpu(|copied| progress((repacked + copied as f32) / total))?;
            if stage.copied_bytes > 0 {
                graphs = worst.iter().map(|shape| stage.build(shape)).collect();
            }
        }
        let mut compute_bytes = 0;
        let mut nodes = 0;
        for graph in &graphs {
            if let Some(node) = stage.backend.unsupported_node(graph) {
                return Err(EngineError::Unsupported(format!(
                    "neither {} nor the CPU can compute {node}",
                    device.name()
                )));
            }
            // Reserving keeps the largest buffers any of the graphs needs.
            compute_bytes = stage.backend.reserve(graph).map_err(EngineError::OutOfMemory)?;
            nodes = nodes.max(graph.node_count());
        }
        stage.compute_bytes = compute_bytes as u64;
        tracing::debug!(
            layers = ?stage.layers,
            device = %device.name(),
            weights = stage.weights.mapped_bytes(),
            repacked = stage.repacked_bytes,
            kv_cache = stage.cache.bytes(),
            compute = stage.compute_bytes,
            nodes,
            "stage loaded"
        );
        Ok(stage)
    }

    /// Moves the weights that the stage's graphs only ever multiply activations by, in a type the CPU
    /// has interleaved kernels for, into that layout (see [`Repacking`]), as `graphs` (the worst shapes')
    /// read them. How an architecture uses a weight does not depend on a step's shape, so those graphs
    /// show every use any step makes of it. `progress` receives the fraction of all the stage's weight
    /// bytes copied. Returns whether any weight moved.
    fn repack_weights(
        &mut self,
        repacking: &Repacking,
        graphs: &[Graph],
        progress: &mut dyn FnMut(f32),
    ) -> Result<bool, EngineError> {
        let candidates = self.weights.mapped_tensors();
        let tensors: Vec<_> = candidates.iter().map(|(_, t)| t.clone()).collect();
        let eligible = repacking.eligible(&graphs.iter().collect::<Vec<_>>(), &tensors);
        let moving: Vec<_> = candidates.into_iter().zip(eligible).filter_map(|(c, ok)| ok.then_some(c)).collect();
        let total = self.weights.mapped_bytes().max(1) as f32;
        self.weights.repack(repacking, &moving, |copied| progress(copied as f32 / total))?;
        self.repacked_bytes = moving.iter().map(|(_, t)| t.bytes() as u64).sum();
        Ok(!moving.is_empty())
    }

    /// The largest steps the stage may run, for sizing its compute buffer: a whole batch of one
    /// sequence over the whole context, and with several sequences, each of them over the whole context
    /// with one token each but the first, which takes the rest of the batch.
    fn worst_shapes(&self) -> Vec<GraphShape> {
        let (batch, context) = (self.options.batch, self.cache.context());
        let segment = |seq, tokens| SegmentShape {
            seq,
            tokens,
            attended: context,
            attended_sliding: self.cache.attended_sliding(context),
            // A segment that begins its sequence reads zeros for its recurrent state, which take compute
            // memory of their own.
            fresh: self.state.is_present(),
        };
        let mut shapes = vec![GraphShape { tokens: batch, segments: vec![segment(0, batch)], outputs: 1 }];
        if super::arch::graph(self.config().architecture).attends_fresh_segments_apart(self.config()) {
            // A whole batch that begins its sequence, attended in the architecture's own form.
            let first = SegmentShape {
                attended: self.cache.attended(batch),
                attended_sliding: self.cache.attended_sliding(batch),
                fresh: true,
                ..segment(0, batch)
            };
            shapes.push(GraphShape { tokens: batch, segments: vec![first], outputs: 1 });
        }
        let sequences = self.cache.sequences().min(batch);
        if self.options.draft_rows > 0 && self.is_last() {
            // Every sequence's decode row, the first carrying all the drafts, each row asking logits.
            let drafts = self.options.draft_rows.min(batch.saturating_sub(sequences));
            let segments: Vec<_> =
                (0..sequences.max(1)).map(|seq| segment(seq, if seq == 0 { 1 + drafts } else { 1 })).collect();
            let tokens = segments.iter().map(|s| s.tokens).sum();
            shapes.push(GraphShape { tokens, segments, outputs: tokens });
        }
        if sequences > 1 {
            let segments: Vec<_> =
                (0..sequences).map(|seq| segment(seq, if seq == 0 { batch - sequences + 1 } else { 1 })).collect();
            shapes.push(GraphShape { tokens: batch, segments, outputs: sequences });
        }
        shapes
    }

    fn build(&self, shape: &GraphShape) -> Graph {
        let parts = StageParts {
            config: &self.config,
            layers: self.layers.clone(),
            weights: &self.weights,
            cache: &self.cache,
            state: &self.state,
            group: self.group.as_ref(),
            on_cpu: self.device().kind() == DeviceKind::Cpu,
        };
        forward::build(&parts, shape)
    }

    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    pub fn is_first(&self) -> bool {
        self.layers.start == 0
    }

    pub fn is_last(&self) -> bool {
        self.layers.end == self.config.layers
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device the stage runs on.
    pub fn device(&self) -> Device {
        self.backend.device()
    }

    /// Whether the stage computes on the mapped model file (else on its own copy of the weights), all
    /// but the [`Stage::repacked_bytes`].
    pub fn weights_mapped(&self) -> bool {
        self.options.weights != WeightPlacement::Copied && self.device().maps_host_memory() && self.copied_bytes == 0
    }

    /// Where the stage's weights are, in words: `mapped` (in place in the file), `copied into huge
    /// pages` (the CPU on Linux, see [`WeightPlacement::Automatic`]) or `copied` (into the device's
    /// memory).
    pub fn weights_kept(&self) -> &'static str {
        match (self.weights_mapped(), self.copied_bytes > 0) {
            (true, _) => "mapped",
            (false, true) => "copied into huge pages",
            (false, false) => "copied",
        }
    }

    /// Whether the weights the stage would compute on in place in the mapped file are copied once into
    /// memory the kernel backs by huge pages instead: on the CPU with automatic placement, where the
    /// kernel offers them (Linux). On the 2-core VM decode ran 1.13x-1.45x faster so (`shoal bench`
    /// against `shoal bench --no-huge-pages`, in turns); the copy costs the same memory the mapped pages
    /// would, and the mapping's pages are released.
    fn copies_into_huge_pages(&self) -> bool {
        self.options.weights == WeightPlacement::Automatic
            && self.device().kind() == DeviceKind::Cpu
            && crate::os::huge_pages_available()
    }

    /// Bytes of weights copied as they are into huge pages at load (see
    /// [`Stage::copies_into_huge_pages`]).
    pub fn copied_bytes(&self) -> u64 {
        self.copied_bytes
    }

    /// Bytes of weights the stage copied into the CPU's repacked layout at load (see [`Repacking`]).
    pub fn repacked_bytes(&self) -> u64 {
        self.repacked_bytes
    }

    pub fn options(&self) -> &StageOptions {
        &self.options
    }

    pub fn weights(&self) -> &StageWeights {
        &self.weights
    }

    /// The tensor-parallel group this stage is a rank of.
    pub fn group(&self) -> Option<&Group> {
        self.group.as_ref()
    }

    /// The stage's memory; `kv_cache` counts the recurrent state of linear-attention layers too, and
    /// the most its checkpoints may take.
    pub fn memory(&self) -> StageMemory {
        StageMemory {
            weights: self.weights.mapped_bytes(),
            kv_cache: self.cache.bytes() + self.state.bytes() + self.checkpoint_bytes(),
            compute: self.compute_bytes,
        }
    }

    /// Positions the cache holds per sequence.
    pub fn context(&self) -> usize {
        self.cache.context()
    }

    /// Filled positions of sequence `seq`.
    pub fn len(&self, seq: usize) -> usize {
        self.cache.len(seq)
    }

    pub fn is_empty(&self, seq: usize) -> bool {
        self.cache.is_empty(seq)
    }

    /// Forgets sequence `seq` from position `len` on.
    pub fn truncate(&mut self, seq: usize, len: usize) {
        self.cache.truncate(seq, len);
        self.checkpoints.cut(seq, len);
    }

    /// The output of the last successful [`Stage::forward`].
    pub fn last_output(&self) -> &[f32] {
        &self.output
    }

    /// Runs this stage's layers on `input`, the positions `start..start + tokens` of sequence `seq`.
    /// Positions from `start` on are (re)written; `start` may not lie beyond what the sequence holds.
    ///
    /// Returns hidden states (`tokens` rows of the embedding width) or, on the last stage, the logits of
    /// the last position (the vocabulary's width).
    pub fn forward(&mut self, seq: usize, start: usize, input: StageInput<'_>) -> Result<&[f32], EngineError> {
        let segment = Segment { seq, start, tokens: input.tokens(), logits: true, drafted: 0 };
        self.forward_batch(&[segment], input)
    }

    /// Runs this stage's layers on one step of several sequences at once (continuous batching): the
    /// input's rows are the segments' tokens one segment after another, each segment a different
    /// sequence, and each sequence's tokens attend only to that sequence's cache. The weights are read
    /// once for all of them.
    ///
    /// Returns hidden states (every row) or, on the last stage, the logits of the last position of each
    /// segment that asks for them (and of its drafts' positions, see [`Segment`]), in order (none
    /// asking: the last row's, to be ignored).
    pub fn forward_batch(&mut self, segments: &[Segment], input: StageInput<'_>) -> Result<&[f32], EngineError> {
        self.check_batch(segments, &input)?;
        self.go_back_to_checkpoints(segments)?;
        let tokens = input.tokens();
        let is_last = self.is_last();
        self.output_rows.clear();
        let mut row = 0;
        for s in segments {
            row += s.tokens;
            self.output_rows.extend((row - s.outputs()..row).map(|r| r as i32));
        }
        if self.output_rows.is_empty() {
            self.output_rows.push(tokens as i32 - 1);
        }
        let cache = &self.cache;
        let segment_shapes = segments.iter().map(|s| SegmentShape {
            seq: s.seq,
            tokens: s.tokens,
            attended: cache.attended(s.start + s.tokens),
            attended_sliding: cache.attended_sliding(s.start + s.tokens),
            fresh: s.start == 0,
        });
        let outputs = if is_last { self.output_rows.len() } else { tokens };
        let same = self.graph.as_ref().is_some_and(|(shape, _)| {
            shape.tokens == tokens
                && shape.outputs == outputs
                && shape.segments.iter().copied().eq(segment_shapes.clone())
        });
        if !same {
            let shape = GraphShape { tokens, segments: segment_shapes.collect(), outputs };
            // Free the old graph first: it holds the compute buffer's place.
            self.graph = None;
            let graph = self.build(&shape);
            self.graph = Some((shape, graph));
        }
        self.fill_inputs(segments, &input);
        if let Some(group) = self.group.as_ref().filter(|g| g.is_leader()) {
            group.broadcast_step(segments, &input)?;
        }
        let (shape, graph) = self.graph.as_ref().expect("built above");
        let backend = &mut self.backend;
        backend.allocate(graph).map_err(EngineError::OutOfMemory)?;
        match &input {
            StageInput::Tokens(_) => backend.set_input(graph, input::TOKENS, &self.token_ids),
            StageInput::Hidden { values, .. } => backend.set_input(graph, input::HIDDEN, values),
        }
        backend.set_input(graph, input::POSITIONS, &self.positions);
        if graph.has_input(input::POSITION_SECTIONS) {
            backend.set_input(graph, input::POSITION_SECTIONS, &self.position_sections);
        }
        if graph.has_input(input::CACHE_ROWS) {
            backend.set_input(graph, input::CACHE_ROWS, &self.rows);
        }
        if graph.has_input(input::CACHE_ROWS_SLIDING) {
            backend.set_input(graph, input::CACHE_ROWS_SLIDING, &self.rows_sliding);
        }
        if graph.has_input(input::MASK) {
            backend.set_input(graph, input::MASK, &self.mask);
        }
        if graph.has_input(input::MASK_SLIDING) {
            backend.set_input(graph, input::MASK_SLIDING, &self.mask_sliding);
        }
        if graph.has_input(input::ROTATE_KEYS) {
            backend.set_input(graph, input::ROTATE_KEYS, &self.rotate_keys);
        }
        if graph.has_input(input::ROTATE_VALUES) {
            backend.set_input(graph, input::ROTATE_VALUES, &self.rotate_values);
        }
        if graph.has_input(input::ROTATE_INDEXER) {
            backend.set_input(graph, input::ROTATE_INDEXER, &self.rotate_indexer);
        }
        if is_last && shape.outputs < tokens {
            backend.set_input(graph, input::OUTPUT_ROWS, &self.output_rows);
        }
        // On the CPU, compute only on cores no other stage of this machine computes on; but a
        // tensor-parallel rank computes in step with its group, so it cannot wait for cores others hold
        // (they may be its group's, waiting for it).
        let shares_cores = backend.device().kind() == DeviceKind::Cpu && self.group.is_none();
        let cores = if shares_cores { Cores::machine() } else { None };
        let lease = cores.map(|c| c.lease(self.options.threads));
        let threads = lease.as_ref().map_or(self.options.threads, Lease::threads);
        let computed = backend.compute(graph, threads).map_err(EngineError::Backend);
        drop(lease);
        let checked = match &self.group {
            Some(group) => group.check(),
            None => Ok(()),
        };
        if let Err(error) = checked.and(computed) {
            self.forget_unfinished(segments);
            return Err(error);
        }
        backend.read_output(graph, &mut self.output);
        // The last layers' ranks each hold rows of the logits; before them every rank holds the same
        // hidden states.
        if let Some(group) = self.group.as_ref().filter(|_| is_last) {
            group.gather_logits(&mut self.output, shape.outputs, &mut self.gathered)?;
        }
        for s in segments {
            self.cache.wrote(s.seq, s.start, s.start + s.tokens);
        }
        if let Some(bad) = self.output.iter().position(|v| !v.is_finite()) {
            self.forget_unfinished(segments);
            return Err(EngineError::NonFinite { layers: self.layers.clone(), index: bad });
        }
        self.take_checkpoints(segments)?;
        Ok(&self.output)
    }

    /// After a step that failed: a recurrent state may have been advanced by it, which cannot be
    /// undone, so its sequences must start again from position 0.
    fn forget_unfinished(&mut self, segments: &[Segment]) {
        if self.state.is_present() {
            segments.iter().for_each(|s| self.truncate(s.seq, 0));
        }
    }

    fn fill_inputs(&mut self, segments: &[Segment], input: &StageInput<'_>) {
        if let StageInput::Tokens(ids) = input {
            self.token_ids.clear();
            self.token_ids.extend(ids.iter().map(|&id| id as i32));
        }
        self.positions.clear();
        for s in segments {
            self.positions.extend((s.start..s.start + s.tokens).map(|p| p as i32));
        }
        if self.config.rope_sections.is_some() {
            // A text token's sections: its position three times, then 0 (as llama.cpp expands it).
            let n = self.positions.len();
            self.position_sections.clear();
            self.position_sections.extend(self.positions.iter().cycle().take(3 * n));
            self.position_sections.extend(std::iter::repeat_n(0, n));
        }
        // Each layer kind's inputs only when this stage's graph has such layers (it then has the inputs).
        let Some((shape, graph)) = self.graph.as_ref() else { return };
        if graph.has_input(input::MASK) {
            self.rows.clear();
            self.mask.clear();
            for (s, shape) in segments.iter().zip(&shape.segments) {
                self.rows.extend((s.start..s.start + s.tokens).map(|p| self.cache.row(s.seq, p)));
                // Causal mask: token i (at position start + i) sees cache positions 0..=start + i.
                let attended = shape.attended;
                let at = self.mask.len();
                self.mask.resize(at + attended * s.tokens, f16::NEG_INFINITY);
                for i in 0..s.tokens {
                    let visible = s.start + i + 1;
                    let row = at + i * attended;
                    self.mask[row..row + visible].fill(f16::ZERO);
                }
            }
        }
        // Sliding-window layers keep a ring of recent positions.
        if graph.has_input(input::MASK_SLIDING) {
            self.rows_sliding.clear();
            self.mask_sliding.clear();
            for (s, shape) in segments.iter().zip(&shape.segments) {
                self.rows_sliding.extend((s.start..s.start + s.tokens).map(|p| self.cache.sliding_row(s.seq, p)));
                self.cache.push_sliding_mask(&mut self.mask_sliding, s.start, s.tokens, shape.attended_sliding);
            }
        }
    }
}
