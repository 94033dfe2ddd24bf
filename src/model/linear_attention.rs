//! Linear attention with a recurrent state (the gated delta-net of Qwen3.5 / 3.6 and Qwen3-Next,
//! Kimi delta attention): its hyper-parameters as
//! the GGUF declares them (`ssm.*`), which layers use it, and the state one sequence keeps per such
//! layer in place of KV rows — constant in the context length.

use super::config::Keys;
use super::ModelError;

/// A gated delta-net's hyper-parameters (llama.cpp's `ssm_d_conv`, `ssm_d_inner`, `ssm_d_state`,
/// `ssm_n_group`, `ssm_dt_rank`), and which layers are linear.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LinearAttention {
    /// Width of the short causal convolution over positions.
    pub conv_kernel: usize,
    /// Width of the values of all value heads together.
    pub inner: usize,
    /// Width of one key (and value) head.
    pub head_width: usize,
    /// Key heads (each shared by `value_heads / key_heads` value heads).
    pub key_heads: usize,
    pub value_heads: usize,
    /// For each layer: whether it is linear (the others attend over the KV cache).
    pub layers: Vec<bool>,
    /// Whether the value heads come grouped by the key head they share (Qwen3-Next: each key head
    /// repeated for its group), rather than tiled (Qwen3.5: value head j reads key head j mod key heads).
    pub value_heads_grouped: bool,
    /// Whether queries, keys, values and the output gate come from one interleaved projection
    /// (`ssm_in`, Qwen3-Next files converted before llama.cpp split it) instead of `attn_qkv` and `attn_gate`.
    pub fused_input: bool,
    /// Kimi delta attention's `kda.gate_lower_bound` (K3: -5): the decay of each key channel is this
    /// times σ(exp(A_log)·(f + dt_bias)) instead of -exp(A_log)·softplus(f + dt_bias).
    pub decay_lower_bound: Option<f32>,
    /// Whether a tensor-parallel rank holds only its own heads' keys (Kimi: a key per head), rather
    /// than every key head (Qwen3.5: value heads share key heads across any cut).
    pub keys_divided: bool,
    /// The first value head this shape computes: 0, or a tensor-parallel rank's first.
    pub first_value_head: usize,
}

impl LinearAttention {
    /// Reads the `ssm.*` keys and which of the `layers` are linear: `attention.recurrent_layers` when the
    /// file lists them, else every layer but each `full_attention_interval`-th (4 unless given).
    pub fn read(keys: &Keys<'_>, layers: usize) -> Result<LinearAttention, ModelError> {
        let conv_kernel = keys.arch_count("ssm.conv_kernel")?;
        let inner = keys.arch_count("ssm.inner_size")?;
        let head_width = keys.arch_count("ssm.state_size")?;
        let key_heads = keys.arch_count("ssm.group_count")?;
        let value_heads = keys.arch_count("ssm.time_step_rank")?;
        if !value_heads.is_multiple_of(key_heads) {
            return Err(keys.arch_invalid("ssm.group_count", "does not divide ssm.time_step_rank (the value heads)"));
        }
        if inner != value_heads * head_width {
            return Err(keys.arch_invalid(
                "ssm.inner_size",
                &format!("is {inner}, not ssm.time_step_rank × ssm.state_size = {}", value_heads * head_width),
            ));
        }
        if conv_kernel < 2 {
            return Err(keys.arch_invalid("ssm.conv_kernel", "is less than 2"));
        }
        let flags = match keys.arch_bools("attention.recurrent_layers") {
            Some(flags) if flags.len() >= layers => flags[..layers].to_vec(),
            Some(_) => return Err(keys.arch_invalid("attention.recurrent_layers", "has fewer entries than layers")),
            None => {
                let interval = keys.arch_optional_count("full_attention_interval")?.unwrap_or(4);
                (0..layers).map(|l| !(l + 1).is_multiple_of(interval)).collect()
            }
        };
        Ok(LinearAttention {
            conv_kernel,
            inner,
            head_width,
            key_heads,
            value_heads,
            layers: flags,
            value_heads_grouped: false,
            fused_input: false,
            decay_lower_bound: None,
            keys_divided: false,
            first_value_head: 0,
        })
    }

    /// The share of a tensor-parallel rank holding `query_heads` of the model's `heads` attention heads:
    /// the linear layers' value heads in proportion (the architectures that divide them have a whole
    /// number per attention head), and either the matching key heads or, when keys are shared across
    /// any cut, all of them.
    pub fn for_rank(&self, query_heads: std::ops::Range<usize>, heads: usize) -> LinearAttention {
        let scale = |n: usize, at: usize| n * at / heads.max(1);
        let first_value_head = scale(self.value_heads, query_heads.start);
        let value_heads = scale(self.value_heads, query_heads.end) - first_value_head;
        let key_heads = if self.keys_divided {
            scale(self.key_heads, query_heads.end) - scale(self.key_heads, query_heads.start)
        } else {
            self.key_heads
        };
        LinearAttention {
            key_heads,
            value_heads,
            inner: value_heads * self.head_width,
            first_value_head,
            ..self.clone()
        }
    }

    /// Whether `layer` is linear.
    pub fn is_linear(&self, layer: usize) -> bool {
        self.layers.get(layer).copied().unwrap_or(false)
    }

    /// Channels of the convolution: the keys and queries of every key head and the values.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_heads * self.head_width + self.inner
    }

    /// Values of one sequence's convolution state: each channel's last `conv_kernel - 1` inputs.
    pub fn conv_state_values(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_channels()
    }

    /// Values of one sequence's delta-rule state: a head-width square matrix per value head.
    pub fn delta_state_values(&self) -> usize {
        self.head_width * self.head_width * self.value_heads
    }

    /// Bytes one sequence's state takes in one linear layer (F32, as llama.cpp keeps it).
    pub fn state_bytes(&self) -> u64 {
        4 * (self.conv_state_values() + self.delta_state_values()) as u64
    }
}
