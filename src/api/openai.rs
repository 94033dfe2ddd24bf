//! The OpenAI-compatible endpoints: `POST /v1/chat/completions` and `POST /v1/completions` (streamed as
//! server-sent events or whole), and `GET /v1/models`. Requests are checked up front and refused with a
//! 4xx and a message that names the parameter; the model's own errors (a prompt beyond the context) are
//! 400s too; a failure of the instance mid-stream arrives as an error event.

use super::{ApiError, ApiState};
use crate::engine::{FinishReason, SamplingParams};
use crate::instances::{self, GenerateError, InstanceState};
use crate::model::ChatMessage;
use crate::worker::{FrontEvent, FrontRequest, GenerationReport, PromptInput};
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::Stream;
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use tokio::sync::mpsc::UnboundedReceiver;

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct MessageIn {
    role: String,
    content: Option<Content>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// Fields both endpoints share.
#[derive(Deserialize)]
struct Common {
    model: Option<String>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<u64>,
    stop: Option<Stop>,
    n: Option<u32>,
    /// shoal's extension: keep generating past end-of-generation tokens (benchmarks).
    #[serde(default)]
    ignore_eos: bool,
}

#[derive(Deserialize)]
struct ChatRequest {
    #[serde(flatten)]
    common: Common,
    messages: Option<Vec<MessageIn>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Deserialize)]
struct CompletionRequest {
    #[serde(flatten)]
    common: Common,
    prompt: Option<PromptField>,
}

fn parse<T: for<'de> Deserialize<'de>>(body: Result<Json<Value>, JsonRejection>) -> Result<T, ApiError> {
    let Json(value) =
        body.map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {}", e.body_text())))?;
    serde_json::from_value(value).map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))
}

impl Common {
    fn to_front(&self, prompt: PromptInput) -> Result<(String, FrontRequest), ApiError> {
        let model = self
            .model
            .clone()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| ApiError::bad_param("model", "`model` is required"))?;
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad_param("n", "only n = 1 is supported"));
        }
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            Some(n) if n < 0 => {
                return Err(ApiError::bad_param("max_tokens", format!("max_tokens must be 0 or more, not {n}")))
            }
            Some(n) => n as usize,
            None => u32::MAX as usize,
        };
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
        if sampling.temperature > 2.0 {
            return Err(ApiError::bad_param("temperature", "temperature must be between 0 and 2"));
        }
        sampling.validate().map_err(ApiError::bad_request)?;
        let stop = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) if v.len() > 4 => return Err(ApiError::bad_param("stop", "at most 4 stop sequences")),
            Some(Stop::Many(v)) => v.clone(),
        };
        Ok((model, FrontRequest { prompt, max_tokens, sampling, stop, ignore_eos: self.ignore_eos }))
    }
}

fn chat_messages(messages: Option<Vec<MessageIn>>) -> Result<Vec<ChatMessage>, ApiError> {
    let messages = messages
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::bad_param("messages", "`messages` must be a non-empty list"))?;
    messages
        .into_iter()
        .map(|m| {
            if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "developer" | "tool") {
                return Err(ApiError::bad_param("messages", format!("unknown role {:?}", m.role)));
            }
            let content = match m.content {
                None => String::new(),
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => {
                    if let Some(p) = parts.iter().find(|p| p.kind != "text") {
                        return Err(ApiError::bad_param(
                            "messages",
                            format!("content of type {:?} is not supported (text only)", p.kind),
                        ));
                    }
                    parts.into_iter().filter_map(|p| p.text).collect::<Vec<_>>().join("")
                }
            };
            let role = if m.role == "developer" { "system".to_string() } else { m.role };
            Ok(ChatMessage { role, content })
        })
        .collect()
}

pub async fn chat_completions(
    State(state): State<ApiState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request: ChatRequest = parse(body)?;
    let messages = chat_messages(request.messages)?;
    let (model, front) = request.common.to_front(PromptInput::Messages(messages))?;
    let include_usage = request.common.stream_options.as_ref().is_some_and(|o| o.include_usage);
    respond(state, model, front, request.common.stream, include_usage, Kind::Chat).await
}

pub async fn completions(
    State(state): State<ApiState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request: CompletionRequest = parse(body)?;
    let prompt = match request.prompt {
        Some(PromptField::Text(t)) => PromptInput::Text(t),
        Some(PromptField::Texts(mut t)) if t.len() == 1 => PromptInput::Text(t.remove(0)),
        Some(PromptField::Texts(_)) => return Err(ApiError::bad_param("prompt", "one prompt per request")),
        Some(PromptField::Tokens(t)) => PromptInput::Tokens(t),
        None => return Err(ApiError::bad_param("prompt", "`prompt` is required")),
    };
    let (model, front) = request.common.to_front(prompt)?;
    let include_usage = request.common.stream_options.as_ref().is_some_and(|o| o.include_usage);
    respond(state, model, front, request.common.stream, include_usage, Kind::Completion).await
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

fn usage(report: &GenerationReport) -> Value {
    json!({
        "prompt_tokens": report.prompt_tokens,
        "completion_tokens": report.generated_tokens,
        "total_tokens": report.prompt_tokens + report.generated_tokens,
    })
}

/// Starts the request and waits for its first event, so that a request the model refuses (a prompt
/// beyond the context) is a 4xx rather than a broken stream.
async fn start(
    state: &ApiState,
    model: &str,
    front: FrontRequest,
) -> Result<(UnboundedReceiver<FrontEvent>, usize), ApiError> {
    let mut events = instances::generate(&state.agent, model, front).map_err(|e| match e {
        GenerateError::UnknownModel(_) => ApiError::not_found(e.to_string(), "model_not_found"),
        GenerateError::NotReady(..) => ApiError::unavailable(e.to_string()),
        GenerateError::Failed(m) => ApiError::failed(m),
    })?;
    match events.recv().await {
        Some(FrontEvent::Started { prompt_tokens }) => Ok((events, prompt_tokens)),
        Some(FrontEvent::Error { message, client_error: true }) => Err(ApiError::bad_request(message)),
        Some(FrontEvent::Error { message, .. }) => Err(ApiError::failed(message)),
        _ => Err(ApiError::failed("the model's first stage ended the request before it started")),
    }
}

fn record(state: &ApiState, model: &str, report: &GenerationReport) {
    state.agent.record_request(model, report);
}

async fn respond(
    state: ApiState,
    model: String,
    front: FrontRequest,
    stream: bool,
    include_usage: bool,
    kind: Kind,
) -> Result<Response, ApiError> {
    let (mut events, _) = start(&state, &model, front).await?;
    let id = format!("{}-{}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, uuid::Uuid::new_v4().simple());
    let created = crate::util::now_ms() / 1000;
    if !stream {
        let mut text = String::new();
        loop {
            match events.recv().await {
                Some(FrontEvent::Text { text: t }) => text.push_str(&t),
                Some(FrontEvent::Done { finish_reason: reason, report }) => {
                    record(&state, &model, &report);
                    let choice = match kind {
                        Kind::Chat => {
                            json!({ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": finish_reason(reason), "logprobs": null })
                        }
                        Kind::Completion => {
                            json!({ "index": 0, "text": text, "finish_reason": finish_reason(reason), "logprobs": null })
                        }
                    };
                    let object = if kind == Kind::Chat { "chat.completion" } else { "text_completion" };
                    let body = json!({ "id": id, "object": object, "created": created, "model": model, "choices": [choice], "usage": usage(&report), "shoal": report });
                    return Ok(Json(body).into_response());
                }
                Some(FrontEvent::Error { message, .. }) => return Err(ApiError::failed(message)),
                Some(FrontEvent::Started { .. }) => {}
                None => return Err(ApiError::failed("the instance stopped in the middle of the request")),
            }
        }
    }
    let stream = sse_stream(state, events, id, created, model, include_usage, kind);
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

fn sse_stream(
    state: ApiState,
    mut events: UnboundedReceiver<FrontEvent>,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    kind: Kind,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let object = if kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
    let model_name = model.clone();
    let chunk = move |choice: Value, extra: Option<(&str, Value)>| {
        let mut body = json!({ "id": id, "object": object, "created": created, "model": model, "choices": [choice] });
        if let Some((k, v)) = extra {
            body[k] = v;
        }
        Event::default().data(body.to_string())
    };
    let delta = move |text: Option<&str>, reason: Option<&str>| match kind {
        Kind::Chat => {
            let d = match text {
                Some(t) => json!({ "content": t }),
                None if reason.is_none() => json!({ "role": "assistant", "content": "" }),
                None => json!({}),
            };
            json!({ "index": 0, "delta": d, "finish_reason": reason, "logprobs": null })
        }
        Kind::Completion => {
            json!({ "index": 0, "text": text.unwrap_or(""), "finish_reason": reason, "logprobs": null })
        }
    };
    async_stream(move |tx| async move {
        if kind == Kind::Chat && tx.send(chunk(delta(None, None), None)).is_err() {
            return;
        }
        while let Some(event) = events.recv().await {
            let out = match event {
                FrontEvent::Started { .. } => continue,
                FrontEvent::Text { text } => vec![chunk(delta(Some(&text), None), None)],
                FrontEvent::Done { finish_reason: reason, report } => {
                    record(&state, &model_name, &report);
                    let mut out = vec![chunk(delta(None, Some(finish_reason(reason))), Some(("shoal", json!(report))))];
                    if include_usage {
                        out.push(
                            Event::default()
                                .data(json!({ "object": object, "choices": [], "usage": usage(&report) }).to_string()),
                        );
                    }
                    out.push(Event::default().data("[DONE]"));
                    for e in out {
                        let _ = tx.send(e);
                    }
                    return;
                }
                FrontEvent::Error { message, .. } => {
                    let _ = tx.send(Event::default().data(ApiError::failed(message).body().to_string()));
                    let _ = tx.send(Event::default().data("[DONE]"));
                    return;
                }
            };
            for e in out {
                if tx.send(e).is_err() {
                    return; // the client went away: dropping `events` cancels the request
                }
            }
        }
    })
}

/// A stream fed by a task through a channel (the task ends when the client goes away).
fn async_stream<F, Fut>(producer: F) -> impl Stream<Item = Result<Event, Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::UnboundedSender<Event>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(producer(tx));
    tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(Ok)
}

use futures_util::StreamExt;

pub async fn models(State(state): State<ApiState>) -> Json<Value> {
    let registry = state.agent.registry();
    let mut seen = std::collections::BTreeSet::new();
    let data: Vec<Value> = registry
        .instances
        .values()
        .filter(|i| i.state == InstanceState::Ready && seen.insert(i.model.clone()))
        .map(|i| json!({ "id": i.model, "object": "model", "created": i.created_at_ms / 1000, "owned_by": "shoal", "instance": i.id }))
        .collect();
    Json(json!({ "object": "list", "data": data }))
}
