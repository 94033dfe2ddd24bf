//! Anthropic's Messages API: `POST /v1/messages`, whole or streamed with Anthropic's event sequence
//! (`message_start`, `content_block_start`, `ping`, `content_block_delta`s, `content_block_stop`,
//! `message_delta` with the stop reason and usage, `message_stop`), and errors in Anthropic's shape.
//! Messages go to the model's own chat template as the OpenAI route's do; `tools`, `tool_use` and
//! `tool_result` blocks as OpenAI's tools, calls and `tool` messages (see [`super::tools`]), and calls in
//! the reply come back as `tool_use` blocks. Images, server tools and a last assistant message to
//! continue (prefill) are refused with a 400 that says so.

use super::generation::{self, model_name, Content, Finished, Piece, Sampling};
use super::tools::{self, ToolCall, ToolStream, Turn};
use super::{ApiError, ApiState, Dialect};
use crate::engine::{FinishReason, OutputFormat};
use crate::model::ChatMessage;
use crate::worker::{FrontRequest, GenerationReport};
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
    content: Value,
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
    tool_choice: Option<Value>,
    /// Structured outputs: `{"type": "json_schema", "schema": {…}}`.
    output_format: Option<Value>,
}

/// A message's content by kind: its text, the tools it calls (an assistant's `tool_use` blocks, as
/// OpenAI's `tool_calls`) and the results it gives (a user's `tool_result` blocks, as `tool` messages).
#[derive(Default)]
struct Blocks {
    text: String,
    calls: Vec<Value>,
    results: Vec<(String, String)>,
}

fn blocks(content: Value) -> Result<Blocks, ApiError> {
    let text_of = |v: Value| match v {
        Value::Null => Ok(String::new()),
        v => serde_json::from_value::<Content>(v)
            .map_err(|_| ApiError::bad_param("messages", "content must be a string or a list of blocks"))?
            .into_text("messages"),
    };
    let list = match content {
        Value::Array(list) => list,
        other => return Ok(Blocks { text: text_of(other)?, ..Blocks::default() }),
    };
    let mut b = Blocks::default();
    for block in list {
        match block["type"].as_str() {
            Some("text") => b.text.push_str(block["text"].as_str().unwrap_or_default()),
            Some("tool_use") => b.calls.push(json!({
                "id": block["id"], "type": "function",
                "function": { "name": block["name"], "arguments": block["input"] },
            })),
            Some("tool_result") => {
                let id = block["tool_use_id"].as_str().unwrap_or_default().to_string();
                b.results.push((id, text_of(block["content"].clone())?));
            }
            other => {
                return Err(ApiError::bad_param(
                    "messages",
                    format!("content of type {other:?} is not supported (text, tool_use and tool_result only)"),
                ))
            }
        }
    }
    Ok(b)
}

/// The tools a request offers as chat templates take them (OpenAI's function tools), under
/// `tool_choice` (`auto` or absent: all; `none`: none).
fn offered(tools: Vec<Value>, choice: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    match choice.map(|c| c["type"].as_str()) {
        None | Some(Some("auto")) => {}
        Some(Some("none")) => return Ok(vec![]),
        _ => {
            let message = "tool_choice must be {\"type\": \"auto\"} or {\"type\": \"none\"} (any and a named tool are not supported yet)";
            return Err(ApiError::bad_param("tool_choice", message));
        }
    }
    let function = |t: Value| {
        if !t["name"].is_string() || t.get("type").is_some_and(|kind| kind != "custom") {
            return Err(ApiError::bad_param("tools", format!("only custom tools with a name are supported, not {t}")));
        }
        let parameters = t.get("input_schema").cloned().unwrap_or(json!({ "type": "object" }));
        Ok(
            json!({ "type": "function", "function": { "name": t["name"], "description": t["description"], "parameters": parameters } }),
        )
    };
    tools.into_iter().map(function).collect()
}

/// `POST /v1/messages`.
pub async fn messages(State(state): State<ApiState>, body: Result<Json<Value>, JsonRejection>) -> Response {
    match respond(state, body).await {
        Ok(response) => response,
        Err(e) => e.into_response_as(Dialect::Anthropic),
    }
}

/// A messages body as `messages` checks it: the model, whether to stream, whether tools are offered, and
/// the request for the instance.
pub(super) fn check(body: Result<Json<Value>, JsonRejection>) -> Result<(String, bool, bool, FrontRequest), ApiError> {
    to_front(super::openai::parse(body)?)
}

/// The checks of `check` on a parsed request.
fn to_front(request: MessagesRequest) -> Result<(String, bool, bool, FrontRequest), ApiError> {
    let model = model_name(request.model.as_deref())?;
    let max_tokens = match request.max_tokens {
        None => return Err(ApiError::bad_param("max_tokens", "`max_tokens` is required")),
        Some(n) if n < 1 => {
            return Err(ApiError::bad_param("max_tokens", format!("max_tokens must be 1 or more, not {n}")))
        }
        Some(n) => n as usize,
    };
    let tools = offered(request.tools, request.tool_choice.as_ref())?;
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
        chat.push(Turn::plain(ChatMessage::new("system", &system.into_text("system")?)));
    }
    for m in messages {
        if !matches!(m.role.as_str(), "user" | "assistant") {
            return Err(ApiError::bad_param(
                "messages",
                format!("unknown role {:?} (user or assistant; the system prompt is `system`)", m.role),
            ));
        }
        let Blocks { text, calls, results } = blocks(m.content)?;
        let answered = !results.is_empty();
        for (id, content) in results {
            chat.push(Turn { message: ChatMessage::new("tool", &content), calls: vec![], answers: Some(id) });
        }
        if !(answered && text.is_empty()) {
            chat.push(Turn { message: ChatMessage { role: m.role, content: text }, calls, answers: None });
        }
    }
    let with_tools = !tools.is_empty();
    let mut sampling = request.sampling.params(1.0)?;
    sampling.format = request.output_format.as_ref().map(output_format).transpose()?;
    let front = FrontRequest {
        prompt: tools::prompt(chat, tools),
        max_tokens,
        sampling,
        stop: request.stop_sequences,
        ignore_eos: false,
    };
    Ok((model, request.stream, with_tools, front))
}

/// `output_format`: `json_schema` with the schema under `schema`.
fn output_format(value: &Value) -> Result<OutputFormat, ApiError> {
    let bad = |why: String| ApiError::bad_param("output_format", why);
    let schema = match value.get("type").and_then(Value::as_str) {
        Some("json_schema") => value.get("schema").filter(|s| s.is_object()),
        _ => return Err(bad("`output_format.type` must be json_schema".into())),
    };
    let schema = schema.ok_or_else(|| bad("json_schema needs a `schema` object".into()))?;
    let format = OutputFormat::JsonSchema { schema: schema.clone() };
    format.check().map_err(bad)?;
    Ok(format)
}

/// Anthropic's `stop_reason` and `stop_sequence` for how a request ended (`tool_use` when it called
/// tools).
fn stop(reason: FinishReason, report: &GenerationReport, called: bool) -> Value {
    let (stop, sequence) = match (reason, report.stop_sequence.as_deref()) {
        _ if called => ("tool_use", None),
        (FinishReason::Length, _) => ("max_tokens", None),
        (_, Some(stop)) => ("stop_sequence", Some(stop)),
        _ => ("end_turn", None),
    };
    json!({ "stop_reason": stop, "stop_sequence": sequence })
}

/// A reply's content blocks and stop reason: with tools, the calls in `text` become `tool_use` blocks.
fn content(text: String, with_tools: bool, reason: FinishReason, report: &GenerationReport) -> (Vec<Value>, Value) {
    let (text, calls) = if with_tools { tools::split(&text) } else { (text, vec![]) };
    let mut blocks = vec![json!({ "type": "text", "text": text })];
    blocks.extend(calls.iter().map(ToolCall::to_anthropic));
    (blocks, stop(reason, report, !calls.is_empty()))
}

async fn respond(state: ApiState, body: Result<Json<Value>, JsonRejection>) -> Result<Response, ApiError> {
    let (model, stream, with_tools, front) = check(body)?;
    let (events, prompt_tokens) = generation::start(&state, &model, front).await?;
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    if !stream {
        let Finished { text, reason, report } = generation::collect(&state, &model, events).await?;
        let (content, stop) = content(text, with_tools, reason, &report);
        let body = json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop["stop_reason"],
            "stop_sequence": stop["stop_sequence"],
            "usage": { "input_tokens": report.prompt_tokens, "output_tokens": report.generated_tokens },
        });
        return Ok(Json(body).into_response());
    }
    let event = |name: &str, data: Value| Event::default().event(name).data(data.to_string());
    let message = json!({
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": { "input_tokens": prompt_tokens, "output_tokens": 0 },
    });
    let block_start = move |index: usize, block: Value| {
        event("content_block_start", json!({ "type": "content_block_start", "index": index, "content_block": block }))
    };
    let block_delta = move |index: usize, delta: Value| {
        event("content_block_delta", json!({ "type": "content_block_delta", "index": index, "delta": delta }))
    };
    let block_stop =
        move |index: usize| event("content_block_stop", json!({ "type": "content_block_stop", "index": index }));
    let text_delta =
        move |text: &str| (!text.is_empty()).then(|| block_delta(0, json!({ "type": "text_delta", "text": text })));
    let first = vec![
        event("message_start", json!({ "type": "message_start", "message": message })),
        block_start(0, json!({ "type": "text", "text": "" })),
        event("ping", json!({ "type": "ping" })),
    ];
    let mut calls_stream = with_tools.then(ToolStream::default);
    let stream = generation::relay(state, model, events, first, move |piece| match piece {
        Piece::Text(text) => {
            let shown = match &mut calls_stream {
                Some(s) => s.push(&text),
                None => text,
            };
            text_delta(&shown).into_iter().collect()
        }
        Piece::Done(reason, report) => {
            // With tools, the held text is the rest of the text block and the calls, a block each.
            let (rest, calls) = calls_stream.as_mut().map(ToolStream::finish).unwrap_or_default();
            let mut out: Vec<Event> = text_delta(&rest).into_iter().collect();
            out.push(block_stop(0));
            for (i, call) in calls.iter().enumerate() {
                let mut block = call.to_anthropic();
                let input = std::mem::replace(&mut block["input"], json!({}));
                out.push(block_start(i + 1, block));
                out.push(block_delta(i + 1, json!({ "type": "input_json_delta", "partial_json": input.to_string() })));
                out.push(block_stop(i + 1));
            }
            let delta = stop(reason, &report, !calls.is_empty());
            let usage = json!({ "output_tokens": report.generated_tokens });
            out.push(event("message_delta", json!({ "type": "message_delta", "delta": delta, "usage": usage })));
            out.push(event("message_stop", json!({ "type": "message_stop" })));
            out
        }
        Piece::Failed(message) => vec![event("error", ApiError::failed(message).anthropic_body())],
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::PromptInput;

    #[test]
    fn tool_use_and_tool_result_blocks_become_calls_and_tool_messages() {
        let request: MessagesRequest = serde_json::from_value(json!({
            "model": "m", "max_tokens": 8,
            "tools": [{ "name": "w", "input_schema": { "type": "object" } }],
            "messages": [
                { "role": "user", "content": "Weather?" },
                { "role": "assistant", "content": [
                    { "type": "text", "text": "Checking." },
                    { "type": "tool_use", "id": "t1", "name": "w", "input": { "city": "Oslo" } },
                ] },
                { "role": "user", "content": [
                    { "type": "tool_result", "tool_use_id": "t1", "content": [{ "type": "text", "text": "sunny" }] },
                ] },
            ],
        }))
        .unwrap();
        let (_, _, with_tools, front) = to_front(request).unwrap();
        assert!(with_tools);
        let PromptInput::Conversation { messages, tools } = front.prompt else { panic!("not a conversation") };
        assert_eq!(tools[0]["function"]["name"], "w");
        let call =
            json!({ "id": "t1", "type": "function", "function": { "name": "w", "arguments": { "city": "Oslo" } } });
        assert_eq!(messages[1], json!({ "role": "assistant", "content": "Checking.", "tool_calls": [call] }));
        assert_eq!(messages[2], json!({ "role": "tool", "content": "sunny", "tool_call_id": "t1" }));
        assert_eq!(messages.len(), 3);
        let server_tool = json!({ "model": "m", "max_tokens": 8, "tools": [{ "type": "web_search_20250305", "name": "s" }],
            "messages": [{ "role": "user", "content": "x" }] });
        assert!(to_front(serde_json::from_value(server_tool).unwrap()).is_err());
    }

    #[test]
    fn calls_in_a_reply_become_tool_use_blocks_only_when_tools_were_offered() {
        let report = GenerationReport::default();
        let reply = "On it.<tool_call>{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>";
        let (blocks, stop) = content(reply.into(), true, FinishReason::Stop, &report);
        assert_eq!(blocks[0], json!({ "type": "text", "text": "On it." }));
        assert_eq!((&blocks[1]["type"], &blocks[1]["name"]), (&json!("tool_use"), &json!("w")));
        assert_eq!(blocks[1]["input"], json!({ "city": "Oslo" }));
        assert_eq!(stop, json!({ "stop_reason": "tool_use", "stop_sequence": null }));
        let (blocks, stop) = content(reply.into(), false, FinishReason::Length, &report);
        assert_eq!(blocks, vec![json!({ "type": "text", "text": reply })]);
        assert_eq!(stop["stop_reason"], "max_tokens");
    }
}
