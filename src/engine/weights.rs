//! The tensors one stage maps from the model file: its layers, and the embeddings or output head when
//! it is the first or last stage. Nothing else of the file is bound, so nothing else becomes resident.

use super::arch::{self, LayerWeights};
use super::EngineError;
use crate::ggml::{Device, GatheredTensor, MappedTensor, Repacking, SetTensorRef, TensorSet, WeightPlacement};
use crate::model::arch::{Binder, Declared, OUTPUT_RESIDUAL_SCORE};
use crate::model::layout::{self, OUTPUT, OUTPUT_NORM, ROPE_FREQS, TOKEN_EMBEDDING};
use crate::model::{Model, ModelError, SliceSource, TensorSlice};
use std::ops::Range;

/// ggml's CPU buffers need tensors mapped in place to start on this boundary.
const MAPPED_ALIGNMENT: u64 = 32;

/// Binds layer `layer`'s declared tensors to those mapped in `sets` (`blk.{layer}.{short name}`).
/// Required tensors are always there: [`Model::open`] checked the file, and the stage mapped them.
struct FromSets<'s> {
    sets: &'s [TensorSet],
    layer: usize,
}

impl FromSets<'_> {
    fn get(&self, name: &str) -> Option<SetTensorRef> {
        let full = format!("blk.{}.{name}", self.layer);
        self.sets.iter().find_map(|set| set.get(&full))
    }
}

impl Binder<Declared, SetTensorRef, EngineError> for FromSets<'_> {
    fn required(&mut self, name: &'static str, _: &Declared) -> Result<SetTensorRef, EngineError> {
        self.get(name).ok_or_else(|| EngineError::Internal(format!("tensor blk.{}.{name} was not mapped", self.layer)))
    }

    fn optional(&mut self, name: &'static str, declared: &Declared) -> Result<Option<SetTensorRef>, EngineError> {
        match self.get(name) {
            None if declared.required => self.required(name, declared).map(Some),
            found => Ok(found),
        }
    }
}

/// The mapped tensors of a stage.
pub struct StageWeights {
    /// One mapping per file the stage's tensors are in (one, or some parts of a split set).
    sets: Vec<TensorSet>,
    names: Vec<String>,
    pub(super) layers: Vec<LayerWeights>,
    /// First stage: the token embedding table.
    pub(super) embedding: Option<SetTensorRef>,
    /// Last stage: final norm and output head (the embedding table when the model ties them).
    pub(super) output_norm: Option<SetTensorRef>,
    pub(super) output: Option<SetTensorRef>,
    pub(super) rope_factors: Option<SetTensorRef>,
    /// Last stage, Kimi K3: the scores of the final mix of residual checkpoints.
    pub(super) output_mix: Option<SetTensorRef>,
}

impl StageWeights {
    /// Maps the tensors of `layers` (already validated by [`Model::open`]) for `device` (in place, or
    /// copied into its memory: see [`TensorSet::map`]).
    pub fn map(
        model: &Model,
        layers: Range<usize>,
        device: Device,
        placement: WeightPlacement,
    ) -> Result<StageWeights, EngineError> {
        let by_part = model.stage_tensors_by_part(layers.clone());
        let mut sets = Vec::new();
        for (part, infos) in model.parts().iter().zip(&by_part).filter(|(_, infos)| !infos.is_empty()) {
            // A shard's sparse file has holes where other stages' tensors are: refuse to compute with them.
            crate::model::shard::check_present(part.path(), infos)?;
            let specs: Vec<MappedTensor<'_>> = infos
                .iter()
                .map(|t| MappedTensor { name: &t.name, dtype: t.dtype, shape: &t.shape, file_offset: t.offset })
                .collect();
            let set = TensorSet::map(part.mapping().clone(), &specs, device, placement).map_err(|reason| {
                EngineError::Model(crate::model::ModelError::Corrupt { path: part.path().into(), reason })
            })?;
            sets.push(set);
        }
        let names = by_part.iter().flatten().map(|t| t.name.clone()).collect();
        Self::bind(model, layers, sets, names, None)
    }

    /// Maps a tensor-parallel rank's share of `layers` (the whole model, or one group's range when
    /// groups are chained as pipeline stages): each tensor whole or its `slice` as the architecture
    /// declares its split. A share that is one aligned run of the file is mapped in place (rows of
    /// whole heads, of the feed-forward, whole experts, output rows); one in pieces (columns: the output
    /// projection's and the down projection's inputs) is copied once into a buffer of its own. The
    /// token embeddings are whole on every rank of the first layers; when the output head is tied to
    /// them, a rank of the last layers maps its rows of them as its head.
    pub fn map_slice(
        model: &Model,
        layers: Range<usize>,
        device: Device,
        placement: WeightPlacement,
        slice: &TensorSlice,
    ) -> Result<StageWeights, EngineError> {
        let config = model.config();
        let corrupt = |path: &std::path::Path, reason: String| {
            EngineError::Model(ModelError::Corrupt { path: path.into(), reason })
        };
        let declared = layout::stage_tensors(config, layers.clone());
        let in_place = placement != WeightPlacement::Copied && device.maps_host_memory();
        let tied = model.layout().tied_output;
        // (name, part index, info, its share) of every tensor the rank binds.
        let mut shares = Vec::new();
        for t in &declared {
            let file_name = if tied && t.name == OUTPUT { TOKEN_EMBEDDING } else { t.name.as_str() };
            let Some((part, info)) =
                model.parts().iter().enumerate().find_map(|(i, p)| Some((i, p.tensor(file_name)?)))
            else {
                continue;
            };
            let source = slice.source(info, t.split).map_err(|e| corrupt(model.parts()[part].path(), e))?;
            shares.push((t.name.clone(), part, info, source));
        }
        let mut sets = Vec::new();
        for (part, file) in model.parts().iter().enumerate() {
            let ours: Vec<_> = shares.iter().filter(|s| s.1 == part).collect();
            if ours.is_empty() {
                continue;
            }
            // A shard holds only some ranks' slices: refuse to compute with holes.
            let pieces = ours.iter().flat_map(|(name, _, _, source)| {
                source.pieces.iter().map(move |&(offset, bytes)| (name.as_str(), offset..offset + bytes))
            });
            crate::model::shard::check_ranges(file.path(), pieces)?;
            let mappable = |source: &SliceSource| {
                in_place && source.pieces.len() == 1 && source.pieces[0].0.is_multiple_of(MAPPED_ALIGNMENT)
            };
            let mapped: Vec<MappedTensor<'_>> = ours
                .iter()
                .filter(|s| mappable(&s.3))
                .map(|(name, _, info, source)| MappedTensor {
                    name,
                    dtype: info.dtype,
                    shape: &source.shape,
                    file_offset: source.pieces[0].0,
                })
                .collect();
            let gathered: Vec<GatheredTensor<'_>> = ours
                .iter()
                .filter(|s| !mappable(&s.3))
                .map(|(name, _, info, source)| GatheredTensor {
                    name,
                    dtype: info.dtype,
                    shape: &source.shape,
                    pieces: &source.pieces,
                })
                .collect();
            if !mapped.is_empty() {
                sets.push(
                    TensorSet::map(file.mapping().clone(), &mapped, device, placement)
                        .map_err(|e| corrupt(file.path(), e))?,
                );
            }
            if !gathered.is_empty() {
                sets.push(TensorSet::gather(file.mapping(), &gathered, device).map_err(|e| corrupt(file.path(), e))?);
            }
        }
        let names = shares.iter().map(|s| s.0.clone()).collect();
        // Tied or not, the head is bound under its own name: the rank's rows of it.
        Self::bind(model, layers, sets, names, Some(slice))
    }

    /// Binds the mapped `sets` to the layers, embeddings and head of a stage running `layers`.
    fn bind(
        model: &Model,
        layers: Range<usize>,
        sets: Vec<TensorSet>,
        names: Vec<String>,
        slice: Option<&TensorSlice>,
    ) -> Result<StageWeights, EngineError> {
        let get = |name: &str| sets.iter().find_map(|set| set.get(name));
        let need = |name: String| get(&name).ok_or(EngineError::Internal(format!("tensor {name} was not mapped")));
        let config = model.config();
        let graph = arch::graph(config.architecture);
        let layer_weights = layers
            .clone()
            .map(|layer| graph.bind(config, layer, &mut FromSets { sets: &sets, layer }))
            .collect::<Result<Vec<_>, _>>()?;
        let last = layers.end == config.layers;
        let output = match (last, model.layout().tied_output && slice.is_none()) {
            (false, _) => None,
            (true, true) => Some(need(TOKEN_EMBEDDING.into())?),
            (true, false) => Some(need(OUTPUT.into())?),
        };
        Ok(StageWeights {
            names,
            layers: layer_weights,
            embedding: if layers.start == 0 { Some(need(TOKEN_EMBEDDING.into())?) } else { None },
            output_norm: if last { Some(need(OUTPUT_NORM.into())?) } else { None },
            output,
            rope_factors: get(ROPE_FREQS),
            output_mix: if last { get(OUTPUT_RESIDUAL_SCORE) } else { None },
            sets,
        })
    }

    /// Every tensor this stage reads from a mapped file in place, by name.
    pub fn mapped_tensors(&self) -> Vec<(String, SetTensorRef)> {
        let mapped = self.sets.iter().filter(|s| s.is_mapped());
        mapped.flat_map(|s| s.tensors().map(|(name, t)| (name.to_string(), t))).collect()
    }

    /// Copies `weights` (some of [`StageWeights::mapped_tensors`], each one [`Repacking::eligible`]
    /// found) into `repacking`'s layout, binds the layers and head to the copies, and releases the
    /// originals' pages of the mapping. `progress` receives the bytes copied so far.
    pub fn repack(
        &mut self,
        repacking: &Repacking,
        weights: &[(String, SetTensorRef)],
        progress: impl FnMut(u64),
    ) -> Result<(), EngineError> {
        if weights.is_empty() {
            return Ok(());
        }
        let named: Vec<(&str, SetTensorRef)> = weights.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let copies = TensorSet::repacked(repacking, &named, progress).map_err(EngineError::OutOfMemory)?;
        self.move_to(weights, copies)
    }

    /// Copies every weight still computed on in place in a mapped file into the CPU's memory as it is,
    /// where the kernel backs it by huge pages, binds the layers and head to the copies and releases
    /// the mapping's pages; returns the bytes copied. `progress` receives the bytes copied so far.
    pub fn copy_mapped_to_cpu(&mut self, progress: impl FnMut(u64)) -> Result<u64, EngineError> {
        let weights = self.mapped_tensors();
        if weights.is_empty() {
            return Ok(0);
        }
        let named: Vec<(&str, SetTensorRef)> = weights.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let copies = TensorSet::copied_to_cpu(&named, progress).map_err(EngineError::OutOfMemory)?;
        let bytes = copies.data_bytes();
        self.move_to(&weights, copies)?;
        Ok(bytes)
    }

    /// Binds the layers and head to `copies` of `weights` and releases the originals.
    fn move_to(&mut self, weights: &[(String, SetTensorRef)], copies: TensorSet) -> Result<(), EngineError> {
        // (original, its copy) of each weight.
        let moved = weights
            .iter()
            .map(|(name, original)| {
                let copy = copies.get(name).ok_or_else(|| EngineError::Internal(format!("{name} was not copied")));
                Ok((original, copy?))
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        let rebind = |slot: &mut SetTensorRef| {
            if let Some((_, copy)) = moved.iter().find(|(original, _)| original.is(slot)) {
                *slot = copy.clone();
            }
        };
        let globals = [
            &mut self.embedding,
            &mut self.output_norm,
            &mut self.output,
            &mut self.rope_factors,
            &mut self.output_mix,
        ];
        globals.into_iter().flatten().for_each(rebind);
        self.layers.iter_mut().for_each(|l| l.tensors_mut(rebind));
        for set in &mut self.sets {
            weights.iter().for_each(|(name, _)| set.release(name));
        }
        self.sets.push(copies);
        Ok(())
    }

    /// Exact bytes of the tensors this stage binds (mapped, copied or repacked).
    pub fn mapped_bytes(&self) -> u64 {
        self.sets.iter().map(TensorSet::data_bytes).sum()
    }

    /// Bytes of the weights the stage computes on in place in a mapped file: what [`StageWeights::prefault`]
    /// reads (the rest was read into copies at load).
    pub fn bytes_in_place(&self) -> u64 {
        self.sets.iter().filter(|s| s.is_mapped()).map(TensorSet::data_bytes).sum()
    }

    /// Reads the weights the stage computes on in place from disk into the page cache now, reporting
    /// progress (0..=1, over [`StageWeights::bytes_in_place`]; 1 at the end, also when there are none).
    pub fn prefault(&self, mut progress: impl FnMut(f32)) {
        let total = self.bytes_in_place().max(1) as f32;
        let mut done = 0u64;
        for set in self.sets.iter().filter(|s| s.is_mapped()) {
            let bytes = set.data_bytes();
            set.prefault(|fraction| progress((done as f32 + fraction * bytes as f32) / total));
            done += bytes;
        }
        progress(1.0);
    }

    /// Names of the tensors this stage mapped.
    pub fn tensor_names(&self) -> &[String] {
        &self.names
    }
}
