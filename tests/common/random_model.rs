//! Random-weight GGUF models of architectures that have no small real model here (mixture-of-experts),
//! written byte for byte the same on every run (a seeded generator), with SmolLM2's tokenizer copied in
//! and embeddings scaled so greedy decoding has clear winners. llama.cpp runs them as it runs any model,
//! so its outputs for them (tests/fixtures/oracle/random/) check the engine op for op.

use super::gguf_writer::{GgufWriter, Meta};
use std::path::{Path, PathBuf};

/// The shape of a random model.
#[derive(Clone, Debug)]
pub struct RandomModel {
    pub architecture: &'static str,
    pub layers: usize,
    pub embedding: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub feed_forward: usize,
    pub experts: usize,
    pub experts_used: usize,
    pub expert_feed_forward: usize,
    /// GLM: dense layers first (every layer is dense without experts), a shared expert, next-token-prediction layers at the end, biases on
    /// Q/K/V, RoPE on part of each head, sigmoid routing with a selection bias.
    pub leading_dense: usize,
    pub shared_experts: usize,
    pub nextn_layers: usize,
    pub rope_dims: usize,
    /// Gemma 3: the sliding window of five layers in six (0: none).
    pub sliding_window: usize,
    /// DeepSeek's latent attention (then `head_dim` is the cached key width).
    pub mla: Option<RandomMla>,
    /// Qwen3.5's linear attention in all layers but every `interval`-th.
    pub linear: Option<RandomLinear>,
    /// Kimi K3's own parts (its delta attention's shape comes from `linear`, its latent attention's
    /// from `mla`): see [`super::random_kimi`].
    pub kimi: Option<super::random_kimi::RandomKimi>,
    /// DeepSeek V3.2's lightning indexer (see [`super::random_sparse`]).
    pub indexer: Option<super::random_sparse::RandomIndexer>,
    /// MiniMax M3's block-sparse attention (see [`super::random_sparse`]).
    pub msa: Option<super::random_sparse::RandomMsa>,
    pub seed: u64,
}

/// A `qwen35` model's gated delta-net: its convolution, heads, and how often a full-attention layer
/// comes; with experts (`qwen35moe`) a shared expert of `shared_width` behind a sigmoid gate.
#[derive(Clone, Copy, Debug)]
pub struct RandomLinear {
    pub conv_kernel: usize,
    pub head_width: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub interval: usize,
    /// RoPE sections (pairs turned by each of the four position sections; Qwen3.5 only).
    pub sections: [u32; 4],
    pub shared_width: usize,
    /// Qwen3-Next: one interleaved `ssm_in` instead of `attn_qkv` and `attn_gate`.
    pub fused_input: bool,
}

/// A `deepseek2` model's own shape: its attention, YaRN, and how its experts are routed.
#[derive(Clone, Copy, Debug)]
pub struct RandomMla {
    /// 0: a plain `attn_q`.
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    /// Per head: the query/key part without RoPE, and the value width.
    pub nope: usize,
    pub value_head: usize,
    /// The split `attn_k_b`/`attn_v_b` form (else one `attn_kv_b`).
    pub absorbed: bool,
    /// YaRN scaling by 4 from 1024 positions, with DeepSeek V3's `yarn_log_multiplier`.
    pub yarn: bool,
    /// Sigmoid routing with a selection bias, in groups (count, used), as V3; else V2's softmax.
    pub sigmoid_groups: Option<(usize, usize)>,
}

/// Qwen3-MoE in miniature: 4 layers, 16 experts of which 4 are used per token.
pub fn qwen3moe() -> RandomModel {
    RandomModel {
        architecture: "qwen3moe",
        layers: 4,
        embedding: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        feed_forward: 128,
        experts: 16,
        experts_used: 4,
        expert_feed_forward: 32,
        leading_dense: 0,
        shared_experts: 0,
        nextn_layers: 0,
        rope_dims: 16,
        sliding_window: 0,
        mla: None,
        linear: None,
        kimi: None,
        indexer: None,
        msa: None,
        seed: 0x5eed_0001,
    }
}

/// GLM-4.5 in miniature: 5 layers (the first 2 dense) and one next-token-prediction layer, 16 experts
/// of which 4 are used plus a shared one, RoPE on half of each head.
pub fn glm4moe() -> RandomModel {
    RandomModel {
        architecture: "glm4moe",
        layers: 5,
        embedding: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        feed_forward: 96,
        experts: 16,
        experts_used: 4,
        expert_feed_forward: 32,
        leading_dense: 2,
        shared_experts: 1,
        nextn_layers: 1,
        rope_dims: 8,
        sliding_window: 0,
        mla: None,
        linear: None,
        kimi: None,
        indexer: None,
        msa: None,
        seed: 0x5eed_0002,
    }
}

/// Gemma 3 in miniature: 7 layers (layer 5 global, the others sliding), a sliding window of 5
/// positions so that short prompts cross it.
pub fn gemma3() -> RandomModel {
    RandomModel {
        architecture: "gemma3",
        layers: 7,
        embedding: 64,
        heads: 4,
        kv_heads: 1,
        head_dim: 32,
        feed_forward: 128,
        experts: 0,
        experts_used: 0,
        expert_feed_forward: 0,
        leading_dense: 0,
        shared_experts: 0,
        nextn_layers: 0,
        rope_dims: 32,
        sliding_window: 5,
        mla: None,
        linear: None,
        kimi: None,
        indexer: None,
        msa: None,
        seed: 0x5eed_0003,
    }
}

/// Mixtral in miniature (a `llama` with experts): 4 layers, 8 experts of which 2 are used, each as wide
/// as the feed-forward; no per-head norms.
pub fn mixtral() -> RandomModel {
    RandomModel {
        architecture: "llama",
        feed_forward: 48,
        experts: 8,
        experts_used: 2,
        expert_feed_forward: 48,
        rope_dims: 16,
        seed: 0x5eed_0005,
        ..qwen3moe()
    }
}

/// DeepSeek V3 in miniature: 4 layers (the first dense) and one next-token-prediction layer; a query
/// bottleneck, the split latent form (the cache holds 32 + 8 values per position), YaRN; 16 experts in
/// 4 groups of which 2 are searched, 4 used, sigmoid routing with a selection bias, one shared expert.
pub fn deepseek2() -> RandomModel {
    RandomModel {
        architecture: "deepseek2",
        layers: 4,
        kv_heads: 1,
        head_dim: 40,
        feed_forward: 96,
        leading_dense: 1,
        shared_experts: 1,
        nextn_layers: 1,
        rope_dims: 8,
        mla: Some(RandomMla {
            q_lora_rank: 32,
            kv_lora_rank: 32,
            nope: 16,
            value_head: 16,
            absorbed: true,
            yarn: true,
            sigmoid_groups: Some((4, 2)),
        }),
        seed: 0x5eed_0006,
        ..qwen3moe()
    }
}

/// DeepSeek V2-Lite in miniature: no query bottleneck, the older combined `attn_kv_b` (full keys and
/// values cached per head), softmax routing without groups, two shared experts.
pub fn deepseek2_legacy() -> RandomModel {
    RandomModel {
        kv_heads: 4,
        head_dim: 24,
        shared_experts: 2,
        nextn_layers: 0,
        mla: Some(RandomMla {
            q_lora_rank: 0,
            kv_lora_rank: 32,
            nope: 16,
            value_head: 16,
            absorbed: false,
            yarn: false,
            sigmoid_groups: None,
        }),
        seed: 0x5eed_0007,
        ..deepseek2()
    }
}

/// gpt-oss in miniature: 4 layers alternating a 4-position sliding window and the whole context, 8
/// MXFP4 experts of which 2 are used, attention sinks, YaRN.
pub fn gpt_oss() -> RandomModel {
    RandomModel {
        architecture: "gpt-oss",
        experts: 8,
        experts_used: 2,
        sliding_window: 4,
        seed: 0x5eed_0008,
        ..qwen3moe()
    }
}

/// Qwen3.5 in miniature: 6 layers, each third full attention (gated, 4 heads of 32 with interleaved
/// M-RoPE on 16 of their values), the others a gated delta-net of 2 key heads and 4 value heads of 16
/// with a 4-wide convolution.
pub fn qwen35() -> RandomModel {
    RandomModel {
        architecture: "qwen35",
        layers: 6,
        head_dim: 32,
        experts: 0,
        experts_used: 0,
        expert_feed_forward: 0,
        rope_dims: 16,
        linear: Some(RandomLinear {
            conv_kernel: 4,
            head_width: 16,
            key_heads: 2,
            value_heads: 4,
            interval: 3,
            sections: [3, 3, 2, 0],
            shared_width: 0,
            fused_input: false,
        }),
        seed: 0x5eed_000b,
        ..qwen3moe()
    }
}

/// Qwen3.5-MoE in miniature: 4 layers alternating linear and full attention, 16 experts of which 4 are
/// used, and a shared expert 48 wide behind its sigmoid gate.
pub fn qwen35moe() -> RandomModel {
    let dense = qwen35();
    RandomModel {
        architecture: "qwen35moe",
        layers: 4,
        experts: 16,
        experts_used: 4,
        expert_feed_forward: 32,
        linear: Some(RandomLinear { interval: 2, shared_width: 48, ..dense.linear.unwrap() }),
        seed: 0x5eed_000c,
        ..dense
    }
}

/// Qwen3-Next in miniature: 4 layers alternating a gated delta-net (2 key heads, each shared by 2
/// value heads, grouped) and gated full attention with NeoX RoPE on 8 of each head's 32 values; 16
/// experts of which 4 are used and a gated shared expert 48 wide in every layer.
pub fn qwen3next() -> RandomModel {
    RandomModel { architecture: "qwen3next", rope_dims: 8, seed: 0x5eed_000e, ..qwen35moe() }
}

/// [`qwen3next`] as files converted before llama.cpp split its input projection: one `ssm_in`.
pub fn qwen3next_fused() -> RandomModel {
    let split = qwen3next();
    RandomModel {
        linear: Some(RandomLinear { fused_input: true, ..split.linear.unwrap() }),
        seed: 0x5eed_000f,
        ..split
    }
}

/// A DeepSeek V3 large enough to measure (about 420 MB): 6 layers (the first dense), 64 experts in 8
/// groups of which 4 are searched and 8 experts used, a query bottleneck of 192 and a latent of 128.
/// Not used by the tests; `benches/compare-llama-bench --suite` writes and measures it.
pub fn deepseek2_bench() -> RandomModel {
    RandomModel {
        layers: 6,
        embedding: 512,
        heads: 8,
        head_dim: 160,
        feed_forward: 1024,
        experts: 64,
        experts_used: 8,
        expert_feed_forward: 256,
        rope_dims: 32,
        nextn_layers: 0,
        mla: Some(RandomMla {
            q_lora_rank: 192,
            kv_lora_rank: 128,
            nope: 64,
            value_head: 64,
            absorbed: true,
            yarn: true,
            sigmoid_groups: Some((8, 4)),
        }),
        seed: 0x5eed_0009,
        ..deepseek2()
    }
}

/// A gpt-oss large enough to measure: 6 layers alternating a 128-position window, 32 MXFP4 experts of
/// which 4 are used. Not used by the tests; `benches/compare-llama-bench --suite` measures it.
pub fn gpt_oss_bench() -> RandomModel {
    RandomModel {
        layers: 6,
        embedding: 512,
        heads: 8,
        kv_heads: 4,
        head_dim: 64,
        rope_dims: 64,
        experts: 32,
        experts_used: 4,
        expert_feed_forward: 512,
        sliding_window: 128,
        seed: 0x5eed_000a,
        ..gpt_oss()
    }
}

/// A Qwen3-MoE large enough to measure (about 330 MB): 6 layers of 64 experts, 8 used per token,
/// 512 wide. Not used by the tests; `benches/compare-llama-bench --suite` writes and measures it.
pub fn qwen3moe_bench() -> RandomModel {
    RandomModel {
        architecture: "qwen3moe",
        layers: 6,
        embedding: 512,
        heads: 8,
        kv_heads: 4,
        head_dim: 64,
        feed_forward: 2048,
        experts: 64,
        experts_used: 8,
        expert_feed_forward: 256,
        rope_dims: 64,
        seed: 0x5eed_0004,
        ..qwen3moe()
    }
}

/// A Qwen3.5-MoE large enough to measure (about 480 MB): 8 layers (every fourth full attention, as
/// the real ones), 64 experts of which 8 are used, 512 wide, a delta-net of 4 key heads and 8 value
/// heads of 64. Not used by the tests; `benches/compare-llama-bench --suite` writes and measures it.
pub fn qwen35moe_bench() -> RandomModel {
    RandomModel {
        layers: 8,
        embedding: 512,
        heads: 8,
        kv_heads: 2,
        head_dim: 64,
        rope_dims: 16,
        experts: 64,
        experts_used: 8,
        expert_feed_forward: 256,
        linear: Some(RandomLinear {
            conv_kernel: 4,
            head_width: 64,
            key_heads: 4,
            value_heads: 8,
            interval: 4,
            sections: [3, 3, 2, 0],
            shared_width: 512,
            fused_input: false,
        }),
        seed: 0x5eed_000d,
        ..qwen35moe()
    }
}

/// MiniMax M2 in miniature: 4 layers, Q and K normed across all their heads, RoPE on half of each head,
/// 16 experts of which 4 are used, sigmoid routing with a selection bias.
pub fn minimax_m2() -> RandomModel {
    RandomModel { architecture: "minimax-m2", rope_dims: 8, feed_forward: 32, seed: 0x5eed_0012, ..qwen3moe() }
}

/// A deterministic generator (splitmix64): the same seed gives the same weights on every machine.
pub(super) struct Weights(pub(super) u64);

impl Weights {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `n` values uniform in [-scale, scale).
    pub(super) fn uniform(&mut self, n: u64, scale: f32) -> Vec<f32> {
        (0..n).map(|_| ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale).collect()
    }

    /// `n` values uniform in [1 - spread, 1 + spread): norm weights.
    pub(super) fn around_one(&mut self, n: u64, spread: f32) -> Vec<f32> {
        self.uniform(n, spread).into_iter().map(|v| 1.0 + v).collect()
    }
}

impl RandomModel {
    /// llama.cpp's recording of this model built for x86-64-v3, as release builds are
    /// (`tests/fixtures/oracle/random/NAME-x86-64-v3.jsonl`), after checking that the model written
    /// now is the file llama.cpp read.
    pub fn recorded_for_release_kernels(&self) -> Vec<super::oracle::Recorded> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oracle/random");
        let want = std::fs::read_to_string(dir.join(format!("{}.sha256", self.name()))).unwrap();
        let have = shoal::model::pull::sha256_of(&self.write()).unwrap();
        assert_eq!(have, want.trim(), "the random {} model changed since llama.cpp recorded it", self.name());
        super::oracle::read(&dir.join(format!("{}-x86-64-v3.jsonl", self.name())))
    }

    /// Where the tests keep this model (written when missing or different).
    pub fn path(&self) -> PathBuf {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("random-{}.gguf", self.name()))
    }

    /// The model's name in file names: its architecture, `mixtral` for a llama with experts.
    pub fn name(&self) -> String {
        match (self.architecture, self.experts) {
            ("llama", n) if n > 0 => "mixtral".into(),
            ("deepseek2", _) if self.mla.is_some_and(|m| !m.absorbed) => "deepseek2-legacy".into(),
            ("qwen3next", _) if self.linear.is_some_and(|l| l.fused_input) => "qwen3next-fused".into(),
            ("kimi-k3", _) if self.kimi.is_some_and(|k| k.residual_block == 0) => "kimi-k3-plain".into(),
            ("kimi-k3", _) if self.kimi.is_some_and(|k| k.decay_lower_bound.is_none()) => "kimi-k3-softplus".into(),
            (arch, _) if self.embedding > 64 => format!("{arch}-bench"),
            (arch, _) => arch.into(),
        }
    }

    /// Writes the model to [`RandomModel::path`] (unless an identical file is there) and returns the path.
    pub fn write(&self) -> PathBuf {
        let path = self.path();
        let bytes = self.bytes();
        if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
            // Tests run in parallel threads and processes: each writes its own file, then renames it.
            static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let part = path.with_extension(format!("{}-{n}.part", std::process::id()));
            std::fs::write(&part, &bytes).unwrap();
            std::fs::rename(&part, &path).unwrap();
        }
        path
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.gguf().bytes()
    }

    /// This model with `template` as its chat template instead of SmolLM2's, written to `name`.gguf in
    /// the tests' directory.
    pub fn write_with_chat_template(&self, name: &str, template: &str) -> PathBuf {
        self.write_edited(name, |meta| {
            meta.retain(|(key, _)| key != "tokenizer.chat_template");
            meta.push(("tokenizer.chat_template".into(), Meta::Str(template.into())));
        })
    }

    /// This model with its metadata changed by `edit`, written to `name`.gguf in the tests' directory.
    pub fn write_edited(&self, name: &str, edit: impl FnOnce(&mut Vec<(String, Meta)>)) -> PathBuf {
        let mut g = self.gguf();
        edit(&mut g.meta);
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.gguf"));
        let part = path.with_extension(format!("{}.part", std::process::id()));
        std::fs::write(&part, g.bytes()).unwrap();
        std::fs::rename(&part, &path).unwrap();
        path
    }

    fn gguf(&self) -> GgufWriter {
        let arch = self.architecture;
        let (e, hd) = (self.embedding as u64, self.head_dim as u64);
        let (q, kv) = (self.heads as u64 * hd, self.kv_heads as u64 * hd);
        let mut w = Weights(self.seed);
        let k = |key: &str| format!("{arch}.{key}");
        let mut g = GgufWriter::default()
            .meta("general.architecture", Meta::Str(arch.into()))
            .meta("general.name", Meta::Str(format!("random {arch}")))
            .meta(&k("block_count"), Meta::U32((self.layers + self.nextn_layers) as u32))
            .meta(&k("context_length"), Meta::U32(4096))
            .meta(&k("embedding_length"), Meta::U32(self.embedding as u32))
            .meta(&k("feed_forward_length"), Meta::U32(self.feed_forward as u32))
            .meta(&k("attention.head_count"), Meta::U32(self.heads as u32))
            .meta(&k("attention.head_count_kv"), Meta::U32(self.kv_heads as u32))
            .meta(&k("attention.key_length"), Meta::U32(self.head_dim as u32))
            .meta(&k("attention.value_length"), Meta::U32(self.value_length() as u32))
            .meta(&k("attention.layer_norm_rms_epsilon"), Meta::F32(1e-6))
            .meta(&k("rope.freq_base"), Meta::F32(1_000_000.0))
            .meta(&k("rope.dimension_count"), Meta::U32(self.rope_dims as u32));
        let glm = arch == "glm4moe";
        let gpt = arch == "gpt-oss";
        if gpt {
            g = g
                .meta(&k("attention.sliding_window"), Meta::U32(self.sliding_window as u32))
                .meta(&k("rope.scaling.type"), Meta::Str("yarn".into()))
                .meta(&k("rope.scaling.factor"), Meta::F32(4.0))
                .meta(&k("rope.scaling.original_context_length"), Meta::U32(1024));
        }
        let gemma = arch == "gemma3";
        let minimax = arch == "minimax-m2" || arch == "minimax-m3";
        if minimax {
            g = g.meta(&k("expert_gating_func"), Meta::U32(2));
        }
        if let Some(msa) = self.msa {
            g = super::random_sparse::msa_metadata(g, self, &msa);
        }
        if let (Some(mla), None) = (self.mla, self.kimi) {
            g = mla_metadata(g, self, &mla);
        }
        if let Some(indexer) = self.indexer {
            g = super::random_sparse::indexer_metadata(g, self, &indexer);
        }
        if gemma {
            g = g
                .meta(&k("attention.sliding_window"), Meta::U32(self.sliding_window as u32))
                .meta(&k("rope.freq_base_swa"), Meta::F32(10_000.0));
        }
        if glm {
            g = g
                .meta(&k("leading_dense_block_count"), Meta::U32(self.leading_dense as u32))
                .meta(&k("expert_shared_count"), Meta::U32(self.shared_experts as u32))
                .meta(&k("nextn_predict_layers"), Meta::U32(self.nextn_layers as u32))
                .meta(&k("expert_gating_func"), Meta::U32(2))
                .meta(&k("expert_weights_scale"), Meta::F32(2.5))
                .meta(&k("expert_weights_norm"), Meta::Value(shoal::model::Value::Bool(true)));
        }
        match (self.linear, self.kimi) {
            (Some(linear), None) => g = linear_metadata(g, self, &linear),
            (_, Some(kimi)) => g = super::random_kimi::metadata(g, self, &kimi),
            (None, None) => {}
        }
        if self.experts > 0 {
            g = g
                .meta(&k("expert_count"), Meta::U32(self.experts as u32))
                .meta(&k("expert_used_count"), Meta::U32(self.experts_used as u32))
                .meta(&k("expert_feed_forward_length"), Meta::U32(self.expert_feed_forward as u32));
        }
        g = copy_tokenizer(g, &super::model_path());
        let vocab = match g.meta.iter().find(|(key, _)| key == "tokenizer.ggml.tokens") {
            Some((_, Meta::Value(shoal::model::Value::Array(tokens)))) => tokens.len() as u64,
            _ => panic!("the test model has no token list"),
        };
        // Embeddings of unit scale make the tied output head's logits spread widely: clear winners.
        g = g.f16_values("token_embd.weight", &[e, vocab], &w.uniform(e * vocab, 1.7));
        g = g.f32_values("output_norm.weight", &[e], &w.around_one(e, 0.1));
        if gpt || minimax || self.kimi.is_some() {
            // gpt-oss, MiniMax M2 and Kimi K3 have an output head of their own.
            g = g.f16_values("output.weight", &[e, vocab], &w.uniform(e * vocab, 1.7));
        }
        if let Some(kimi) = self.kimi {
            return super::random_kimi::layers(g, self, &kimi, &mut w);
        }
        let proj = 1.0 / (self.embedding as f32).sqrt() * 1.7;
        let (n_exp, f, ff) = (self.experts as u64, self.expert_feed_forward as u64, self.feed_forward as u64);
        for l in 0..self.layers + self.nextn_layers {
            let n = |part: &str| format!("blk.{l}.{part}");
            if let Some(linear) = self.linear {
                g = linear_layer(g, self, &linear, l, &mut w);
                continue;
            }
            if let Some(mla) = self.mla {
                g = mla_attention(g, self, &mla, l, &mut w);
                if let Some(indexer) = self.indexer {
                    g = super::random_sparse::indexer_tensors(g, self, &mla, &indexer, l, &mut w);
                }
            } else {
                g = g
                    .f32_values(&n("attn_norm.weight"), &[e], &w.around_one(e, 0.1))
                    .f16_values(&n("attn_q.weight"), &[e, q], &w.uniform(e * q, proj))
                    .f16_values(&n("attn_k.weight"), &[e, kv], &w.uniform(e * kv, proj))
                    .f16_values(&n("attn_v.weight"), &[e, kv], &w.uniform(e * kv, proj))
                    .f16_values(&n("attn_output.weight"), &[q, e], &w.uniform(q * e, proj));
            }
            if glm {
                g = g
                    .f32_values(&n("attn_q.bias"), &[q], &w.uniform(q, 0.5))
                    .f32_values(&n("attn_k.bias"), &[kv], &w.uniform(kv, 0.5))
                    .f32_values(&n("attn_v.bias"), &[kv], &w.uniform(kv, 0.5))
                    .f32_values(&n("post_attention_norm.weight"), &[e], &w.around_one(e, 0.1));
            } else if gpt {
                g = g
                    .f32_values(&n("attn_q.bias"), &[q], &w.uniform(q, 0.5))
                    .f32_values(&n("attn_k.bias"), &[kv], &w.uniform(kv, 0.5))
                    .f32_values(&n("attn_v.bias"), &[kv], &w.uniform(kv, 0.5))
                    .f32_values(&n("attn_output.bias"), &[e], &w.uniform(e, 0.5))
                    .f32_values(&n("attn_sinks.weight"), &[self.heads as u64], &w.uniform(self.heads as u64, 2.0))
                    .f32_values(&n("post_attention_norm.weight"), &[e], &w.around_one(e, 0.1));
                g = gpt_oss_experts(g, self, l, &mut w, proj);
                continue;
            } else if let Some(msa) = self.msa {
                g = super::random_sparse::msa_layer(g, self, &msa, l, &mut w);
            } else if minimax {
                // Norms across all heads: one weight as wide as Q, one as wide as K.
                g = g
                    .f32_values(&n("attn_q_norm.weight"), &[q], &w.around_one(q, 0.1))
                    .f32_values(&n("attn_k_norm.weight"), &[kv], &w.around_one(kv, 0.1))
                    .f32_values(&n("ffn_norm.weight"), &[e], &w.around_one(e, 0.1));
            } else if self.mla.is_none() {
                if arch != "llama" {
                    g = g.f32_values(&n("attn_q_norm.weight"), &[hd], &w.around_one(hd, 0.1)).f32_values(
                        &n("attn_k_norm.weight"),
                        &[hd],
                        &w.around_one(hd, 0.1),
                    );
                }
                g = g.f32_values(&n("ffn_norm.weight"), &[e], &w.around_one(e, 0.1));
            }
            if gemma {
                g = g.f32_values(&n("post_attention_norm.weight"), &[e], &w.around_one(e, 0.1)).f32_values(
                    &n("post_ffw_norm.weight"),
                    &[e],
                    &w.around_one(e, 0.1),
                );
            }
            if self.experts == 0 || l < self.leading_dense {
                let down = 1.0 / (ff as f32).sqrt() * 1.7;
                g = g
                    .f16_values(&n("ffn_gate.weight"), &[e, ff], &w.uniform(e * ff, proj))
                    .f16_values(&n("ffn_up.weight"), &[e, ff], &w.uniform(e * ff, proj))
                    .f16_values(&n("ffn_down.weight"), &[ff, e], &w.uniform(ff * e, down));
                continue;
            }
            let down = 1.0 / (f as f32).sqrt() * 1.7;
            g = g
                .f16_values(&n("ffn_gate_inp.weight"), &[e, n_exp], &w.uniform(e * n_exp, proj * 2.0))
                .f16_values(&n("ffn_gate_exps.weight"), &[e, f, n_exp], &w.uniform(e * f * n_exp, proj))
                .f16_values(&n("ffn_up_exps.weight"), &[e, f, n_exp], &w.uniform(e * f * n_exp, proj))
                .f16_values(&n("ffn_down_exps.weight"), &[f, e, n_exp], &w.uniform(f * e * n_exp, down));
            if minimax {
                g = g.f32_values(&n("exp_probs_b.bias"), &[n_exp], &w.uniform(n_exp, 0.3));
            }
            if glm || self.mla.is_some() || self.msa.is_some() {
                let sf = f * self.shared_experts as u64;
                if glm || self.mla.is_some_and(|m| m.sigmoid_groups.is_some()) {
                    g = g.f32_values(&n("exp_probs_b.bias"), &[n_exp], &w.uniform(n_exp, 0.3));
                }
                g = g
                    .f16_values(&n("ffn_gate_shexp.weight"), &[e, sf], &w.uniform(e * sf, proj))
                    .f16_values(&n("ffn_up_shexp.weight"), &[e, sf], &w.uniform(e * sf, proj))
                    .f16_values(&n("ffn_down_shexp.weight"), &[sf, e], &w.uniform(sf * e, down));
            }
            if l >= self.layers {
                // The next-token-prediction block's own tensors (llama.cpp skips them unless asked).
                g = g
                    .f16_values(&n("nextn.eh_proj.weight"), &[2 * e, e], &w.uniform(2 * e * e, proj))
                    .f32_values(&n("nextn.enorm.weight"), &[e], &w.around_one(e, 0.1))
                    .f32_values(&n("nextn.hnorm.weight"), &[e], &w.around_one(e, 0.1))
                    .f32_values(&n("nextn.shared_head_norm.weight"), &[e], &w.around_one(e, 0.1));
            }
        }
        g
    }
}

impl RandomModel {
    fn value_length(&self) -> usize {
        match self.mla {
            Some(m) if m.absorbed => m.kv_lora_rank,
            Some(m) => m.value_head,
            None => self.head_dim,
        }
    }
}

/// A `qwen35` model's own metadata: its gated delta-net, where full attention comes, RoPE sections.
fn linear_metadata(mut g: GgufWriter, model: &RandomModel, linear: &RandomLinear) -> GgufWriter {
    use shoal::model::Value;
    let k = |key: &str| format!("{}.{key}", model.architecture);
    let sections = Value::Array(linear.sections.iter().map(|&n| Value::I32(n as i32)).collect());
    g = g
        .meta(&k("ssm.conv_kernel"), Meta::U32(linear.conv_kernel as u32))
        .meta(&k("ssm.inner_size"), Meta::U32((linear.value_heads * linear.head_width) as u32))
        .meta(&k("ssm.state_size"), Meta::U32(linear.head_width as u32))
        .meta(&k("ssm.group_count"), Meta::U32(linear.key_heads as u32))
        .meta(&k("ssm.time_step_rank"), Meta::U32(linear.value_heads as u32))
        .meta(&k("full_attention_interval"), Meta::U32(linear.interval as u32));
    if model.architecture != "qwen3next" {
        g = g.meta(&k("rope.dimension_sections"), Meta::Value(sections));
    }
    if linear.shared_width > 0 {
        g = g.meta(&k("expert_shared_feed_forward_length"), Meta::U32(linear.shared_width as u32));
    }
    g
}

/// Layer `l` of a `qwen35` model: a gated delta-net, or every `interval`-th layer gated full
/// attention; then a dense feed-forward, or experts with a gated shared expert.
fn linear_layer(
    mut g: GgufWriter,
    model: &RandomModel,
    linear: &RandomLinear,
    l: usize,
    w: &mut Weights,
) -> GgufWriter {
    let n = |part: &str| format!("blk.{l}.{part}");
    let e = model.embedding as u64;
    let proj = |fan_in: u64| 1.0 / (fan_in as f32).sqrt() * 1.7;
    g = g.f32_values(&n("attn_norm.weight"), &[e], &w.around_one(e, 0.1)).f32_values(
        &n("post_attention_norm.weight"),
        &[e],
        &w.around_one(e, 0.1),
    );
    if !(l + 1).is_multiple_of(linear.interval) {
        let (s, hk, hv) = (linear.head_width as u64, linear.key_heads as u64, linear.value_heads as u64);
        let (inner, channels, kernel) = (s * hv, 2 * s * hk + s * hv, linear.conv_kernel as u64);
        let decay: Vec<f32> = w.uniform(hv, 0.7).into_iter().map(|v| v - 0.8).collect();
        g = if linear.fused_input {
            let width = channels + inner;
            g.f16_values(&n("ssm_in.weight"), &[e, width], &w.uniform(e * width, proj(e)))
        } else {
            g.f16_values(&n("attn_qkv.weight"), &[e, channels], &w.uniform(e * channels, proj(e))).f16_values(
                &n("attn_gate.weight"),
                &[e, inner],
                &w.uniform(e * inner, proj(e)),
            )
        };
        g = g
            .f32_values(&n("ssm_conv1d.weight"), &[kernel, channels], &w.uniform(kernel * channels, 0.6))
            .f32_values(&n("ssm_dt.bias"), &[hv], &w.uniform(hv, 0.5))
            .f32_values(&n("ssm_a"), &[hv], &decay);
        g = if model.architecture == "qwen3next" {
            g.f16_values(&n("ssm_ba.weight"), &[e, 2 * hv], &w.uniform(e * 2 * hv, proj(e)))
        } else {
            g.f16_values(&n("ssm_beta.weight"), &[e, hv], &w.uniform(e * hv, proj(e))).f16_values(
                &n("ssm_alpha.weight"),
                &[e, hv],
                &w.uniform(e * hv, proj(e)),
            )
        };
        g = g.f32_values(&n("ssm_norm.weight"), &[s], &w.around_one(s, 0.1)).f16_values(
            &n("ssm_out.weight"),
            &[inner, e],
            &w.uniform(inner * e, proj(inner)),
        );
    } else {
        let hd = model.head_dim as u64;
        let (q, kv) = (model.heads as u64 * hd, model.kv_heads as u64 * hd);
        g = g
            .f16_values(&n("attn_q.weight"), &[e, 2 * q], &w.uniform(e * 2 * q, proj(e)))
            .f16_values(&n("attn_k.weight"), &[e, kv], &w.uniform(e * kv, proj(e)))
            .f16_values(&n("attn_v.weight"), &[e, kv], &w.uniform(e * kv, proj(e)))
            .f16_values(&n("attn_output.weight"), &[q, e], &w.uniform(q * e, proj(q)))
            .f32_values(&n("attn_q_norm.weight"), &[hd], &w.around_one(hd, 0.1))
            .f32_values(&n("attn_k_norm.weight"), &[hd], &w.around_one(hd, 0.1));
    }
    if model.experts == 0 {
        let ff = model.feed_forward as u64;
        return g
            .f16_values(&n("ffn_gate.weight"), &[e, ff], &w.uniform(e * ff, proj(e)))
            .f16_values(&n("ffn_up.weight"), &[e, ff], &w.uniform(e * ff, proj(e)))
            .f16_values(&n("ffn_down.weight"), &[ff, e], &w.uniform(ff * e, proj(ff)));
    }
    let (n_exp, f, sw) = (model.experts as u64, model.expert_feed_forward as u64, linear.shared_width as u64);
    g.f16_values(&n("ffn_gate_inp.weight"), &[e, n_exp], &w.uniform(e * n_exp, proj(e) * 2.0))
        .f16_values(&n("ffn_gate_exps.weight"), &[e, f, n_exp], &w.uniform(e * f * n_exp, proj(e)))
        .f16_values(&n("ffn_up_exps.weight"), &[e, f, n_exp], &w.uniform(e * f * n_exp, proj(e)))
        .f16_values(&n("ffn_down_exps.weight"), &[f, e, n_exp], &w.uniform(f * e * n_exp, proj(f)))
        .f32_values(&n("ffn_gate_inp_shexp.weight"), &[e], &w.uniform(e, proj(e) * 2.0))
        .f16_values(&n("ffn_gate_shexp.weight"), &[e, sw], &w.uniform(e * sw, proj(e)))
        .f16_values(&n("ffn_up_shexp.weight"), &[e, sw], &w.uniform(e * sw, proj(e)))
        .f16_values(&n("ffn_down_shexp.weight"), &[sw, e], &w.uniform(sw * e, proj(sw)))
}

/// A `deepseek2` model's own metadata.
fn mla_metadata(mut g: GgufWriter, model: &RandomModel, mla: &RandomMla) -> GgufWriter {
    let k = |key: &str| format!("{}.{key}", model.architecture);
    g = g
        .meta(&k("attention.q_lora_rank"), Meta::U32(mla.q_lora_rank as u32))
        .meta(&k("attention.kv_lora_rank"), Meta::U32(mla.kv_lora_rank as u32))
        .meta(&k("leading_dense_block_count"), Meta::U32(model.leading_dense as u32))
        .meta(&k("expert_shared_count"), Meta::U32(model.shared_experts as u32))
        .meta(&k("nextn_predict_layers"), Meta::U32(model.nextn_layers as u32));
    if mla.absorbed {
        g = g
            .meta(&k("attention.key_length_mla"), Meta::U32((mla.nope + model.rope_dims) as u32))
            .meta(&k("attention.value_length_mla"), Meta::U32(mla.value_head as u32));
    }
    if mla.yarn {
        g = g
            .meta(&k("rope.scaling.type"), Meta::Str("yarn".into()))
            .meta(&k("rope.scaling.factor"), Meta::F32(4.0))
            .meta(&k("rope.scaling.original_context_length"), Meta::U32(1024))
            .meta(&k("rope.scaling.yarn_log_multiplier"), Meta::F32(0.1));
    }
    match mla.sigmoid_groups {
        Some((count, used)) => g
            .meta(&k("expert_gating_func"), Meta::U32(2))
            .meta(&k("expert_group_count"), Meta::U32(count as u32))
            .meta(&k("expert_group_used_count"), Meta::U32(used as u32))
            .meta(&k("expert_weights_scale"), Meta::F32(2.5))
            .meta(&k("expert_weights_norm"), Meta::Value(shoal::model::Value::Bool(true))),
        None => g.meta(&k("expert_weights_scale"), Meta::F32(1.0)),
    }
}

/// Layer `l`'s latent attention tensors and its feed-forward norm.
pub(super) fn mla_attention(
    mut g: GgufWriter,
    model: &RandomModel,
    mla: &RandomMla,
    l: usize,
    w: &mut Weights,
) -> GgufWriter {
    let n = |part: &str| format!("blk.{l}.{part}");
    let (e, heads, rope) = (model.embedding as u64, model.heads as u64, model.rope_dims as u64);
    let (rank, nope, value) = (mla.kv_lora_rank as u64, mla.nope as u64, mla.value_head as u64);
    let key_head = nope + rope;
    let proj = |fan_in: u64| 1.0 / (fan_in as f32).sqrt() * 1.7;
    g = g.f32_values(&n("attn_norm.weight"), &[e], &w.around_one(e, 0.1));
    if mla.q_lora_rank > 0 {
        let r = mla.q_lora_rank as u64;
        g = g
            .f16_values(&n("attn_q_a.weight"), &[e, r], &w.uniform(e * r, proj(e)))
            .f32_values(&n("attn_q_a_norm.weight"), &[r], &w.around_one(r, 0.1))
            .f16_values(&n("attn_q_b.weight"), &[r, heads * key_head], &w.uniform(r * heads * key_head, proj(r)));
    } else {
        g = g.f16_values(&n("attn_q.weight"), &[e, heads * key_head], &w.uniform(e * heads * key_head, proj(e)));
    }
    g = g.f16_values(&n("attn_kv_a_mqa.weight"), &[e, rank + rope], &w.uniform(e * (rank + rope), proj(e))).f32_values(
        &n("attn_kv_a_norm.weight"),
        &[rank],
        &w.around_one(rank, 0.1),
    );
    if mla.absorbed {
        g = g
            .f16_values(&n("attn_k_b.weight"), &[nope, rank, heads], &w.uniform(nope * rank * heads, proj(nope)))
            .f16_values(&n("attn_v_b.weight"), &[rank, value, heads], &w.uniform(rank * value * heads, proj(rank)));
    } else {
        let width = heads * (nope + value);
        g = g.f16_values(&n("attn_kv_b.weight"), &[rank, width], &w.uniform(rank * width, proj(rank)));
    }
    g.f16_values(&n("attn_output.weight"), &[heads * value, e], &w.uniform(heads * value * e, proj(heads * value)))
        .f32_values(&n("ffn_norm.weight"), &[e], &w.around_one(e, 0.1))
}

/// gpt-oss's experts: the router with its bias, and MXFP4 expert weights with F32 biases. MXFP4 packs
/// 32 values in 17 bytes: a power-of-two scale (E8M0) and 16 bytes of 4-bit values; any bytes are valid,
/// so the blocks are drawn directly, with scales that keep the products near unit size.
fn gpt_oss_experts(mut g: GgufWriter, model: &RandomModel, l: usize, w: &mut Weights, proj: f32) -> GgufWriter {
    const MXFP4: u32 = 39;
    let n = |part: &str| format!("blk.{l}.{part}");
    let (e, f, n_exp) = (model.embedding as u64, model.expert_feed_forward as u64, model.experts as u64);
    let mut mxfp4 = |name: &str, shape: [u64; 3]| {
        let blocks = shape.iter().product::<u64>() / 32;
        let mut data = Vec::with_capacity(blocks as usize * 17);
        for _ in 0..blocks {
            data.push(121 + (w.next() % 3) as u8);
            data.extend((0..16).map(|_| w.next() as u8));
        }
        super::gguf_writer::Tensor { name: n(name), shape: shape.to_vec(), type_id: MXFP4, data }
    };
    let gate = mxfp4("ffn_gate_exps.weight", [e, f, n_exp]);
    let up = mxfp4("ffn_up_exps.weight", [e, f, n_exp]);
    let down = mxfp4("ffn_down_exps.weight", [f, e, n_exp]);
    g = g.f16_values(&n("ffn_gate_inp.weight"), &[e, n_exp], &w.uniform(e * n_exp, proj * 2.0)).f32_values(
        &n("ffn_gate_inp.bias"),
        &[n_exp],
        &w.uniform(n_exp, 0.5),
    );
    g.tensors.extend([gate, up, down]);
    g.f32_values(&n("ffn_gate_exps.bias"), &[f, n_exp], &w.uniform(f * n_exp, 0.5))
        .f32_values(&n("ffn_up_exps.bias"), &[f, n_exp], &w.uniform(f * n_exp, 0.5))
        .f32_values(&n("ffn_down_exps.bias"), &[e, n_exp], &w.uniform(e * n_exp, 0.5))
}

/// Copies every `tokenizer.*` key of `source` into `g`.
fn copy_tokenizer(mut g: GgufWriter, source: &Path) -> GgufWriter {
    let file = shoal::model::GgufFile::open(source).unwrap();
    for (key, value) in file.metadata() {
        if key.starts_with("tokenizer.") {
            g = g.meta(key, Meta::Value(value.clone()));
        }
    }
    g
}
