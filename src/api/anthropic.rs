//! Anthropic's Messages API: `POST /v1/messages`, whole or streamed with Anthropic's event sequence
//! (`message_start`, `content_block_start`, `ping`, `content_block_delta`s, `content_block_stop`,
//! `message_delta` with the stop reason and usage, `message_stop`), and errors in Anthropic's shape.
//! Messages go to the model's own chat template as the OpenAI route's do; `tools`, `tool_use` and
//! `tool_result` blocks as OpenAI's tools, calls and `tool` messages (see [`super::tools`]), and calls in
//! the reply come back as `tool_use` blocks. Images, server tools and a last assistant message to
//! continue (prefill) are refused with a 400 that says so.

use super::generation::{self, model_name, Content, Finished, Piece, Sampling, Started};
use super::reply::{self, Part, ReplyStream};
use super::tools::{self, ToolCall, Turn};
use super::{ApiError, ApiState, Dialect};
use crate::engine::{FinishReason, OutputFormat};
use crate::model::{ChatMessage, ReplyFormat};
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
    /// Extended thinking: `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`.
    thinking: Option<Value>,
}

/// A message's content by kind: its text, the tools it calls (an assistant's `tool_use` blocks, as
/// OpenAI's `tool_calls`), the results it gives (a user's `tool_result` blocks, as `tool` messages) and
/// an assistant's thinking.
#[derive(Default)]
struct Blocks {
    text: String,
    calls: Vec<Value>,
    results: Vec<(String, String)>,
    thinking: String,
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
            Some("thinking") => b.thinking.push_str(block["thinking"].as_str().unwrap_or_default()),
            // Thinking another model encrypted: nothing a template can use.
            Some("redacted_thinking") => {}
            other => {
                return Err(ApiError::bad_param(
                    "messages",
                    format!(
                        "content of type {other:?} is not supported (text, tool_use, tool_result and thinking only)"
                    ),
                ))
            }
        }
    }
    Ok(b)
}

/// The tools a request offers as chat templates take them (OpenAI's function tools), under
/// `tool_choice` (`auto` or absent: all; `none`: none; `any`: a call of one; `tool`: a call of the
/// named one), and the format a required call imposes.
fn offered(tools: Vec<Value>, choice: Option<&Value>) -> Result<(Vec<Value>, Option<OutputFormat>), ApiError> {
    let choice = match choice.map(|c| (c["type"].as_str(), c["name"].as_str())) {
        None | Some((Some("auto"), _)) => tools::Choice::Auto,
        Some((Some("none"), _)) => tools::Choice::None,
        Some((Some("any"), _)) => tools::Choice::Required,
        Some((Some("tool"), Some(name))) => tools::Choice::Named(name.to_string()),
        _ => {
            let message = "tool_choice must be {\"type\": \"auto\"}, {\"type\": \"none\"}, {\"type\": \"any\"} or {\"type\": \"tool\", \"name\": …}";
            return Err(ApiError::bad_param("tool_choice", message));
        }
    };
    let function = |t: Value| {
        if !t["name"].is_string() || t.get("type").is_some_and(|kind| kind != "custom") {
            return Err(ApiError::bad_param("tools", format!("only custom tools with a name are supported, not {t}")));
        }
        let parameters = t.get("input_schema").cloned().unwrap_or(json!({ "type": "object" }));
        Ok(
            json!({ "type": "function", "function": { "name": t["name"], "description": t["description"], "parameters": parameters } }),
        )
    };
    tools::offered(tools.into_iter().map(function).collect::<Result<_, _>>()?, choice)
}

/// `POST /v1/messages`.
pub async fn messages(State(state): State<ApiState>, body: Result<Json<Value>, JsonRejection>) -> Response {
    match respond(state, body).await {
        Ok(response) => response,
        Err(e) => e.into_response_as(Dialect::Anthropic),
    }
}

/// A checked messages request: the model, whether to stream, and the request for the instance.
pub(super) struct Checked {
    model: String,
    stream: bool,
    front: FrontRequest,
    /// Whether the reply may call the tools the request offers.
    with_tools: bool,
    /// Whether the reply's thinking is returned (`thinking` enabled).
    with_thinking: bool,
}

/// A messages body as `messages` checks it.
pub(super) fn check(body: Result<Json<Value>, JsonRejection>) -> Result<Checked, ApiError> {
    to_front(super::openai::parse(body)?)
}

/// What `thinking` asks: whether it turns the template's thinking on (`enabled`), off (`disabled`) or
/// leaves it to the model (absent, or `adaptive`, as Claude Code sends it), and whether the reply's
/// thinking is returned (`enabled`, `adaptive`).
fn thinking(value: Option<&Value>) -> Result<(Option<bool>, bool), ApiError> {
    match value.map(|v| v["type"].as_str()) {
        None => Ok((None, false)),
        Some(Some("enabled")) => Ok((Some(true), true)),
        Some(Some("adaptive")) => Ok((None, true)),
        Some(Some("disabled")) => Ok((Some(false), false)),
        Some(_) => {
            Err(ApiError::bad_param("thinking", "`thinking.type` must be \"enabled\", \"adaptive\" or \"disabled\""))
        }
    }
}

/// The checks of `check` on a parsed request.
fn to_front(request: MessagesRequest) -> Result<Checked, ApiError> {
    let model = model_name(request.model.as_deref())?;
    let max_tokens = match request.max_tokens {
        None => return Err(ApiError::bad_param("max_tokens", "`max_tokens` is required")),
        Some(n) if n < 1 => {
            return Err(ApiError::bad_param("max_tokens", format!("max_tokens must be 1 or more, not {n}")))
        }
        Some(n) => n as usize,
    };
    let (tools, forced) = offered(request.tools, request.tool_choice.as_ref())?;
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
    // The system prompt, and the text of any `system` message among the others (Claude Code sends
    // some): templates take a system message only first, so they join it there, in order.
    let mut system = match request.system {
        Some(system) => vec![system.into_text("system")?],
        None => Vec::new(),
    };
    let mut rest = Vec::with_capacity(messages.len());
    for m in messages {
        match m.role.as_str() {
            "system" => system.push(blocks(m.content)?.text),
            "user" | "assistant" => rest.push(m),
            other => {
                return Err(ApiError::bad_param(
                    "messages",
                    format!("unknown role {other:?} (user, assistant or system)"),
                ))
            }
        }
    }
    if rest.is_empty() {
        return Err(ApiError::bad_param("messages", "`messages` needs a user message besides system ones"));
    }
    if !system.is_empty() {
        chat.push(Turn::plain(ChatMessage::new("system", &system.join("\n\n"))));
    }
    for m in rest {
        let Blocks { text, calls, results, thinking } = blocks(m.content)?;
        let answered = !results.is_empty();
        for (id, content) in results {
            let mut turn = Turn::plain(ChatMessage::new("tool", &content));
            turn.answers = Some(id);
            chat.push(turn);
        }
        if !(answered && text.is_empty()) {
            let reasoning = (!thinking.is_empty()).then_some(thinking);
            chat.push(Turn { message: ChatMessage { role: m.role, content: text }, calls, answers: None, reasoning });
        }
    }
    let with_tools = !tools.is_empty();
    let (enable_thinking, with_thinking) = thinking(request.thinking.as_ref())?;
    let variables = generation::template_variables(None, None, enable_thinking)?;
    let mut sampling = request.sampling.params(1.0)?;
    sampling.format = request.output_format.as_ref().map(output_format).transpose()?;
    tools::impose(&mut sampling.format, forced)?;
    if request.tool_choice.as_ref().is_some_and(|c| c["disable_parallel_tool_use"] == true) {
        tools::one_call_only(&mut sampling.format);
    }
    let front = FrontRequest {
        prompt: tools::prompt(chat, tools, variables),
        max_tokens,
        sampling,
        stop: request.stop_sequences,
        ignore_eos: false,
    };
    Ok(Checked { model, stream: request.stream, front, with_tools, with_thinking })
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
/// Anthropic's usage: `input_tokens` are those run, `cache_read_input_tokens` those the prompt cache
/// gave back (the cache is automatic: nothing is written to it on request).
fn usage(report: &GenerationReport) -> Value {
    json!({
        "input_tokens": report.prompt_tokens - report.cached_tokens,
        "cache_read_input_tokens": report.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": report.generated_tokens,
    })
}

fn stop(reason: FinishReason, report: &GenerationReport, called: bool) -> Value {
    let (stop, sequence) = match (reason, report.stop_sequence.as_deref()) {
        _ if called => ("tool_use", None),
        (FinishReason::Length, _) => ("max_tokens", None),
        (_, Some(stop)) => ("stop_sequence", Some(stop)),
        _ => ("end_turn", None),
    };
    json!({ "stop_reason": stop, "stop_sequence": sequence })
}

/// A thinking block: Anthropic's carry a signature of the model's; shoal's models sign nothing.
fn thinking_block(thinking: &str) -> Value {
    json!({ "type": "thinking", "thinking": thinking, "signature": "" })
}

/// A reply's content blocks and stop reason: its thinking first when asked for, then its text, and with
/// tools, the calls in its text as `tool_use` blocks.
fn content(
    text: &str,
    format: ReplyFormat,
    checked: &Checked,
    reason: FinishReason,
    report: &GenerationReport,
) -> (Vec<Value>, Value) {
    let reply = reply::split(format, checked.with_tools, text);
    let mut blocks = Vec::new();
    if checked.with_thinking && !reply.reasoning.is_empty() {
        blocks.push(thinking_block(&reply.reasoning));
    }
    blocks.push(json!({ "type": "text", "text": reply.content }));
    blocks.extend(reply.calls.iter().map(ToolCall::to_anthropic));
    (blocks, stop(reason, report, !reply.calls.is_empty()))
}

/// The content blocks of a streamed reply, opened as its pieces come: a thinking block (when asked
/// for), the text block, then a block per call.
struct BlockEvents {
    with_thinking: bool,
    /// The open block: its index and whether it is the thinking block.
    open: Option<(usize, bool)>,
    next: usize,
    /// Whether the text block has been opened.
    text_started: bool,
}

/// A server-sent event before it is written: its name and data.
type Sent = (&'static str, Value);

fn event((name, data): Sent) -> Event {
    Event::default().event(name).data(data.to_string())
}

impl BlockEvents {
    fn start(&mut self, block: Value, out: &mut Vec<Sent>) -> usize {
        let index = self.next;
        self.next += 1;
        let thinking = block["type"] == "thinking";
        self.text_started |= block["type"] == "text";
        out.push((
            "content_block_start",
            json!({ "type": "content_block_start", "index": index, "content_block": block }),
        ));
        self.open = Some((index, thinking));
        index
    }

    fn stop(&mut self, out: &mut Vec<Sent>) {
        if let Some((index, thinking)) = self.open.take() {
            if thinking {
                out.push(Self::delta_event(index, json!({ "type": "signature_delta", "signature": "" })));
            }
            out.push(("content_block_stop", json!({ "type": "content_block_stop", "index": index })));
        }
    }

    fn delta_event(index: usize, delta: Value) -> Sent {
        ("content_block_delta", json!({ "type": "content_block_delta", "index": index, "delta": delta }))
    }

    /// The events for one piece of the reply.
    fn part(&mut self, part: Part, out: &mut Vec<Sent>) {
        let (thinking, delta) = match part {
            Part::Reasoning(_) if !self.with_thinking => return,
            Part::Reasoning(t) => (true, json!({ "type": "thinking_delta", "thinking": t })),
            Part::Content(t) => (false, json!({ "type": "text_delta", "text": t })),
        };
        let index = match self.open {
            Some((index, open)) if open == thinking => index,
            _ => {
                self.stop(out);
                let block = if thinking { thinking_block("") } else { json!({ "type": "text", "text": "" }) };
                self.start(block, out)
            }
        };
        out.push(Self::delta_event(index, delta));
    }

    /// The events that end the reply's content: the text block (empty when the reply had no text, as
    /// Anthropic's replies always hold one) and a block per call.
    fn finish(&mut self, calls: &[ToolCall], out: &mut Vec<Sent>) {
        if !self.text_started {
            self.stop(out);
            self.start(json!({ "type": "text", "text": "" }), out);
        }
        self.stop(out);
        for call in calls {
            let mut block = call.to_anthropic();
            let input = std::mem::replace(&mut block["input"], json!({}));
            let index = self.start(block, out);
            out.push(Self::delta_event(
                index,
                json!({ "type": "input_json_delta", "partial_json": input.to_string() }),
            ));
            self.stop(out);
        }
    }
}

async fn respond(state: ApiState, body: Result<Json<Value>, JsonRejection>) -> Result<Response, ApiError> {
    let checked = check(body)?;
    let Started { events, prompt_tokens, reply: format } =
        generation::start(&state, &checked.model, checked.front.clone()).await?;
    let model = checked.model.clone();
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    if !checked.stream {
        let Finished { text, reason, report } = generation::collect(&state, &model, events).await?;
        let (content, stop) = content(&text, format, &checked, reason, &report);
        let body = json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop["stop_reason"],
            "stop_sequence": stop["stop_sequence"],
            "usage": usage(&report),
        });
        return Ok(Json(body).into_response());
    }
    let message = json!({
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": { "input_tokens": prompt_tokens, "output_tokens": 0 },
    });
    let mut blocks = BlockEvents { with_thinking: checked.with_thinking, open: None, next: 0, text_started: false };
    let mut first = vec![("message_start", json!({ "type": "message_start", "message": message }))];
    // The first block opens at once, as Anthropic's streams open it before their ping.
    let opening = if checked.with_thinking { thinking_block("") } else { json!({ "type": "text", "text": "" }) };
    blocks.start(opening, &mut first);
    first.push(("ping", json!({ "type": "ping" })));
    let first = first.into_iter().map(event).collect();
    let mut reader = ReplyStream::new(format, checked.with_tools);
    let stream = generation::relay(state, model, events, first, move |piece| match piece {
        Piece::Text(text) => {
            let mut out = Vec::new();
            reader.push(&text).into_iter().for_each(|part| blocks.part(part, &mut out));
            out.into_iter().map(event).collect()
        }
        Piece::Done(reason, report) => {
            let (rest, calls) = reader.finish();
            let mut out = Vec::new();
            rest.into_iter().for_each(|part| blocks.part(part, &mut out));
            blocks.finish(&calls, &mut out);
            let delta = stop(reason, &report, !calls.is_empty());
            out.push(("message_delta", json!({ "type": "message_delta", "delta": delta, "usage": usage(&report) })));
            out.push(("message_stop", json!({ "type": "message_stop" })));
            out.into_iter().map(event).collect()
        }
        Piece::Failed(message) => vec![event(("error", ApiError::failed(message).anthropic_body()))],
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::PromptInput;

    #[test]
    fn tools_under_auto_hold_calls_lazily_and_one_call_only_when_asked() {
        let request = |choice: Value| -> MessagesRequest {
            let tools = json!([{ "name": "w", "input_schema": { "type": "object" } }]);
            let body = json!({ "model": "m", "max_tokens": 8, "tools": tools, "tool_choice": choice,
                               "messages": [{ "role": "user", "content": "Weather?" }] });
            serde_json::from_value(body).unwrap()
        };
        let single = |choice: Value| match to_front(request(choice)).unwrap().front.sampling.format {
            Some(OutputFormat::ToolCalls { tools, single, .. }) => (tools[0].name.clone(), single),
            other => panic!("{other:?}"),
        };
        assert_eq!(single(json!({ "type": "auto" })), ("w".to_string(), false));
        assert_eq!(single(json!({ "type": "auto", "disable_parallel_tool_use": true })), ("w".to_string(), true));
    }

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
        let Checked { with_tools, front, .. } = to_front(request).unwrap();
        assert!(with_tools);
        let PromptInput::Conversation { messages, tools, .. } = front.prompt else { panic!("not a conversation") };
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
        let (blocks, stop) = content(reply, ReplyFormat::Plain, &checked(true, false), FinishReason::Stop, &report);
        assert_eq!(blocks[0], json!({ "type": "text", "text": "On it." }));
        assert_eq!((&blocks[1]["type"], &blocks[1]["name"]), (&json!("tool_use"), &json!("w")));
        assert_eq!(blocks[1]["input"], json!({ "city": "Oslo" }));
        assert_eq!(stop, json!({ "stop_reason": "tool_use", "stop_sequence": null }));
        let plain = checked(false, false);
        let (blocks, stop) = content(reply, ReplyFormat::Plain, &plain, FinishReason::Length, &report);
        assert_eq!(blocks, vec![json!({ "type": "text", "text": reply })]);
        assert_eq!(stop["stop_reason"], "max_tokens");
    }

    /// Claude Code sends `system` messages among the others: they join the system prompt, which
    /// templates take only first.
    #[test]
    fn system_messages_join_the_system_prompt() {
        let request = json!({ "model": "m", "max_tokens": 8, "system": "Be brief.", "messages": [
            { "role": "user", "content": "x" },
            { "role": "system", "content": [{ "type": "text", "text": "Today is Monday." }] },
            { "role": "user", "content": "y" },
        ] });
        let front = to_front(serde_json::from_value(request).unwrap()).unwrap().front;
        let PromptInput::Messages(messages) = front.prompt else { panic!("plain messages") };
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "user"]);
        assert_eq!(messages[0].content, "Be brief.\n\nToday is Monday.");
        let robot = json!({ "model": "m", "max_tokens": 8, "messages": [{ "role": "robot", "content": "x" }] });
        assert!(to_front(serde_json::from_value(robot).unwrap()).is_err());
    }

    fn checked(with_tools: bool, with_thinking: bool) -> Checked {
        let request = json!({ "model": "m", "max_tokens": 8, "messages": [{ "role": "user", "content": "x" }] });
        Checked { with_tools, with_thinking, ..to_front(serde_json::from_value(request).unwrap()).unwrap() }
    }

    const HARMONY_CALL: &str = "<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant<|channel|>commentary to=functions.w <|constrain|>json<|message|>{\"city\": \"Oslo\"}";

    #[test]
    fn thinking_comes_back_as_its_own_block_only_when_asked_for() {
        let report = GenerationReport::default();
        let (blocks, stop) =
            content(HARMONY_CALL, ReplyFormat::Harmony, &checked(true, true), FinishReason::Stop, &report);
        assert_eq!(blocks[0], json!({ "type": "thinking", "thinking": "Need the tool.", "signature": "" }));
        assert_eq!(blocks[1], json!({ "type": "text", "text": "" }));
        assert_eq!((&blocks[2]["name"], &blocks[2]["input"]), (&json!("w"), &json!({ "city": "Oslo" })));
        assert_eq!(stop["stop_reason"], "tool_use");
        let (blocks, _) =
            content(HARMONY_CALL, ReplyFormat::Harmony, &checked(true, false), FinishReason::Stop, &report);
        assert_eq!(blocks.iter().map(|b| b["type"].as_str().unwrap()).collect::<Vec<_>>(), ["text", "tool_use"]);
    }

    /// The events of a streamed reply, as (event name, block index, what the event carries).
    fn streamed(reply: &str, with_thinking: bool) -> Vec<String> {
        let mut blocks = BlockEvents { with_thinking, open: None, next: 0, text_started: false };
        let mut out = Vec::new();
        let opening = if with_thinking { thinking_block("") } else { json!({ "type": "text", "text": "" }) };
        blocks.start(opening, &mut out);
        let mut reader = ReplyStream::new(ReplyFormat::Harmony, true);
        for piece in reply.split_inclusive(['>', ' ']) {
            reader.push(piece).into_iter().for_each(|p| blocks.part(p, &mut out));
        }
        let (rest, calls) = reader.finish();
        rest.into_iter().for_each(|p| blocks.part(p, &mut out));
        blocks.finish(&calls, &mut out);
        let shown = out.iter().map(|(_, data)| {
            let what = data.pointer("/content_block/type").or(data.pointer("/delta/type")).cloned().unwrap_or_default();
            format!("{} {} {}", data["type"].as_str().unwrap(), data["index"], what.as_str().unwrap_or(""))
        });
        shown.collect()
    }

    #[test]
    fn a_streamed_reply_opens_thinking_text_and_call_blocks_in_order() {
        let events = streamed(HARMONY_CALL, true);
        let expected = [
            "content_block_start 0 thinking",
            "content_block_delta 0 thinking_delta",
            "content_block_delta 0 signature_delta",
            "content_block_stop 0 ",
            "content_block_start 1 text",
            "content_block_stop 1 ",
            "content_block_start 2 tool_use",
            "content_block_delta 2 input_json_delta",
            "content_block_stop 2 ",
        ];
        assert_eq!(
            events.iter().filter(|e| !e.ends_with("thinking_delta")).collect::<Vec<_>>(),
            expected.iter().filter(|e| !e.ends_with("thinking_delta")).collect::<Vec<_>>()
        );
        let answer = "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Hi there.";
        let events = streamed(answer, false);
        assert_eq!(events.first().map(String::as_str), Some("content_block_start 0 text"));
        assert!(events.iter().all(|e| !e.contains("thinking")), "{events:?}");
        assert_eq!(events.last().map(String::as_str), Some("content_block_stop 0 "));
    }
}
