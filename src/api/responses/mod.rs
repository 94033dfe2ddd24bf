//! OpenAI's Responses API, `POST /v1/responses` — what Codex speaks. A request's `input` (a string, or
//! items: messages, the function calls of an earlier reply and their outputs, earlier reasoning) and
//! `instructions` become a chat for the model's template ([`input`]); function `tools` and `tool_choice`
//! work as in chat completions (a required or named call constrained to parse); `text.format` asks for
//! structured output; `reasoning.effort` sets the template's reasoning effort. The answer is a response
//! object whose `output` holds the reply's reasoning, its message and its function calls, whole or
//! streamed as Responses events ([`stream`]). A response is remembered ([`log`]) unless `store` is false,
//! so the next request can send only what is new with `previous_response_id`, and a client can read it
//! back (`GET /v1/responses/{id}`, its `input_items`) or delete it.

mod input;
pub mod log;
mod stream;

use super::generation::{self, model_name, Finished, Sampling, Started};
use super::reply::{self, Reply};
use super::tools::{self, ToolCall, Turn};
use super::{openai, ApiError, ApiState};
use crate::engine::FinishReason;
use crate::model::ChatMessage;
use crate::worker::{FrontRequest, GenerationReport};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<Value>),
}

#[derive(Deserialize)]
struct ResponsesRequest {
    model: Option<String>,
    input: Option<Input>,
    instructions: Option<String>,
    #[serde(default)]
    tools: Vec<Value>,
    tool_choice: Option<Value>,
    max_output_tokens: Option<i64>,
    #[serde(flatten)]
    sampling: Sampling,
    #[serde(default)]
    stream: bool,
    previous_response_id: Option<String>,
    store: Option<bool>,
    text: Option<Value>,
    reasoning: Option<Value>,
    parallel_tool_calls: Option<bool>,
}

/// What a response object repeats of its request, and its id.
#[derive(Clone)]
struct Shape {
    id: String,
    created_at: u64,
    model: String,
    request: Value,
}

impl Shape {
    /// The response object with `status`, `output` and (once done) `usage`; `reason` says why it ended.
    fn response(&self, status: &str, output: Vec<Value>, usage: Option<Value>, reason: Option<FinishReason>) -> Value {
        let incomplete = (reason == Some(FinishReason::Length)).then(|| json!({ "reason": "max_output_tokens" }));
        let status = if incomplete.is_some() { "incomplete" } else { status };
        let mut body = json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.model, "output": output, "usage": usage, "incomplete_details": incomplete,
            "error": null, "metadata": {},
        });
        if let (Some(body), Some(request)) = (body.as_object_mut(), self.request.as_object()) {
            for (k, v) in request {
                body.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        body
    }
}

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<ApiState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request: ResponsesRequest = openai::parse(body)?;
    let model = model_name(request.model.as_deref())?;
    let mut items = match &request.previous_response_id {
        None => Vec::new(),
        Some(id) => {
            let (of, items) = state.responses.conversation(id).ok_or_else(|| {
                let why = format!("{}: send the whole conversation as input", not_remembered(id));
                ApiError::not_found(why, "previous_response_not_found")
            })?;
            if of != model {
                return Err(ApiError::bad_param(
                    "previous_response_id",
                    format!("that response was of {of}, not {model}"),
                ));
            }
            items
        }
    };
    match request.input {
        Some(Input::Text(text)) => items.push(json!({ "type": "message", "role": "user", "content": text })),
        Some(Input::Items(given)) => items.extend(given),
        None => return Err(ApiError::bad_param("input", "`input` is required")),
    }
    let mut turns = input::turns(&items)?;
    if let Some(instructions) = request.instructions.as_ref().filter(|i| !i.is_empty()) {
        turns.insert(0, Turn::plain(ChatMessage { role: "system".into(), content: instructions.clone() }));
    }
    if turns.is_empty() {
        return Err(ApiError::bad_param("input", "`input` holds no message"));
    }
    let choice = tools::Choice::from_openai(input::tool_choice(request.tool_choice.as_ref()).as_ref())?;
    let (offered, forced) = tools::offered(input::tools(&request.tools)?, choice)?;
    let with_tools = !offered.is_empty();
    // Codex asks for "minimal" effort too; templates know low, medium and high.
    let effort =
        request.reasoning.as_ref().and_then(|r| r["effort"].as_str()).map(|e| if e == "minimal" { "low" } else { e });
    let variables = generation::template_variables(None, effort, None)?;
    let max_tokens = match request.max_output_tokens {
        Some(n) if n < 0 => {
            return Err(ApiError::bad_param("max_output_tokens", "max_output_tokens must be 0 or more"))
        }
        Some(n) => n as usize,
        None => u32::MAX as usize,
    };
    let mut sampling = request.sampling.params(2.0)?;
    sampling.format = match input::response_format(request.text.as_ref()) {
        Some(format) => openai::response_format(&format).map_err(|_| {
            ApiError::bad_param("text", "`text.format.type` must be text, json_object or json_schema (with a schema)")
        })?,
        None => None,
    };
    tools::impose(&mut sampling.format, forced)?;
    if request.parallel_tool_calls == Some(false) {
        tools::one_call_only(&mut sampling.format);
    }
    let prompt = tools::prompt(turns, offered, variables);
    let front = FrontRequest { prompt, max_tokens, sampling, stop: vec![], ignore_eos: false };

    let shape = Shape {
        id: new_id("resp"),
        created_at: crate::util::now_ms() / 1000,
        model: model.clone(),
        request: json!({
            "instructions": request.instructions, "tools": request.tools,
            "tool_choice": request.tool_choice.unwrap_or(json!("auto")),
            "parallel_tool_calls": request.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": request.previous_response_id, "max_output_tokens": request.max_output_tokens,
            "temperature": request.sampling.temperature.unwrap_or(1.0), "top_p": request.sampling.top_p.unwrap_or(1.0),
            "store": request.store.unwrap_or(true), "text": request.text.unwrap_or(json!({ "format": { "type": "text" } })),
            "reasoning": request.reasoning.unwrap_or(json!({ "effort": null, "summary": null })),
        }),
    };
    let keep = request.store.unwrap_or(true).then_some(items);
    let Started { events, reply: format, .. } = generation::start(&state, &model, front).await?;
    if request.stream {
        return Ok(stream::respond(state, events, format, with_tools, shape, keep));
    }
    let Finished { text, reason, report } = generation::collect(&state, &model, events).await?;
    let output = output_items(&reply::split(format, with_tools, &text));
    let response = shape.response("completed", output, Some(usage(&report)), Some(reason));
    remember(&state, keep, &response);
    Ok(Json(response).into_response())
}

/// `GET /v1/responses/{id}`: a remembered response as it was answered.
pub async fn retrieve(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(remembered(&state, &headers, &id)?.response))
}

/// The page `GET /v1/responses/{id}/input_items` asks for: newest first unless `order` is `asc`, at most
/// `limit` (1 to 100, default 20), after the item whose id is `after`.
#[derive(Deserialize)]
pub struct Page {
    order: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
}

/// `GET /v1/responses/{id}/input_items`: what went into a remembered response, a page at a time.
pub async fn input_items(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(page): Query<Page>,
) -> Result<Json<Value>, ApiError> {
    let mut inputs = remembered(&state, &headers, &id)?.inputs;
    match page.order.as_deref() {
        None | Some("desc") => inputs.reverse(),
        Some("asc") => {}
        Some(_) => return Err(ApiError::bad_param("order", "`order` is asc or desc")),
    }
    let limit = page.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::bad_param("limit", "`limit` is 1 to 100"));
    }
    let id_of = |item: &Value| item["id"].as_str().map(str::to_string);
    if let Some(after) = &page.after {
        let at = inputs.iter().position(|i| id_of(i).as_deref() == Some(after.as_str()));
        let at = at.ok_or_else(|| ApiError::bad_param("after", format!("no input item {after:?} in this response")))?;
        inputs.drain(..=at);
    }
    let has_more = inputs.len() > limit;
    inputs.truncate(limit);
    let (first, last) = (inputs.first().and_then(id_of), inputs.last().and_then(id_of));
    Ok(Json(json!({ "object": "list", "data": inputs, "first_id": first, "last_id": last, "has_more": has_more })))
}

/// `DELETE /v1/responses/{id}`: forgets a remembered response.
pub async fn delete(State(state): State<ApiState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    if !state.responses.forget(&id) {
        return Err(ApiError::not_found(not_remembered(&id), "response_not_found"));
    }
    Ok(Json(json!({ "id": id, "object": "response.deleted", "deleted": true })))
}

/// Response `id`, for a reader allowed to see it: a conversation is no public read, so on a node with
/// a token (where other reads are open) the token is needed.
fn remembered(state: &ApiState, headers: &HeaderMap, id: &str) -> Result<log::Remembered, ApiError> {
    if state.token.is_some() && !state.carries_token(headers) {
        return Err(ApiError::unauthorized());
    }
    state.responses.get(id).ok_or_else(|| ApiError::not_found(not_remembered(id), "response_not_found"))
}

/// Why response `id` cannot be found, and for how long responses are kept.
fn not_remembered(id: &str) -> String {
    format!(
        "no response {id:?} is remembered here (the node keeps the last {} for {} hours, not across restarts, and \
         none sent with store: false)",
        log::KEPT,
        log::KEPT_FOR.as_secs() / 3600
    )
}

/// A whole reply's output items: its reasoning, its message (also when empty, unless it only calls),
/// and its calls.
fn output_items(reply: &Reply) -> Vec<Value> {
    let mut output = Vec::new();
    if !reply.reasoning.is_empty() {
        output.push(reasoning_item(&new_id("rs"), &reply.reasoning));
    }
    if !reply.content.is_empty() || reply.calls.is_empty() {
        output.push(message_item(&new_id("msg"), &reply.content, "completed"));
    }
    output.extend(reply.calls.iter().map(|c| call_item(&new_id("fc"), c, "completed")));
    output
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "completed" {
        json!([{ "type": "output_text", "text": text, "annotations": [], "logprobs": [] }])
    } else {
        json!([])
    };
    json!({ "type": "message", "id": id, "status": status, "role": "assistant", "content": content })
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({ "type": "reasoning", "id": id, "summary": [], "content": [{ "type": "reasoning_text", "text": text }] })
}

fn call_item(id: &str, call: &ToolCall, status: &str) -> Value {
    let arguments = if status == "completed" { call.arguments.to_string() } else { String::new() };
    json!({
        "type": "function_call", "id": id, "call_id": format!("call_{}", uuid::Uuid::new_v4().simple()),
        "name": call.name, "arguments": arguments, "status": status,
    })
}

/// Responses' usage: the input's tokens count those the prompt cache gave back, which it names apart.
fn usage(report: &GenerationReport) -> Value {
    json!({
        "input_tokens": report.prompt_tokens,
        "input_tokens_details": { "cached_tokens": report.cached_tokens },
        "output_tokens": report.generated_tokens,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": report.prompt_tokens + report.generated_tokens,
    })
}

/// Remembers `response` and its conversation (`items` sent, then its output), when it is kept.
fn remember(state: &ApiState, items: Option<Vec<Value>>, response: &Value) {
    if let Some(mut items) = items {
        // Listed later a page at a time, each item needs an id to page after.
        for item in items.iter_mut().filter_map(Value::as_object_mut) {
            item.entry("id").or_insert_with(|| json!(new_id("item")));
        }
        let output = response["output"].as_array().map_or(&[][..], Vec::as_slice);
        state.responses.keep(response.clone(), items, output);
    }
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}
