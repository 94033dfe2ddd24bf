//! Anthropic's Messages API: `POST /v1/messages`, whole or streamed with Anthropic's event sequence
//! (`message_start`, `content_block_start`, `ping`, `content_block_delta`s, `content_block_stop`,
//! `message_delta` with the stop reason and usage, `message_stop`), and errors in Anthropic's shape.
//! Messages go to the model's own chat template as the OpenAI route's do. Text content only: tool use,
//! images and a last assistant message to continue (prefill) are refused with a 400 that says so.

use super::generation::{self, model_name, Content, Finished, Piece, Sampling};
use super::{ApiError, ApiState, Dialect};
use crate::engine::FinishReason;
use crate::model::ChatMessage;
use crate::worker::{FrontRequest, GenerationReport, PromptInput};
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

/// Most stop sequences a request may give.
const MAX_STOP_SEQUENCES: usize = 16;

#[derive(Deserialize)]
struct MessageIn {
    role: String,
    content: Content,
}

#[derive(Deserialize)]
struct MessagesRequest {
    model: Option<String>,
    max_tokens: Option<i64>,
    messages: Option<Vec<MessageIn>>,
    system: Option<Content>,
    #[serde(default)]
    stop_sequences: Vec<String>,
    #[serde(default)]
    stream: bool,
    #[serde(flatten)]
    sampling: Sampling,
    #[serde(default)]
    tools: Vec<Value>,
}

/// `POST /v1/messages`.
pub async fn messages(State(state): State<ApiState>, body: Result<Json<Value>, JsonRejection>) -> Response {
    match respond(state, body).await {
        Ok(response) => response,
        Err(e) => e.into_response_as(Dialect::Anthropic),
    }
}

fn to_front(request: MessagesRequest) -> Result<(String, bool, FrontRequest), ApiError> {
    let model = model_name(request.model.as_deref())?;
    let max_tokens = match request.max_tokens {
        None => return Err(ApiError::bad_param("max_tokens", "`max_tokens` is required")),
        Some(n) if n < 1 => {
            return Err(ApiError::bad_param("max_tokens", format!("max_tokens must be 1 or more, not {n}")))
        }
        Some(n) => n as usize,
    };
    if !request.tools.is_empty() {
        return Err(ApiError::bad_param("tools", "tools are not supported on this node yet"));
    }
    if request.stop_sequences.len() > MAX_STOP_SEQUENCES {
        return Err(ApiError::bad_param("stop_sequences", format!("at most {MAX_STOP_SEQUENCES} stop sequences")));
    }
    let messages = request
        .messages
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::bad_param("messages", "`messages` must be a non-empty list"))?;
    if messages.last().is_some_and(|m| m.role == "assistant") {
        return Err(ApiError::bad_param(
            "messages",
            "the last message must be the user's: continuing an assistant message (prefill) is not supported",
        ));
    }
    let mut chat = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = request.system {
        chat.push(ChatMessage { role: "system".into(), content: system.into_text("system")? });
    }
    for m in messages {
        if !matches!(m.role.as_str(), "user" | "assistant") {
            return Err(ApiError::bad_param(
                "messages",
                format!("unknown role {:?} (user or assistant; the system prompt is `system`)", m.role),
            ));
        }
        chat.push(ChatMessage { content: m.content.into_text("messages")?, role: m.role });
    }
    let front = FrontRequest {
        prompt: PromptInput::Messages(chat),
        max_tokens,
        sampling: request.sampling.params(1.0)?,
        stop: request.stop_sequences,
        ignore_eos: false,
    };
    Ok((model, request.stream, front))
}

/// Anthropic's stop reason and stop sequence for how a request ended.
fn stop_reason(reason: FinishReason, report: &GenerationReport) -> (&'static str, Option<&str>) {
    match (reason, report.stop_sequence.as_deref()) {
        (FinishReason::Length, _) => ("max_tokens", None),
        (_, Some(stop)) => ("stop_sequence", Some(stop)),
        _ => ("end_turn", None),
    }
}

async fn respond(state: ApiState, body: Result<Json<Value>, JsonRejection>) -> Result<Response, ApiError> {
    let (model, stream, front) = to_front(super::openai::parse(body)?)?;
    let (events, prompt_tokens) = generation::start(&state, &model, front).await?;
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    if !stream {
        let Finished { text, reason, report } = generation::collect(&state, &model, events).await?;
        let (stop_reason, stop_sequence) = stop_reason(reason, &report);
        return Ok(Json(json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{ "type": "text", "text": text }],
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": { "input_tokens": report.prompt_tokens, "output_tokens": report.generated_tokens },
        }))
        .into_response());
    }
    let event = |name: &str, data: Value| Event::default().event(name).data(data.to_string());
    let message = json!({
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": { "input_tokens": prompt_tokens, "output_tokens": 0 },
    });
    let first = vec![
        event("message_start", json!({ "type": "message_start", "message": message })),
        event(
            "content_block_start",
            json!({ "type": "content_block_start", "index": 0, "content_block": { "type": "text", "text": "" } }),
        ),
        event("ping", json!({ "type": "ping" })),
    ];
    let stream = generation::relay(state, model, events, first, move |piece| match piece {
        Piece::Text(text) => vec![event(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": 0, "delta": { "type": "text_delta", "text": text } }),
        )],
        Piece::Done(reason, report) => {
            let (stop_reason, stop_sequence) = stop_reason(reason, &report);
            vec![
                event("content_block_stop", json!({ "type": "content_block_stop", "index": 0 })),
                event(
                    "message_delta",
                    json!({
                        "type": "message_delta",
                        "delta": { "stop_reason": stop_reason, "stop_sequence": stop_sequence },
                        "usage": { "output_tokens": report.generated_tokens },
                    }),
                ),
                event("message_stop", json!({ "type": "message_stop" })),
            ]
        }
        Piece::Failed(message) => vec![event("error", ApiError::failed(message).anthropic_body())],
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}
