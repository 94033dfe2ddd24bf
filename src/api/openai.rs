//! The OpenAI-compatible endpoints: `POST /v1/chat/completions` and `POST /v1/completions` (streamed as
//! server-sent events or whole), and `GET /v1/models`. Requests are checked up front and refused with a
//! 4xx and a message that names the parameter; the model's own errors (a prompt beyond the context) are
//! 400s too; a failure of the instance mid-stream arrives as an error event.

use super::generation::{self, model_name, Content, Finished, Piece, Sampling, Started};
use super::reply::{self, Part, ReplyStream};
use super::tools::{self, Turn};
use super::{ApiError, ApiState};
use crate::engine::{FinishReason, OutputFormat};
use crate::model::{ChatMessage, ReplyFormat};
use crate::worker::{FrontRequest, GenerationReport, PromptInput};
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct MessageIn {
    role: String,
    content: Option<Content>,
    #[serde(default)]
    tool_calls: Vec<Value>,
    tool_call_id: Option<String>,
    /// An earlier reply's reasoning, as this API returns it (`reasoning` as some clients send it).
    #[serde(alias = "reasoning")]
    reasoning_content: Option<String>,
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
    #[serde(flatten)]
    sampling: Sampling,
    stop: Option<Stop>,
    n: Option<u32>,
    /// shoal's extension: keep generating past end-of-generation tokens (benchmarks).
    #[serde(default)]
    ignore_eos: bool,
    response_format: Option<Value>,
}

/// What only chat requests have besides messages and tools.
#[derive(Deserialize)]
struct ChatOnly {
    #[serde(flatten)]
    common: Common,
    /// gpt-oss's reasoning effort: low, medium or high.
    reasoning_effort: Option<String>,
    /// The chat template's own variables, as llama.cpp's and vLLM's servers take them.
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// `false`: one tool call at most.
    parallel_tool_calls: Option<bool>,
}

type ChatRequest = generation::ChatRequest<ChatOnly, MessageIn>;

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

pub(super) fn parse<T: for<'de> Deserialize<'de>>(body: Result<Json<Value>, JsonRejection>) -> Result<T, ApiError> {
    let Json(value) =
        body.map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {}", e.body_text())))?;
    serde_json::from_value(value).map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))
}

impl Common {
    fn to_front(&self, prompt: PromptInput) -> Result<(String, FrontRequest), ApiError> {
        let model = model_name(self.model.as_deref())?;
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
        let mut sampling = self.sampling.params(2.0)?;
        sampling.format = self.response_format.as_ref().map(response_format).transpose()?.flatten();
        let stop = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) if v.len() > 4 => return Err(ApiError::bad_param("stop", "at most 4 stop sequences")),
            Some(Stop::Many(v)) => v.clone(),
        };
        Ok((model, FrontRequest { prompt, max_tokens, sampling, stop, ignore_eos: self.ignore_eos }))
    }
}

/// `response_format`: `text`, `json_object`, or `json_schema` with the schema under `json_schema.schema`.
pub(super) fn response_format(value: &Value) -> Result<Option<OutputFormat>, ApiError> {
    let bad = |why: String| ApiError::bad_param("response_format", why);
    let format = match value.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => OutputFormat::JsonObject,
        Some("json_schema") => {
            let schema = value.pointer("/json_schema/schema").filter(|s| s.is_object() || s.is_boolean());
            let schema = schema.ok_or_else(|| bad("json_schema needs a `json_schema.schema` object".into()))?;
            OutputFormat::JsonSchema { schema: schema.clone() }
        }
        _ => return Err(bad("`response_format.type` must be text, json_object or json_schema".into())),
    };
    format.check().map_err(bad)?;
    Ok(Some(format))
}

fn chat_messages(messages: Option<Vec<MessageIn>>) -> Result<Vec<Turn>, ApiError> {
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
                Some(content) => content.into_text("messages")?,
            };
            let role = if m.role == "developer" { "system".to_string() } else { m.role };
            let message = ChatMessage { role, content };
            Ok(Turn { message, calls: m.tool_calls, answers: m.tool_call_id, reasoning: m.reasoning_content })
        })
        .collect()
}

pub async fn chat_completions(
    State(state): State<ApiState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (model, front, stream, include_usage, kind) = check_chat(body)?;
    respond(state, model, front, stream, include_usage, kind).await
}

/// A chat body as `chat_completions` checks it: the model, the request, whether to stream and to report
/// usage, and the kind of answer.
pub(super) fn check_chat(
    body: Result<Json<Value>, JsonRejection>,
) -> Result<(String, FrontRequest, bool, bool, Kind), ApiError> {
    let request: ChatRequest = parse(body)?;
    let messages = chat_messages(request.messages)?;
    let choice = tools::Choice::from_openai(request.tool_choice.as_ref())?;
    let (tools, forced) = tools::offered(request.tools, choice)?;
    let kind = if tools.is_empty() { Kind::Chat } else { Kind::ChatWithTools };
    let ChatOnly { common, reasoning_effort, chat_template_kwargs, parallel_tool_calls } = request.common;
    let variables = generation::template_variables(chat_template_kwargs, reasoning_effort.as_deref(), None)?;
    let (model, mut front) = common.to_front(tools::prompt(messages, tools, variables))?;
    tools::impose(&mut front.sampling.format, forced)?;
    if parallel_tool_calls == Some(false) {
        tools::one_call_only(&mut front.sampling.format);
    }
    let include_usage = common.stream_options.as_ref().is_some_and(|o| o.include_usage);
    Ok((model, front, common.stream, include_usage, kind))
}

pub async fn completions(
    State(state): State<ApiState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (model, front, stream, include_usage) = check_completion(body)?;
    respond(state, model, front, stream, include_usage, Kind::Completion).await
}

/// A completion body as `completions` checks it: the model, the request, whether to stream and to
/// report usage.
pub(super) fn check_completion(
    body: Result<Json<Value>, JsonRejection>,
) -> Result<(String, FrontRequest, bool, bool), ApiError> {
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
    Ok((model, front, request.common.stream, include_usage))
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kind {
    Chat,
    /// A chat whose reply may call the tools the request offers.
    ChatWithTools,
    Completion,
}

fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

/// OpenAI's usage: the prompt's tokens count those the prompt cache gave back, which it names apart;
/// the reply's, the drafted tokens speculative decoding kept and rejected (OpenAI's names for a
/// predicted output's).
fn usage(report: &GenerationReport) -> Value {
    json!({
        "prompt_tokens": report.prompt_tokens,
        "completion_tokens": report.generated_tokens,
        "total_tokens": report.prompt_tokens + report.generated_tokens,
        "prompt_tokens_details": { "cached_tokens": report.cached_tokens },
        "completion_tokens_details": {
            "accepted_prediction_tokens": report.accepted_tokens,
            "rejected_prediction_tokens": report.drafted_tokens.saturating_sub(report.accepted_tokens),
        },
    })
}

/// A chat reply's message and finish reason: its reasoning as `reasoning_content`, and with tools, the
/// calls taken out of its text.
fn chat_message(text: &str, format: ReplyFormat, reason: FinishReason, kind: Kind) -> (Value, &'static str) {
    let reply = reply::split(format, kind == Kind::ChatWithTools, text);
    let mut message = json!({ "role": "assistant", "content": reply.content });
    if !reply.reasoning.is_empty() {
        message["reasoning_content"] = json!(reply.reasoning);
    }
    if reply.calls.is_empty() {
        return (message, finish_reason(reason));
    }
    let calls: Vec<Value> = reply.calls.iter().enumerate().map(|(i, c)| c.to_openai(i)).collect();
    if reply.content.is_empty() {
        message["content"] = Value::Null;
    }
    message["tool_calls"] = json!(calls);
    (message, "tool_calls")
}

async fn respond(
    state: ApiState,
    model: String,
    front: FrontRequest,
    stream: bool,
    include_usage: bool,
    kind: Kind,
) -> Result<Response, ApiError> {
    let Started { events, reply: format, .. } = generation::start(&state, &model, front).await?;
    let chat = kind != Kind::Completion;
    let id = format!("{}-{}", if chat { "chatcmpl" } else { "cmpl" }, uuid::Uuid::new_v4().simple());
    let created = crate::util::now_ms() / 1000;
    if !stream {
        let Finished { text, reason, report } = generation::collect(&state, &model, events).await?;
        let choice = if chat {
            let (message, reason) = chat_message(&text, format, reason, kind);
            json!({ "index": 0, "message": message, "finish_reason": reason, "logprobs": null })
        } else {
            json!({ "index": 0, "text": text, "finish_reason": finish_reason(reason), "logprobs": null })
        };
        let object = if chat { "chat.completion" } else { "text_completion" };
        let body = json!({ "id": id, "object": object, "created": created, "model": model, "choices": [choice], "usage": usage(&report), "shoal": report });
        return Ok(Json(body).into_response());
    }
    let object = if chat { "chat.completion.chunk" } else { "text_completion" };
    let chunk = {
        let model = model.clone();
        move |choice: Value, extra: Option<(&str, Value)>| {
            let mut body =
                json!({ "id": id, "object": object, "created": created, "model": model, "choices": [choice] });
            if let Some((k, v)) = extra {
                body[k] = v;
            }
            Event::default().data(body.to_string())
        }
    };
    // A chunk's choice: a chat's delta (`d`, or the opening role when neither it nor a reason is given), or
    // a completion's text.
    let choice = move |d: Option<Value>, reason: Option<&str>| {
        if chat {
            let d = d.unwrap_or_else(|| {
                if reason.is_none() {
                    json!({ "role": "assistant", "content": "" })
                } else {
                    json!({})
                }
            });
            json!({ "index": 0, "delta": d, "finish_reason": reason, "logprobs": null })
        } else {
            let text = d.as_ref().and_then(|d| d["content"].as_str()).unwrap_or("").to_string();
            json!({ "index": 0, "text": text, "finish_reason": reason, "logprobs": null })
        }
    };
    // A chat's piece as a delta: its answer as `content`, its reasoning as `reasoning_content`.
    let delta = |part: Part| match part {
        Part::Content(t) => json!({ "content": t }),
        Part::Reasoning(t) => json!({ "reasoning_content": t }),
    };
    let first = if chat { vec![chunk(choice(None, None), None)] } else { vec![] };
    let mut reader = chat.then(|| ReplyStream::new(format, kind == Kind::ChatWithTools));
    let stream = generation::relay(state, model, events, first, move |piece| match piece {
        Piece::Text(t) => {
            let parts = match &mut reader {
                Some(r) => r.push(&t),
                None if t.is_empty() => vec![],
                None => vec![Part::Content(t)],
            };
            parts.into_iter().map(|p| chunk(choice(Some(delta(p)), None), None)).collect()
        }
        Piece::Done(reason, report) => {
            let mut out = Vec::new();
            let mut reason = finish_reason(reason);
            if let Some((rest, calls)) = reader.as_mut().map(ReplyStream::finish) {
                out.extend(rest.into_iter().map(|p| chunk(choice(Some(delta(p)), None), None)));
                if !calls.is_empty() {
                    let calls: Vec<Value> = calls.iter().enumerate().map(|(i, c)| c.to_openai(i)).collect();
                    out.push(chunk(choice(Some(json!({ "tool_calls": calls })), None), None));
                    reason = "tool_calls";
                }
            }
            out.push(chunk(choice(Some(json!({})), Some(reason)), Some(("shoal", json!(report)))));
            if include_usage {
                let body = json!({ "object": object, "choices": [], "usage": usage(&report) });
                out.push(Event::default().data(body.to_string()));
            }
            out.push(Event::default().data("[DONE]"));
            out
        }
        Piece::Failed(message) => {
            vec![Event::default().data(ApiError::failed(message).body().to_string()), Event::default().data("[DONE]")]
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

/// `GET /v1/models`: the running models, in a list both OpenAI's and Anthropic's clients read.
pub async fn models(State(state): State<ApiState>) -> Json<Value> {
    let data: Vec<Value> = generation::ready_instances(&state)
        .iter()
        .map(|i| {
            json!({
                "id": i.model, "object": "model", "created": i.created_at_ms / 1000, "owned_by": "shoal",
                "instance": i.id,
                "type": "model", "display_name": i.model, "created_at": crate::util::rfc3339(i.created_at_ms),
                "lifecycle": "active",
            })
        })
        .collect();
    let (first, last) = (data.first().map(|m| m["id"].clone()), data.last().map(|m| m["id"].clone()));
    Json(json!({ "object": "list", "data": data, "has_more": false, "first_id": first, "last_id": last }))
}
