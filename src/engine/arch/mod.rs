//! How each architecture computes a layer, one file each, over the layer's tensors as its declaration
//! in [`crate::model::arch`] types them: the graph reads fields of the bound group (`w.attention.q`),
//! never a tensor by name. The building blocks the graphs share (norm, attention over the KV cache,
//! dense and mixture-of-experts feed-forward, the gated delta-net) are in [`super::blocks`].

mod deepseek2;
mod deepseek32;
mod gemma3;
mod glm4moe;
mod gpt_oss;
mod kimi_k3;
mod llama;
mod minimax_m2;
mod minimax_m3;
mod qwen35;
mod qwen3moe;
mod qwen3next;

use super::blocks::StepContext;
use super::EngineError;
use crate::ggml::{GraphBuilder, SetTensorRef, Tensor};
use crate::model::arch::{self, Binder, Declare, Declared, TensorGroup};
use crate::model::{Architecture, ModelConfig};
use std::any::Any;

/// A layer's tensors as the stage bound them: the architecture's declared group, each slot a mapped
/// tensor.
pub type Bound<A> = <<A as Declare>::Layer as TensorGroup<Declared>>::Rebound<SetTensorRef>;

/// How an architecture computes.
pub trait Graph: Declare {
    /// Adds layer `layer` to the graph: `x` is its input, the result its output.
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g>;

    /// Whether a segment that begins its sequence may attend in a form of its own, whose compute buffer
    /// the stage must reserve as well (`SegmentShape::fresh`; DeepSeek's split latent form).
    fn attends_fresh_segments_apart(&self, _config: &ModelConfig) -> bool {
        false
    }

    /// The hidden state the final norm reads, from the last layer's output `x`: `x` itself, unless the
    /// architecture mixes more into it (Kimi K3's residual checkpoints, by `output_mix`, its
    /// `output_res_score`), in which case it also keeps only the rows whose logits are wanted.
    fn after_last_layer<'g>(
        &self,
        _g: &'g GraphBuilder,
        _step: &StepContext<'_, 'g>,
        _output_mix: Option<&SetTensorRef>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        x
    }
}

/// One layer's bound tensors, of whichever architecture's group.
pub struct LayerWeights(Box<dyn BoundLayer>);

/// A bound group, its type known to the architecture that bound it.
trait BoundLayer: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn tensors_mut(&mut self, f: &mut dyn FnMut(&mut SetTensorRef));
}

impl<L: TensorGroup<SetTensorRef> + Send + Sync + 'static> BoundLayer for L {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn tensors_mut(&mut self, f: &mut dyn FnMut(&mut SetTensorRef)) {
        self.visit_mut(&mut |_, t| f(t));
    }
}

impl LayerWeights {
    /// Calls `f` with each of the layer's tensors, writable (to bind it to a copy).
    pub fn tensors_mut(&mut self, mut f: impl FnMut(&mut SetTensorRef)) {
        self.0.tensors_mut(&mut f)
    }
}

/// [`Graph`] for any architecture, over layers bound by it.
pub trait StageGraph: Sync {
    /// Binds layer `layer`'s declared tensors with `binder`.
    fn bind(
        &self,
        config: &ModelConfig,
        layer: usize,
        binder: &mut dyn Binder<Declared, SetTensorRef, EngineError>,
    ) -> Result<LayerWeights, EngineError>;

    /// [`Graph::layer`] over weights this architecture bound.
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &LayerWeights,
        x: Tensor<'g>,
    ) -> Tensor<'g>;

    /// [`Graph::attends_fresh_segments_apart`].
    fn attends_fresh_segments_apart(&self, config: &ModelConfig) -> bool;

    /// [`Graph::after_last_layer`].
    fn after_last_layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        output_mix: Option<&SetTensorRef>,
        x: Tensor<'g>,
    ) -> Tensor<'g>;
}

impl<A: Graph> StageGraph for A
where
    Bound<A>: TensorGroup<SetTensorRef> + Send + Sync + 'static,
{
    fn bind(
        &self,
        config: &ModelConfig,
        layer: usize,
        binder: &mut dyn Binder<Declared, SetTensorRef, EngineError>,
    ) -> Result<LayerWeights, EngineError> {
        let bound: Bound<A> = Declare::layer(self, config, layer).bind(binder)?;
        Ok(LayerWeights(Box::new(bound)))
    }

    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &LayerWeights,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let w = w.0.as_any().downcast_ref::<Bound<A>>().expect("a stage's layers are bound by its architecture");
        Graph::layer(self, g, step, layer, w, x)
    }

    fn attends_fresh_segments_apart(&self, config: &ModelConfig) -> bool {
        Graph::attends_fresh_segments_apart(self, config)
    }

    fn after_last_layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        output_mix: Option<&SetTensorRef>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        Graph::after_last_layer(self, g, step, output_mix, x)
    }
}

/// The graph of `architecture`.
pub fn graph(architecture: Architecture) -> &'static dyn StageGraph {
    match architecture {
        Architecture::Llama => &arch::LLAMA,
        Architecture::Qwen2 => &arch::QWEN2,
        Architecture::Qwen3 => &arch::QWEN3,
        Architecture::Qwen3Moe => &arch::QWEN3MOE,
        Architecture::Glm4Moe => &arch::GLM4MOE,
        Architecture::GlmDsa => &arch::GLM_DSA,
        Architecture::Gemma3 => &arch::GEMMA3,
        Architecture::Deepseek2 => &arch::DEEPSEEK2,
        Architecture::Deepseek32 => &arch::DEEPSEEK32,
        Architecture::GptOss => &arch::GPT_OSS,
        Architecture::Qwen35 => &arch::QWEN35,
        Architecture::Qwen35Moe => &arch::QWEN35MOE,
        Architecture::Qwen3Next => &arch::QWEN3NEXT,
        Architecture::KimiK3 => &arch::KIMI_K3,
        Architecture::MinimaxM2 => &arch::MINIMAX_M2,
        Architecture::MinimaxM3 => &arch::MINIMAX_M3,
    }
}
