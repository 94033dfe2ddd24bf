//! Several stages in one process, chained exactly as stages on different machines are: each boundary's
//! hidden states are encoded to bytes and decoded again, so `--split` exercises the wire format. Or one
//! tensor-parallel group whose ranks are threads of this process, linked by channels
//! ([`LocalPipeline::load_group`]): the group's own arithmetic, without a network; or groups chained as
//! stages ([`LocalPipeline::load_chain`]).

use super::hidden::{HiddenStates, WireFormat};
use super::stage::{Segment, Stage, StageInput, StageOptions};
use super::EngineError;
use crate::model::Model;
use std::ops::Range;

/// The layer ranges `[0, s1), [s1, s2), …, [sn, layers)` for split points `s1 < s2 < … < sn`.
pub fn split_ranges(layers: usize, splits: &[usize]) -> Result<Vec<Range<usize>>, EngineError> {
    let mut bounds = vec![0];
    bounds.extend_from_slice(splits);
    bounds.push(layers);
    if bounds.windows(2).any(|w| w[0] >= w[1]) {
        return Err(EngineError::InvalidSplit { splits: splits.to_vec(), layers });
    }
    Ok(bounds.windows(2).map(|w| w[0]..w[1]).collect())
}

/// Stages covering the whole model, run one after the other.
pub struct LocalPipeline {
    stages: Vec<Stage>,
    format: WireFormat,
    wire: Vec<u8>,
    hidden: HiddenStates,
    boundary_bytes: u64,
    /// The other ranks of tensor-parallel groups, on threads (each group's leader is one of the stages).
    followers: Vec<std::thread::JoinHandle<Result<(), String>>>,
}

impl Drop for LocalPipeline {
    fn drop(&mut self) {
        for group in self.stages.iter().filter_map(Stage::group) {
            group.stop();
        }
        for follower in self.followers.drain(..) {
            let _ = follower.join();
        }
    }
}

impl LocalPipeline {
    /// Loads one stage per range of [`split_ranges`]`(splits)`.
    pub fn load(
        model: &Model,
        splits: &[usize],
        options: &StageOptions,
        format: WireFormat,
    ) -> Result<LocalPipeline, EngineError> {
        let stages = split_ranges(model.config().layers, splits)?
            .into_iter()
            .map(|range| Stage::load(model, range, options.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::of(stages, format))
    }

    fn of(stages: Vec<Stage>, format: WireFormat) -> LocalPipeline {
        LocalPipeline {
            stages,
            format,
            wire: Vec::new(),
            hidden: HiddenStates::default(),
            boundary_bytes: 0,
            followers: Vec::new(),
        }
    }

    /// The model as a tensor-parallel group of ranks holding `shares` of it (one each, relative), each
    /// on a thread of its own (with `options.threads` compute threads), linked by channels; steps go to
    /// the leader.
    pub fn load_group(model: &Model, shares: &[f64], options: &StageOptions) -> Result<LocalPipeline, EngineError> {
        Self::load_chain(model, &[(0..model.config().layers, shares.to_vec())], options)
    }

    /// The model as a chain of stages, each a layer range (covering the model in order) and the shares
    /// of its ranks: one share is a whole stage, several a tensor-parallel group over that range whose
    /// leader is the chain's stage and whose other ranks run on threads of their own, linked by
    /// channels. Hidden states pass from one stage (a group's leader) to the next as between stages.
    pub fn load_chain(
        model: &Model,
        chain: &[(Range<usize>, Vec<f64>)],
        options: &StageOptions,
    ) -> Result<LocalPipeline, EngineError> {
        let mut stages = Vec::new();
        let mut followers = Vec::new();
        for (layers, shares) in chain {
            let stage = match shares.len() {
                1 => Stage::load(model, layers.clone(), options.clone())?,
                _ => Self::load_ranks(model, layers, shares, options, &mut followers)?,
            };
            stages.push(stage);
        }
        let mut pipeline = Self::from_stages(stages, WireFormat::F32)?;
        pipeline.followers = followers;
        Ok(pipeline)
    }

    /// A group's ranks over `layers`: the others on threads (pushed to `followers`), the leader returned.
    fn load_ranks(
        model: &Model,
        layers: &Range<usize>,
        shares: &[f64],
        options: &StageOptions,
        followers: &mut Vec<std::thread::JoinHandle<Result<(), String>>>,
    ) -> Result<Stage, EngineError> {
        let ranks = shares.len();
        let slices = crate::model::slice::plan(model, shares).map_err(EngineError::BadInput)?;
        let mut links = super::parallel::local::channel_group(ranks, std::time::Duration::from_secs(600)).into_iter();
        let leader = links.next().expect("a group has a leader");
        for link in links {
            let (path, slices, options) = (model.path().to_path_buf(), slices.clone(), options.clone());
            let layers = layers.clone();
            let (loaded_tx, loaded_rx) = std::sync::mpsc::channel();
            followers.push(std::thread::spawn(move || {
                let loaded = Model::open(&path).map_err(EngineError::from).and_then(|model| {
                    let group = super::parallel::Group::new(slices, Box::new(link)).map_err(EngineError::BadInput)?;
                    Stage::load_rank(&model, layers, options, group)
                });
                match loaded {
                    Ok(mut stage) => {
                        let _ = loaded_tx.send(Ok(()));
                        super::parallel::follow(&mut stage)
                    }
                    Err(e) => {
                        let _ = loaded_tx.send(Err(e.to_string()));
                        Err("not loaded".into())
                    }
                }
            }));
            loaded_rx
                .recv()
                .map_err(|_| EngineError::Internal("a rank's thread ended".into()))?
                .map_err(EngineError::BadInput)?;
        }
        let group = super::parallel::Group::new(slices, Box::new(leader)).map_err(EngineError::BadInput)?;
        Stage::load_rank(model, layers.clone(), options.clone(), group)
    }

    /// Chains stages loaded elsewhere (each from its own file, say): they must cover the model's layers
    /// in order, without gaps.
    pub fn from_stages(stages: Vec<Stage>, format: WireFormat) -> Result<LocalPipeline, EngineError> {
        let Some(last) = stages.last() else { return Err(EngineError::BadInput("a pipeline needs a stage".into())) };
        let layers = last.config().layers;
        let starts = std::iter::once(0).chain(stages.iter().map(|s| s.layers().end));
        if stages.iter().zip(starts).any(|(s, start)| s.layers().start != start) || last.layers().end != layers {
            let splits: Vec<usize> = stages.iter().map(|s| s.layers().start).skip(1).collect();
            return Err(EngineError::InvalidSplit { splits, layers });
        }
        Ok(Self::of(stages, format))
    }

    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// Bytes of hidden states that crossed stage boundaries so far.
    pub fn boundary_bytes(&self) -> u64 {
        self.boundary_bytes
    }

    pub fn context(&self) -> usize {
        self.stages[0].context()
    }

    pub fn batch(&self) -> usize {
        self.stages[0].options().batch
    }

    /// Forgets sequence `seq` from position `len` on, in every stage.
    pub fn truncate(&mut self, seq: usize, len: usize) {
        self.stages.iter_mut().for_each(|s| s.truncate(seq, len));
    }

    /// Runs `tokens` at positions `start..` of `seq` through every stage; returns the last token's logits.
    pub fn forward(&mut self, seq: usize, start: usize, tokens: &[u32]) -> Result<&[f32], EngineError> {
        self.forward_batch(&[Segment { seq, start, tokens: tokens.len(), logits: true, drafted: 0 }], tokens)
    }

    /// Runs one batched step of several sequences (see [`Stage::forward_batch`]) through every stage;
    /// returns the logits of each segment that asks for them, one row after another.
    pub fn forward_batch(&mut self, segments: &[Segment], tokens: &[u32]) -> Result<&[f32], EngineError> {
        let count = self.stages.len();
        let (format, wire, hidden) = (self.format, &mut self.wire, &mut self.hidden);
        for (i, stage) in self.stages.iter_mut().enumerate() {
            let input = if i == 0 {
                StageInput::Tokens(tokens)
            } else {
                hidden.decode_from(wire).map_err(|e| EngineError::BadInput(e.to_string()))?;
                StageInput::Hidden { values: &hidden.values, tokens: hidden.tokens }
            };
            let width = stage.config().hidden_width(stage.layers().end);
            let out = stage.forward_batch(segments, input)?;
            if i + 1 < count {
                HiddenStates::encode(width, out.len() / width, out, format, wire);
                self.boundary_bytes += wire.len() as u64;
            }
        }
        Ok(self.stages[count - 1].last_output())
    }
}
