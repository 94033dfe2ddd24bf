//! What a worker says to its node agent (JSON lines on stdout) and hears from it (JSON lines on stdin),
//! and the "front" protocol stage 0 serves on localhost for generation requests (JSON lines over TCP,
//! opened with the instance's front token).

use crate::engine::{FinishReason, SamplingParams};
use crate::model::{ChatMessage, ReplyFormat};
use crate::transport::ring::{RdmaRoute, RingTransport};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// A worker's lifecycle, as the API shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    #[default]
    Starting,
    /// Fetching its share of the model before it starts.
    Fetching,
    Loading,
    Connecting,
    Ready,
    Serving,
    Failed,
    Stopped,
}

impl WorkerState {
    /// Whether the worker has everything it needs to compute: ready, or serving requests.
    pub fn is_ready(self) -> bool {
        matches!(self, WorkerState::Ready | WorkerState::Serving)
    }
}

/// Worker → agent, one JSON object per line on stdout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WorkerEvent {
    Loading {
        progress: f32,
    },
    /// Listening for the previous stage on `data_port` (and, on stage 0, for requests on `front_port`).
    Listening {
        data_port: u16,
        front_port: Option<u16>,
        memory: crate::engine::StageMemory,
        /// The device the stage computes on (ggml's name for it).
        #[serde(default)]
        device: String,
    },
    Ready,
    Stats {
        stats: StageStats,
    },
    Failed {
        error: String,
    },
    /// The transport of this stage's link to the next one (sent when RDMA was asked for: whether it
    /// carries the link, or why TCP does).
    RingLink {
        transport: RingTransport,
    },
    /// The transport of this rank's link with rank `peer` of its tensor-parallel group (sent when RDMA
    /// was asked for at either end).
    GroupLink {
        peer: usize,
        transport: RingTransport,
    },
}

/// Agent → worker, one JSON object per line on stdin. Closing stdin stops the worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum WorkerCommand {
    /// Connect to the next stage.
    Connect {
        next: SocketAddr,
        /// The RDMA devices to carry the link over, when the agent chose RDMA for it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rdma: Option<RdmaRoute>,
    },
    /// A rank of a tensor-parallel group: connect to the others, which listen at `peers` (rank order;
    /// this rank's own entry is not used), over RDMA to those the agent chose it for (`rdma`, in rank
    /// order; only the routes to higher ranks are used).
    ConnectGroup {
        peers: Vec<SocketAddr>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rdma: Vec<Option<RdmaRoute>>,
    },
    Stop,
}

/// A stage's counters since it started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct StageStats {
    pub steps: u64,
    pub tokens: u64,
    /// Requests' rows summed over the steps: above `steps` when steps ran several requests at once.
    #[serde(default)]
    pub rows: u64,
    pub compute_us_total: u64,
    /// Stage 0: requests served and generated tokens.
    pub requests: u64,
    pub generated_tokens: u64,
    /// Stage 0: per decode step, the time on the ring's links divided by the hops (p50/p99, µs).
    pub hop_p50_us: Option<u64>,
    pub hop_p99_us: Option<u64>,
    pub active_requests: usize,
    /// A tensor-parallel leader: the median time of one sum across the group (two per layer).
    #[serde(default)]
    pub allreduce_p50_us: Option<u64>,
    /// Stage 0: requests waiting for a slot.
    #[serde(default)]
    pub queued_requests: usize,
    /// Stage 0: prompt tokens of the requests served, and those of them the prompt cache gave back
    /// (a slot's or a saved prefix's rows) instead of prefilling: their ratio is its hit rate.
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub cached_tokens: u64,
    /// Stage 0: saved prefixes written back into a slot, and the positions saved prefixes hold in
    /// memory and on disk (every stage holds its layers' rows of each).
    #[serde(default)]
    pub restored_prefixes: u64,
    #[serde(default)]
    pub saved_prefix_positions: u64,
    #[serde(default)]
    pub saved_prefix_positions_on_disk: u64,
    /// Stage 0: tokens drafted for speculative decoding, and those of them the model kept (each kept
    /// one is a step saved): their ratio is the acceptance rate.
    #[serde(default)]
    pub drafted_tokens: u64,
    #[serde(default)]
    pub accepted_tokens: u64,
    /// Stage 0: what a drafted row costs, as a share of a decode step of one row, as it measured its
    /// steps (none before steps of different sizes ran).
    #[serde(default)]
    pub draft_row_cost: Option<f64>,
}

impl StageStats {
    /// Counts one step of `tokens` tokens in `rows` requests' rows that took `took`; every 32nd step
    /// also takes the group's median sum time (`sum_p50`: a tensor-parallel rank's, None otherwise).
    pub fn record_step(
        &mut self,
        tokens: usize,
        rows: usize,
        took: std::time::Duration,
        sum_p50: impl FnOnce() -> Option<std::time::Duration>,
    ) {
        self.steps += 1;
        self.tokens += tokens as u64;
        self.rows += rows as u64;
        self.compute_us_total += took.as_micros() as u64;
        if self.steps % 32 == 1 {
            self.allreduce_p50_us = sum_p50().map(|d| d.as_micros() as u64);
        }
    }
}

/// The prompt of a request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptInput {
    Text(String),
    /// Rendered with the model's chat template.
    Messages(Vec<ChatMessage>),
    /// Messages as JSON (with tool calls and results), the tools the model may call, and the template's
    /// own variables the request sets (`reasoning_effort`, `enable_thinking`), rendered with the model's
    /// chat template.
    Conversation {
        messages: Vec<serde_json::Value>,
        tools: Vec<serde_json::Value>,
        #[serde(default)]
        variables: serde_json::Map<String, serde_json::Value>,
    },
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrontRequest {
    pub prompt: PromptInput,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    #[serde(default)]
    pub stop: Vec<String>,
    #[serde(default)]
    pub ignore_eos: bool,
}

/// Counts and rates of one finished request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct GenerationReport {
    pub prompt_tokens: usize,
    /// Of the prompt's tokens, those the prompt cache gave back (not run again).
    #[serde(default)]
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    /// How long the request waited for a slot before its prompt ran (ms).
    #[serde(default)]
    pub queue_ms: f64,
    /// From its prompt starting to run to its first token (the wait for a slot not included).
    pub time_to_first_token_ms: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    /// Median per-hop link time of this request's decode steps (µs), on multi-stage instances.
    pub hop_p50_us: Option<u64>,
    /// Tokens drafted for speculative decoding, and those of them kept (part of `generated_tokens`).
    #[serde(default)]
    pub drafted_tokens: usize,
    #[serde(default)]
    pub accepted_tokens: usize,
    /// The stop string that ended the request, when one did (`stop_sequence` in Anthropic's API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequence: Option<String>,
}

/// Stage 0 → client, one JSON object per line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FrontEvent {
    /// The prompt is accepted: its length in tokens, and how the reply is laid out (by the chat template
    /// that rendered it; plain for raw prompts).
    Started {
        prompt_tokens: usize,
        #[serde(default)]
        reply: ReplyFormat,
    },
    Text {
        text: String,
    },
    Done {
        finish_reason: FinishReason,
        report: GenerationReport,
    },
    Error {
        message: String,
        client_error: bool,
    },
    /// Refused before it started: every slot is taken and the queue is full.
    Busy {
        message: String,
    },
    /// Refused before it started: the rendered prompt does not fit the context (with room for a token
    /// of reply). Its own event, so that each API can say so in the words its clients look for.
    TooLong {
        prompt_tokens: usize,
        context: usize,
    },
}

impl FrontEvent {
    /// Whether the request ends with this event.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            FrontEvent::Done { .. } | FrontEvent::Error { .. } | FrontEvent::Busy { .. } | FrontEvent::TooLong { .. }
        )
    }
}
