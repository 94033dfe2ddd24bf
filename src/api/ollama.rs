//! Ollama's API, so that clients configured for Ollama work unchanged: `POST /api/chat` and
//! `POST /api/generate` (streamed as NDJSON unless `"stream": false`), `GET /api/tags`, `POST /api/show`,
//! `GET /api/ps` and `GET /api/version`, at those paths and under `/ollama` (`/ollama/api/chat`, …, and
//! `/ollama/` answers "Ollama is running"), and with `--ollama-port` alone on a port of their own, whose
//! `/` answers that too. The models are the instances the cluster serves, by their
//! names (`NAME:latest` is `NAME`). Messages go to the model's own chat template as the OpenAI route's
//! do; `raw` prompts go as they are; `tools` and `tool_calls` as OpenAI's do, and calls in the reply come
//! back as `message.tool_calls`. Images, `format`, `suffix`, custom templates and `context` are refused
//! with a 400 that says so. Errors are Ollama's `{"error": "..."}`.

use super::generation::{self, Finished, Piece, Sampling, Started};
use super::reply::{self, Part, ReplyStream};
use super::tools::{self, ToolCall, Turn};
use super::{ApiError, ApiState, Dialect};
use crate::engine::{FinishReason, OutputFormat};
use crate::instances::InstanceInfo;
use crate::model::library::{self, LibraryModel, ModelSource};
use crate::model::ChatMessage;
use crate::worker::{FrontRequest, GenerationReport, PromptInput};
use axum::body::{Body, Bytes};
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Instant;

/// Ollama's routes (also served under `/ollama`).
pub const PATHS: [&str; 6] = ["/api/chat", "/api/generate", "/api/tags", "/api/show", "/api/ps", "/api/version"];

/// Ollama's routes at `/api/*` and under `/ollama`.
pub fn routes(router: Router<ApiState>) -> Router<ApiState> {
    let mut router = router.route("/ollama", get(running)).route("/ollama/", get(running));
    for prefix in ["", "/ollama"] {
        router = router
            .route(&format!("{prefix}/api/chat"), post(chat))
            .route(&format!("{prefix}/api/generate"), post(generate))
            .route(&format!("{prefix}/api/tags"), get(tags))
            .route(&format!("{prefix}/api/show"), post(show))
            .route(&format!("{prefix}/api/ps"), get(ps))
            .route(&format!("{prefix}/api/version"), get(version));
    }
    router
}

/// What Ollama answers at its root, which clients probe.
pub async fn running() -> &'static str {
    "Ollama is running"
}

async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}

/// Ollama's `options` that shoal uses (the others, such as `num_ctx`, are the instance's to decide).
#[derive(Deserialize, Default)]
struct Options {
    #[serde(flatten)]
    sampling: Sampling,
    num_predict: Option<i64>,
    #[serde(default)]
    stop: Vec<String>,
}

/// Fields both generation routes share.
#[derive(Deserialize)]
struct Common {
    model: Option<String>,
    stream: Option<bool>,
    #[serde(default)]
    options: Options,
    format: Option<Value>,
    #[serde(default)]
    images: Vec<Value>,
    /// Whether the model thinks before it answers (`true`/`false`), or how hard (`"low"`, `"medium"`,
    /// `"high"`: gpt-oss).
    think: Option<Value>,
}

#[derive(Deserialize)]
struct MessageIn {
    role: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    images: Vec<Value>,
    #[serde(default)]
    tool_calls: Vec<Value>,
    /// An earlier reply's thinking, as this API returns it.
    thinking: Option<String>,
}

type ChatRequest = generation::ChatRequest<Common, MessageIn>;

#[derive(Deserialize)]
struct GenerateRequest {
    #[serde(flatten)]
    common: Common,
    prompt: Option<String>,
    system: Option<String>,
    #[serde(default)]
    raw: bool,
    suffix: Option<String>,
    template: Option<String>,
    #[serde(default)]
    context: Vec<Value>,
}

fn refuse_unsupported(checks: &[(bool, &'static str, &str)]) -> Result<(), ApiError> {
    match checks.iter().find(|(present, _, _)| *present) {
        Some((_, field, what)) => Err(ApiError::bad_param(field, format!("{what} are not supported by this node"))),
        None => Ok(()),
    }
}

impl Common {
    /// The chat template's variables `think` sets.
    fn variables(&self) -> Result<serde_json::Map<String, Value>, ApiError> {
        match &self.think {
            None | Some(Value::Null) => generation::template_variables(None, None, None),
            Some(Value::Bool(on)) => generation::template_variables(None, None, Some(*on)),
            Some(Value::String(effort)) => generation::template_variables(None, Some(effort), None).map_err(|_| {
                ApiError::bad_param("think", "`think` must be true, false, \"low\", \"medium\" or \"high\"")
            }),
            Some(_) => {
                Err(ApiError::bad_param("think", "`think` must be true, false, \"low\", \"medium\" or \"high\""))
            }
        }
    }

    /// Whether the reply's thinking is returned (not when `think` is false).
    fn shows_thinking(&self) -> bool {
        self.think != Some(Value::Bool(false))
    }

    /// The model as named (`resolve` finds the instance it means) and the request for the instance.
    fn to_front(&self, prompt: PromptInput) -> Result<(String, FrontRequest), ApiError> {
        refuse_unsupported(&[(!self.images.is_empty(), "images", "images")])?;
        let max_tokens = match self.options.num_predict {
            None | Some(-1) | Some(-2) => u32::MAX as usize,
            Some(n) if n < 0 => {
                return Err(ApiError::bad_param("num_predict", format!("num_predict must be -2, -1 or more, not {n}")))
            }
            Some(n) => n as usize,
        };
        let mut sampling = self.options.sampling.params(f32::MAX)?;
        sampling.format = self.format.as_ref().map(output_format).transpose()?.flatten();
        let front = FrontRequest { prompt, max_tokens, sampling, stop: self.options.stop.clone(), ignore_eos: false };
        Ok((generation::model_name(self.model.as_deref())?, front))
    }
}

/// `format`: `"json"` (any JSON object) or a JSON schema; empty or null for free text.
fn output_format(value: &Value) -> Result<Option<OutputFormat>, ApiError> {
    let format = match value {
        Value::Null => return Ok(None),
        Value::String(s) if s.is_empty() => return Ok(None),
        Value::String(s) if s == "json" => OutputFormat::JsonObject,
        Value::Object(_) => OutputFormat::JsonSchema { schema: value.clone() },
        _ => return Err(ApiError::bad_param("format", "`format` must be \"json\" or a JSON schema object")),
    };
    format.check().map_err(|e| ApiError::bad_param("format", e))?;
    Ok(Some(format))
}

/// The instance a client means: the name as given, or without Ollama's default tag `:latest`.
fn resolve(state: &ApiState, name: String) -> String {
    let known = |n: &str| state.instances.registry().instances.values().any(|i| i.model == n || i.id == n);
    match name.strip_suffix(":latest") {
        Some(bare) if !known(&name) && known(bare) => bare.to_string(),
        _ => name,
    }
}

async fn chat(State(state): State<ApiState>, body: Result<Json<Value>, JsonRejection>) -> Response {
    let started = Instant::now();
    let result = async {
        let (model, front, stream, route) = check_chat(body)?;
        respond(state.clone(), resolve(&state, model), front, stream, started, route).await
    };
    result.await.unwrap_or_else(|e| e.into_response_as(Dialect::Ollama))
}

/// A chat body as `chat` checks it: the model as named, the request, whether to stream, and the route.
pub(super) fn check_chat(
    body: Result<Json<Value>, JsonRejection>,
) -> Result<(String, FrontRequest, bool, Route), ApiError> {
    let request: ChatRequest = super::openai::parse(body)?;
    let (tools, calls) = tools::offered(request.tools, tools::Choice::Auto)?;
    let messages = request
        .messages
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::bad_param("messages", "`messages` must be a non-empty list"))?;
    let mut chat = Vec::with_capacity(messages.len());
    for m in messages {
        if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool") {
            return Err(ApiError::bad_param("messages", format!("unknown role {:?}", m.role)));
        }
        refuse_unsupported(&[(!m.images.is_empty(), "images", "images")])?;
        chat.push(Turn {
            message: ChatMessage { role: m.role, content: m.content },
            calls: m.tool_calls,
            answers: None,
            reasoning: m.thinking,
        });
    }
    let route = Route::Chat { tools: !tools.is_empty(), thinking: request.common.shows_thinking() };
    let variables = request.common.variables()?;
    let (model, mut front) = request.common.to_front(tools::prompt(chat, tools, variables))?;
    tools::impose(&mut front.sampling.format, calls)?;
    Ok((model, front, request.common.stream.unwrap_or(true), route))
}

async fn generate(State(state): State<ApiState>, body: Result<Json<Value>, JsonRejection>) -> Response {
    let started = Instant::now();
    let result = async {
        let (model, front, stream) = check_generate(body)?;
        let model = resolve(&state, model);
        let Some((front, route)) = front else {
            // Ollama loads the model and answers at once; here it is loaded when it runs at all.
            ready_instance(&state, &model)?;
            let body =
                json!({ "model": model, "created_at": now(), "response": "", "done": true, "done_reason": "load" });
            return Ok(Json(body).into_response());
        };
        respond(state, model, front, stream, started, route).await
    };
    result.await.unwrap_or_else(|e| e.into_response_as(Dialect::Ollama))
}

/// A generate body as `generate` checks it: the model as named, the request and its route (none for an
/// empty prompt, which only loads the model), and whether to stream.
type CheckedGenerate = (String, Option<(FrontRequest, Route)>, bool);

/// Checks a generate body (see [`CheckedGenerate`]).
pub(super) fn check_generate(body: Result<Json<Value>, JsonRejection>) -> Result<CheckedGenerate, ApiError> {
    let request: GenerateRequest = super::openai::parse(body)?;
    refuse_unsupported(&[
        (request.suffix.as_ref().is_some_and(|s| !s.is_empty()), "suffix", "suffixes (fill in the middle)"),
        (request.template.as_ref().is_some_and(|t| !t.is_empty()), "template", "custom templates"),
        (!request.context.is_empty(), "context", "`context` token lists"),
    ])?;
    let prompt = request.prompt.unwrap_or_default();
    let stream = request.common.stream.unwrap_or(true);
    if prompt.is_empty() {
        return Ok((generation::model_name(request.common.model.as_deref())?, None, stream));
    }
    let input = if request.raw {
        PromptInput::Text(prompt)
    } else {
        let mut turns: Vec<Turn> = request.system.iter().map(|s| Turn::plain(ChatMessage::new("system", s))).collect();
        turns.push(Turn::plain(ChatMessage::new("user", &prompt)));
        tools::prompt(turns, vec![], request.common.variables()?)
    };
    let route = Route::Generate { thinking: request.common.shows_thinking() };
    let (model, front) = request.common.to_front(input)?;
    Ok((model, Some((front, route)), stream))
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Route {
    /// A chat; `tools` when its reply may call the tools the request offers; `thinking` when the reply's
    /// thinking is returned.
    Chat {
        tools: bool,
        thinking: bool,
    },
    Generate {
        thinking: bool,
    },
}

impl Route {
    fn tools(self) -> bool {
        matches!(self, Route::Chat { tools: true, .. })
    }

    fn shows_thinking(self) -> bool {
        matches!(self, Route::Chat { thinking: true, .. } | Route::Generate { thinking: true })
    }
}

/// An answer object carrying the calls the model made (Ollama's `message.tool_calls`).
fn with_calls(mut body: Value, calls: &[ToolCall]) -> Value {
    if !calls.is_empty() {
        let calls: Vec<Value> =
            calls.iter().map(|c| json!({ "function": { "name": c.name, "arguments": c.arguments } })).collect();
        body["message"]["tool_calls"] = json!(calls);
    }
    body
}

fn now() -> String {
    crate::util::rfc3339(crate::util::now_ms())
}

/// One answer object: `text` and `thinking` as the route carries them, with the final counts when done.
fn answer(
    model: &str,
    route: Route,
    text: &str,
    thinking: &str,
    done: Option<(FinishReason, &GenerationReport, Instant)>,
) -> Value {
    let mut body = json!({ "model": model, "created_at": now() });
    match route {
        Route::Chat { .. } => body["message"] = json!({ "role": "assistant", "content": text }),
        Route::Generate { .. } => body["response"] = json!(text),
    }
    if !thinking.is_empty() && route.shows_thinking() {
        match route {
            Route::Chat { .. } => body["message"]["thinking"] = json!(thinking),
            Route::Generate { .. } => body["thinking"] = json!(thinking),
        }
    }
    body["done"] = json!(done.is_some());
    if let Some((reason, report, started)) = done {
        let total = started.elapsed().as_nanos() as u64;
        let prompt_eval = ((report.time_to_first_token_ms * 1e6) as u64).min(total);
        let stats = json!({
            "done_reason": if reason == FinishReason::Length { "length" } else { "stop" },
            "total_duration": total,
            "load_duration": 0,
            // The tokens evaluated: not those the prompt cache gave back.
            "prompt_eval_count": report.prompt_tokens - report.cached_tokens,
            "prompt_eval_duration": prompt_eval,
            "eval_count": report.generated_tokens,
            "eval_duration": total - prompt_eval,
        });
        merge(&mut body, stats);
    }
    body
}

async fn respond(
    state: ApiState,
    model: String,
    front: FrontRequest,
    stream: bool,
    started: Instant,
    route: Route,
) -> Result<Response, ApiError> {
    let Started { events, reply: format, .. } = generation::start(&state, &model, front).await?;
    if !stream {
        let Finished { text, reason, report } = generation::collect(&state, &model, events).await?;
        let reply = reply::split(format, route.tools(), &text);
        let body = answer(&model, route, &reply.content, &reply.reasoning, Some((reason, &report, started)));
        return Ok(Json(with_calls(body, &reply.calls)).into_response());
    }
    let name = model.clone();
    let line = |value: Value| Bytes::from(format!("{value}\n"));
    // Each piece of the reply an object of its own, its thinking or its answer.
    let piece = move |part: Part| match part {
        Part::Content(text) => Some(line(answer(&name, route, &text, "", None))),
        Part::Reasoning(text) if route.shows_thinking() => Some(line(answer(&name, route, "", &text, None))),
        Part::Reasoning(_) => None,
    };
    let mut reader = ReplyStream::new(format, route.tools());
    let name = model.clone();
    let lines = generation::relay(state, model, events, vec![], move |item| match item {
        Piece::Text(text) => reader.push(&text).into_iter().filter_map(&piece).collect(),
        Piece::Done(reason, report) => {
            // The held text and the calls come before the last object.
            let (rest, calls) = reader.finish();
            let mut out: Vec<Bytes> = rest.into_iter().filter_map(&piece).collect();
            if !calls.is_empty() {
                out.push(line(with_calls(answer(&name, route, "", "", None), &calls)));
            }
            out.push(line(answer(&name, route, "", "", Some((reason, &report, started)))));
            out
        }
        Piece::Failed(message) => vec![line(json!({ "error": message }))],
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines)).into_response())
}

/// The ready instance a client names (by model name or id), or Ollama's 404.
fn ready_instance(state: &ApiState, name: &str) -> Result<InstanceInfo, ApiError> {
    generation::ready_instances(state)
        .into_iter()
        .find(|i| i.model == name || i.id == name)
        .ok_or_else(|| ApiError::not_found(format!("model '{name}' is not running on this cluster"), "model_not_found"))
}

/// What the node's library says about an instance's model file, when this node has it.
async fn describe(instance: &InstanceInfo) -> Option<LibraryModel> {
    let path = instance.model_path.clone();
    let model = tokio::task::spawn_blocking(move || library::describe(vec![path], ModelSource::Added)).await.ok()?;
    model.architecture.is_some().then_some(model)
}

fn details(model: Option<&LibraryModel>) -> Value {
    let family = model.and_then(|m| m.architecture.clone()).unwrap_or_default();
    let parameter_size = match model.and_then(|m| m.parameters) {
        Some(n) if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        Some(n) => format!("{:.0}M", n as f64 / 1e6),
        None => String::new(),
    };
    json!({
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family],
        "parameter_size": parameter_size,
        "quantization_level": model.and_then(|m| m.quantization.clone()).unwrap_or_default(),
    })
}

/// What the model at `path` can do, from its chat template (`completion` alone when this node lacks
/// the file).
async fn capabilities(path: std::path::PathBuf) -> Vec<&'static str> {
    let read = move || {
        let model = crate::model::Model::open(&path).ok()?;
        crate::model::ChatTemplate::new(model.chat_template_source(), String::new(), String::new()).ok()
    };
    let template = tokio::task::spawn_blocking(read).await.ok().flatten();
    template.map_or_else(|| vec!["completion"], |t| t.capabilities())
}

/// The running models, each with what the library says of its file and the fields `extra` adds:
/// `/api/tags` and `/api/ps` list them.
async fn listed(state: &ApiState, extra: impl Fn(&InstanceInfo) -> Value) -> Json<Value> {
    let mut models = Vec::new();
    for instance in generation::ready_instances(state) {
        let model = describe(&instance).await;
        let mut entry = json!({
            "name": instance.model, "model": instance.model,
            "size": model.as_ref().map_or(0, |m| m.size_bytes), "details": details(model.as_ref()),
        });
        merge(&mut entry, extra(&instance));
        models.push(entry);
    }
    Json(json!({ "models": models }))
}

fn merge(into: &mut Value, more: Value) {
    if let (Some(into), Value::Object(more)) = (into.as_object_mut(), more) {
        into.extend(more);
    }
}

async fn tags(State(state): State<ApiState>) -> Json<Value> {
    listed(&state, |i| json!({ "modified_at": crate::util::rfc3339(i.created_at_ms) })).await
}

async fn ps(State(state): State<ApiState>) -> Json<Value> {
    listed(&state, |i| json!({ "size_vram": 0, "context_length": i.context })).await
}

#[derive(Deserialize)]
struct ShowRequest {
    model: Option<String>,
    /// Older clients send `name`.
    name: Option<String>,
}

/// A show body as `show` checks it: the model as named.
pub(super) fn check_show(body: Result<Json<Value>, JsonRejection>) -> Result<String, ApiError> {
    let request: ShowRequest = super::openai::parse(body)?;
    generation::model_name(request.model.or(request.name).as_deref())
}

async fn show(State(state): State<ApiState>, body: Result<Json<Value>, JsonRejection>) -> Response {
    let result = async {
        let name = resolve(&state, check_show(body)?);
        let instance = ready_instance(&state, &name)?;
        let model = describe(&instance).await;
        let capabilities = capabilities(instance.model_path.clone()).await;
        let arch = model.as_ref().and_then(|m| m.architecture.clone()).unwrap_or_default();
        let mut info = json!({ "general.architecture": arch, "general.basename": instance.model });
        if let Some(n) = model.as_ref().and_then(|m| m.parameters) {
            info["general.parameter_count"] = json!(n);
        }
        if let Some(n) = model.as_ref().and_then(|m| m.context_length) {
            info[format!("{arch}.context_length")] = json!(n);
        }
        Ok::<_, ApiError>(
            Json(json!({
                "modelfile": "",
                "parameters": "",
                "template": "",
                "details": details(model.as_ref()),
                "model_info": info,
                "capabilities": capabilities,
                "modified_at": crate::util::rfc3339(instance.created_at_ms),
            }))
            .into_response(),
        )
    };
    result.await.unwrap_or_else(|e| e.into_response_as(Dialect::Ollama))
}
