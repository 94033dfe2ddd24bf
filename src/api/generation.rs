//! What the generation APIs (OpenAI's, Anthropic's, Ollama's) share between parsing a request and
//! shaping its answer: the sampling parameters and text content as their requests spell them, starting
//! a request on the instance (a prompt the model refuses is a 4xx before anything is streamed), a whole
//! answer collected, and a streamed answer relayed from a task that stops the request when the client
//! goes away. Prompts are rendered by the instance's first stage with the model's own chat template.

use super::{ApiError, ApiState};
use crate::engine::{FinishReason, SamplingParams};
use crate::instances::{self, GenerateError, InstanceInfo, InstanceState};
use crate::model::ReplyFormat;
use crate::worker::{FrontEvent, FrontRequest, GenerationReport};
use futures_util::stream::{Stream, StreamExt};
use serde::Deserialize;
use std::convert::Infallible;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

/// Sampling parameters under the names the APIs give them (Ollama's `repeat_penalty` too).
#[derive(Deserialize, Default)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    #[serde(alias = "repeat_penalty")]
    pub repetition_penalty: Option<f32>,
    pub seed: Option<u64>,
}

impl Sampling {
    /// The engine's parameters (unset ones: temperature 1, no top-k, top-p or min-p cut, no penalty, a
    /// random seed); a temperature above `max_temperature` is refused.
    pub fn params(&self, max_temperature: f32) -> Result<SamplingParams, ApiError> {
        let top_k = match self.top_k {
            Some(k) if k < 0 => return Err(ApiError::bad_param("top_k", "top_k must be 0 or more")),
            Some(k) => k as usize,
            None => 0,
        };
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0),
            top_k,
            min_p: self.min_p.unwrap_or(0.0),
            repeat_penalty: self.repetition_penalty.unwrap_or(1.0),
            seed: self.seed.unwrap_or_else(rand::random),
            ..SamplingParams::default()
        };
        if sampling.temperature > max_temperature {
            return Err(ApiError::bad_param(
                "temperature",
                format!("temperature must be between 0 and {max_temperature}"),
            ));
        }
        sampling.validate().map_err(ApiError::bad_request)?;
        Ok(sampling)
    }
}

/// A chat request of OpenAI's or Ollama's shape: the API's `common` fields, its messages, and the tools
/// offered.
#[derive(Deserialize)]
pub struct ChatRequest<C, M> {
    #[serde(flatten)]
    pub common: C,
    pub messages: Option<Vec<M>>,
    #[serde(default)]
    pub tools: Vec<serde_json::Value>,
    pub tool_choice: Option<serde_json::Value>,
}

/// The chat template's own variables a request sets: `chat_template_kwargs` as given (as llama.cpp's
/// and vLLM's servers take them), then the API's own fields for the same thing (`reasoning_effort` for
/// gpt-oss; `enable_thinking` for Qwen3 and others).
pub fn template_variables(
    kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    reasoning_effort: Option<&str>,
    enable_thinking: Option<bool>,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    let mut variables = kwargs.unwrap_or_default();
    if let Some(effort) = reasoning_effort {
        if !matches!(effort, "low" | "medium" | "high") {
            let message = format!("reasoning_effort must be \"low\", \"medium\" or \"high\", not {effort:?}");
            return Err(ApiError::bad_param("reasoning_effort", message));
        }
        variables.insert("reasoning_effort".into(), effort.into());
    }
    if let Some(on) = enable_thinking {
        variables.insert("enable_thinking".into(), on.into());
    }
    Ok(variables)
}

/// Message content: a string, or a list of blocks of which only text is taken.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

impl Content {
    /// The text of the content; blocks of any other type are refused, naming `field`.
    pub fn into_text(self, field: &'static str) -> Result<String, ApiError> {
        match self {
            Content::Text(t) => Ok(t),
            Content::Parts(parts) => {
                if let Some(p) = parts.iter().find(|p| p.kind != "text") {
                    return Err(ApiError::bad_param(
                        field,
                        format!("content of type {:?} is not supported (text only)", p.kind),
                    ));
                }
                Ok(parts.into_iter().filter_map(|p| p.text).collect())
            }
        }
    }
}

/// The ready instances, one per model name, as the APIs list them.
pub fn ready_instances(state: &ApiState) -> Vec<InstanceInfo> {
    let registry = state.instances.registry();
    let mut seen = std::collections::BTreeSet::new();
    registry
        .instances
        .values()
        .filter(|i| i.state == InstanceState::Ready && seen.insert(i.model.clone()))
        .cloned()
        .collect()
}

/// The `model` of a request, which every API requires.
pub fn model_name(model: Option<&str>) -> Result<String, ApiError> {
    model
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .ok_or_else(|| ApiError::bad_param("model", "`model` is required"))
}

/// How long a request waits for its model while an instance of it is launching or recovering (a
/// large model takes minutes to load; clients such as OpenAI's wait 10 minutes by default).
const WAIT_FOR_STARTING: std::time::Duration = std::time::Duration::from_secs(300);

/// A request the model accepted.
pub struct Started {
    pub events: UnboundedReceiver<FrontEvent>,
    pub prompt_tokens: usize,
    /// How the model lays out its reply.
    pub reply: ReplyFormat,
}

/// Starts the request (once the model is ready, if it is launching or recovering) and waits for its
/// first event, so that a request the model refuses (a prompt beyond the context) is a 4xx rather than
/// a broken stream.
pub async fn start(state: &ApiState, model: &str, front: FrontRequest) -> Result<Started, ApiError> {
    let deadline = tokio::time::Instant::now() + WAIT_FOR_STARTING;
    let mut tries = 0;
    loop {
        let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
        let failure = match instances::generate_when_ready(&state.instances, model, front.clone(), wait).await {
            Ok(mut events) => match events.recv().await {
                Some(FrontEvent::Started { prompt_tokens, reply }) => {
                    return Ok(Started { events, prompt_tokens, reply })
                }
                Some(FrontEvent::Error { message, client_error: true }) => return Err(ApiError::bad_request(message)),
                Some(FrontEvent::Busy { message }) => return Err(ApiError::busy(message)),
                Some(FrontEvent::TooLong { prompt_tokens, context }) => {
                    return Err(ApiError::context_exceeded(prompt_tokens, context))
                }
                Some(FrontEvent::Error { message, .. }) => message,
                _ => "the model's first stage ended the request before it started".to_string(),
            },
            // The node of its first stage is gone (and may not be known down yet).
            Err(GenerateError::Failed(message)) => message,
            Err(e @ GenerateError::UnknownModel(_)) => {
                return Err(ApiError::not_found(e.to_string(), "model_not_found"))
            }
            Err(e @ GenerateError::NotReady(..)) => return Err(ApiError::unavailable(e.to_string())),
        };
        // Nothing reached the client yet: a request its instance dropped as it was lost, or could not
        // send to a node that is gone, is sent again to the instance that replaces it.
        tries += 1;
        if tries >= RETRIES_ON_LOSS
            || !instances::lost_and_recovering(&state.instances, model, NOTICE_LOSS_WITHIN).await
        {
            return Err(ApiError::failed(failure));
        }
        tracing::info!(
            "a request for {model} failed as its instance was lost ({failure}); it waits for the replacement"
        );
    }
}

/// How many times in all a request is tried when it fails before its first token as its instance is lost.
const RETRIES_ON_LOSS: usize = 3;
/// How long after such a failure its instance's loss may take to be known here.
const NOTICE_LOSS_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// A finished request's whole text, why it ended, and its counts.
pub struct Finished {
    pub text: String,
    pub reason: FinishReason,
    pub report: GenerationReport,
}

/// Waits for the whole answer of a started request (and records it in the node's statistics).
pub async fn collect(
    state: &ApiState,
    model: &str,
    mut events: UnboundedReceiver<FrontEvent>,
) -> Result<Finished, ApiError> {
    let mut text = String::new();
    loop {
        match events.recv().await {
            Some(FrontEvent::Text { text: t }) => text.push_str(&t),
            Some(FrontEvent::Done { finish_reason, report }) => {
                state.instances.record_request(model, &report);
                return Ok(Finished { text, reason: finish_reason, report });
            }
            Some(FrontEvent::Error { message, .. } | FrontEvent::Busy { message }) => {
                return Err(ApiError::failed(message))
            }
            Some(FrontEvent::TooLong { prompt_tokens, context }) => {
                return Err(ApiError::context_exceeded(prompt_tokens, context))
            }
            Some(FrontEvent::Started { .. }) => {}
            None => return Err(ApiError::failed(STOPPED)),
        }
    }
}

const STOPPED: &str = "the instance stopped in the middle of the request";

/// One step of a streamed answer, for an API to shape into its own events.
pub enum Piece {
    Text(String),
    Done(FinishReason, GenerationReport),
    Failed(String),
}

/// Streams a started request: `first` at once, then every piece as `shape` turns it into items. The
/// request is recorded when it is done, and cancelled when the client goes away.
pub fn relay<T, F>(
    state: ApiState,
    model: String,
    mut events: UnboundedReceiver<FrontEvent>,
    first: Vec<T>,
    mut shape: F,
) -> impl Stream<Item = Result<T, Infallible>>
where
    T: Send + 'static,
    F: FnMut(Piece) -> Vec<T> + Send + 'static,
{
    channel_stream(move |tx| async move {
        if !send_all(&tx, first) {
            return;
        }
        loop {
            let (piece, end) = match events.recv().await {
                Some(FrontEvent::Started { .. }) => continue,
                Some(FrontEvent::Text { text }) => (Piece::Text(text), false),
                Some(FrontEvent::Done { finish_reason, report }) => {
                    state.instances.record_request(&model, &report);
                    (Piece::Done(finish_reason, report), true)
                }
                Some(FrontEvent::Error { message, .. } | FrontEvent::Busy { message }) => {
                    (Piece::Failed(message), true)
                }
                Some(FrontEvent::TooLong { prompt_tokens, context }) => {
                    (Piece::Failed(ApiError::context_exceeded(prompt_tokens, context).message), true)
                }
                None => (Piece::Failed(STOPPED.into()), true),
            };
            // A failed send means the client went away: dropping `events` cancels the request.
            if !send_all(&tx, shape(piece)) || end {
                return;
            }
        }
    })
}

fn send_all<T>(tx: &UnboundedSender<T>, items: Vec<T>) -> bool {
    items.into_iter().all(|item| tx.send(item).is_ok())
}

/// A stream fed by a task through a channel (the task ends when the client goes away).
fn channel_stream<T, F, Fut>(producer: F) -> impl Stream<Item = Result<T, Infallible>>
where
    T: Send + 'static,
    F: FnOnce(UnboundedSender<T>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(producer(tx));
    tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(Ok)
}
