//! A stage's recurrent state, beside its KV cache: for each of its linear-attention layers (Qwen3.5's
//! gated delta-net), per sequence, the convolution's last inputs and the delta rule's matrix per value
//! head, in F32 as llama.cpp keeps them. Its size does not grow with the context: a step reads the
//! state its sequence's previous step left and writes the state after its own last token. A state
//! cannot be taken back to an earlier position, so a sequence continues where it stands, goes back to a
//! checkpoint the stage copied aside (`stage/checkpoints.rs`) or starts again from position 0, where a
//! step reads zeros instead of what an earlier request left.

use super::EngineError;
use crate::ggml::{DType, Device, GraphBuilder, SetTensor, SetTensorRef, Tensor, TensorSet};
use crate::model::{LinearAttention, ModelConfig};
use std::ops::Range;

pub struct RecurrentState {
    /// None when the stage has no linear layer.
    set: Option<TensorSet>,
    /// For each of the stage's layers: its convolution and delta-rule states ([values, sequences]),
    /// when it is linear.
    conv: Vec<Option<SetTensorRef>>,
    delta: Vec<Option<SetTensorRef>>,
    shape: Option<LinearAttention>,
}

impl RecurrentState {
    /// A zeroed state on `device` for the linear layers among `layers` of `config`, for `sequences`
    /// sequences.
    pub fn new(
        config: &ModelConfig,
        layers: Range<usize>,
        sequences: usize,
        device: Device,
    ) -> Result<RecurrentState, EngineError> {
        let none = || RecurrentState {
            set: None,
            conv: vec![None; layers.len()],
            delta: vec![None; layers.len()],
            shape: None,
        };
        let Some(linear) = config.linear_attention.as_ref().filter(|l| layers.clone().any(|n| l.is_linear(n))) else {
            return Ok(none());
        };
        let sequences = sequences.max(1) as u64;
        let mut specs: Vec<(String, [u64; 2])> = Vec::new();
        for (local, layer) in layers.clone().enumerate() {
            if linear.is_linear(layer) {
                specs.push((format!("conv_state_{local}"), [linear.conv_state_values() as u64, sequences]));
                specs.push((format!("delta_state_{local}"), [linear.delta_state_values() as u64, sequences]));
            }
        }
        let tensors: Vec<SetTensor<'_>> =
            specs.iter().map(|(name, shape)| SetTensor { name, dtype: DType::F32, shape }).collect();
        let set = TensorSet::allocate(&tensors, device)
            .map_err(|e| EngineError::OutOfMemory(format!("recurrent state: {e}")))?;
        let conv = (0..layers.len()).map(|l| set.get(&format!("conv_state_{l}"))).collect();
        let delta = (0..layers.len()).map(|l| set.get(&format!("delta_state_{l}"))).collect();
        Ok(RecurrentState { set: Some(set), conv, delta, shape: Some(linear.clone()) })
    }

    /// Bytes of the state (0 without linear layers).
    pub fn bytes(&self) -> u64 {
        self.set.as_ref().map_or(0, TensorSet::data_bytes)
    }

    /// Whether the stage has linear layers (then a sequence cannot go back to an earlier position).
    pub fn is_present(&self) -> bool {
        self.set.is_some()
    }

    /// The linear layers' shape this stage computes: the model's, or a tensor-parallel rank's share of
    /// their heads (only a stage with linear layers has one, and only they ask).
    pub fn shape(&self) -> &LinearAttention {
        self.shape.as_ref().expect("only linear layers read their state")
    }

    /// The convolution state of the stage's layer `local` for `seq` before this step, shaped [kernel -
    /// 1, channels, 1]: zeros when the step begins the sequence (`fresh`).
    pub fn conv_before<'g>(&self, g: &'g GraphBuilder, local: usize, seq: usize, fresh: bool) -> Tensor<'g> {
        let s = self.shape();
        let stored = self.slot(g, &self.conv[local], seq, s.conv_state_values());
        let state = g.reshape_3d(stored, (s.conv_kernel - 1) as i64, s.conv_channels() as i64, 1);
        if fresh {
            g.fill(state, 0.0)
        } else {
            state
        }
    }

    /// The delta-rule state of layer `local` for `seq` before this step, shaped [head, head, value
    /// heads, 1]: zeros when the step begins the sequence.
    pub fn delta_before<'g>(&self, g: &'g GraphBuilder, local: usize, seq: usize, fresh: bool) -> Tensor<'g> {
        let s = self.shape();
        let stored = self.slot(g, &self.delta[local], seq, s.delta_state_values());
        let w = s.head_width as i64;
        let state = g.reshape_4d(stored, [w, w, s.value_heads as i64, 1]);
        if fresh {
            g.fill(state, 0.0)
        } else {
            state
        }
    }

    /// Adds to the graph the writes of layer `local`'s states for `seq` after this step: `conv` and
    /// `delta` hold as many values as [`Self::conv_before`] and [`Self::delta_before`] give.
    pub fn store<'g>(&self, g: &'g GraphBuilder, local: usize, seq: usize, conv: Tensor<'g>, delta: Tensor<'g>) {
        let s = self.shape();
        g.expand(g.copy_into(conv, self.slot(g, &self.conv[local], seq, s.conv_state_values())));
        g.expand(g.copy_into(delta, self.slot(g, &self.delta[local], seq, s.delta_state_values())));
    }

    /// Bytes of one sequence's state in every linear layer of the stage.
    pub fn sequence_bytes(&self) -> usize {
        self.tensors().map(|t| t.bytes() / t.shape()[1] as usize).sum()
    }

    /// Appends to `out` sequence `seq`'s state in every linear layer (convolution, then delta rule).
    pub fn copy_out(&self, seq: usize, out: &mut Vec<u8>) -> Result<(), String> {
        for tensor in self.tensors() {
            let len = tensor.bytes() / tensor.shape()[1] as usize;
            let at = out.len();
            out.resize(at + len, 0);
            tensor.read_bytes(seq * len, &mut out[at..])?;
        }
        Ok(())
    }

    /// Writes back into `seq` what [`RecurrentState::copy_out`] gave, from the start of `data`; how many
    /// bytes it read.
    pub fn copy_in(&mut self, seq: usize, data: &[u8]) -> Result<usize, String> {
        if data.len() < self.sequence_bytes() {
            return Err(format!("a saved state needs {} bytes, {} came", self.sequence_bytes(), data.len()));
        }
        let mut at = 0;
        for tensor in self.tensors() {
            let len = tensor.bytes() / tensor.shape()[1] as usize;
            tensor.write_bytes(seq * len, &data[at..at + len])?;
            at += len;
        }
        Ok(at)
    }

    fn tensors(&self) -> impl Iterator<Item = &SetTensorRef> {
        self.conv.iter().zip(&self.delta).flat_map(|(c, d)| [c, d]).flatten()
    }

    /// Sequence `seq`'s values of a state tensor, as a flat view.
    fn slot<'g>(&self, g: &'g GraphBuilder, tensor: &Option<SetTensorRef>, seq: usize, values: usize) -> Tensor<'g> {
        let tensor = tensor.as_ref().expect("a linear layer has its states");
        g.view(g.stored(tensor), &[values as i64], &[], seq * values * 4)
    }
}
