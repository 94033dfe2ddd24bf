//! Tool calls for `/v1/chat/completions`: the `tools` a request offers and the messages that carry calls
//! and results, as the model's chat template takes them; and the calls in the model's output: Qwen's and
//! Hermes' `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks, Qwen3-Coder's and Qwen3.5's
//! `<tool_call><function=…><parameter=…>…</tool_call>` blocks, GLM-4.5's and GLM-5's
//! `<tool_call>NAME<arg_key>…</arg_key><arg_value>…</arg_value></tool_call>` blocks, MiniMax M2's and
//! `<minimax:tool_call><invoke name=…><parameter name=…>…</parameter></invoke></minimax:tool_call>`
//! blocks and MiniMax M3's `<tool_call><invoke name=…><KEY>…</KEY></invoke></tool_call>` (several
//! calls in one; M3's namespace marker dropped), DeepSeek V3.1's
//! `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>…` and V3.2's DSML
//! `<｜DSML｜function_calls><｜DSML｜invoke name=…><｜DSML｜parameter name=… string=…>`, and Llama 3's reply that is one JSON object
//! `{"name": …, "parameters": {…}}`. [`ToolStream`] holds back the text that may be a call while
//! streaming, so that clients get content as it comes and each call whole.

use super::ApiError;
use crate::engine::tool_calls::{call_schema, CLOSE, OPEN};
use crate::engine::{CallStyle, CallableTool, OutputFormat};
use crate::model::ChatMessage;
use crate::worker::PromptInput;
use serde_json::{json, Value};

/// Which calls a request's `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// The model decides (`auto`, or no `tool_choice`).
    Auto,
    /// No tools are offered.
    None,
    /// The reply is a call of one of the tools (OpenAI's `required`, Anthropic's `any`).
    Required,
    /// The reply is a call of this tool.
    Named(String),
}

impl Choice {
    /// OpenAI's `tool_choice`: `auto`, `none`, `required` or `{"type": "function", "function": {"name": …}}`.
    pub fn from_openai(choice: Option<&Value>) -> Result<Choice, ApiError> {
        match choice {
            None => Ok(Choice::Auto),
            Some(Value::String(s)) if s == "auto" => Ok(Choice::Auto),
            Some(Value::String(s)) if s == "none" => Ok(Choice::None),
            Some(Value::String(s)) if s == "required" => Ok(Choice::Required),
            Some(named) if named["type"] == "function" && named["function"]["name"].is_string() => {
                Ok(Choice::Named(named["function"]["name"].as_str().unwrap_or_default().to_string()))
            }
            Some(other) => Err(ApiError::bad_param(
                "tool_choice",
                format!("tool_choice must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}, not {other}"),
            )),
        }
    }
}

/// The tools a request offers the model under `choice`, and the format its calls are held to. When
/// the choice requires a call, the reply is one: a JSON object `{"name": …, "arguments": {…}}` naming
/// an offered tool (or the named one) with arguments valid for its parameters, which the reply's
/// parsing takes as the call (see [`split`]), in any model's template. When the model decides
/// (`auto`), each `<tool_call>` block it opens holds a call of an offered tool, in the style stage 0
/// picks from the model's template (a model that calls otherwise is not held to anything).
pub fn offered(tools: Vec<Value>, choice: Choice) -> Result<(Vec<Value>, Option<OutputFormat>), ApiError> {
    if choice == Choice::None {
        return Ok((vec![], None));
    }
    if let Some(bad) = tools.iter().find(|t| t["type"] != "function" || !t["function"]["name"].is_string()) {
        let message = format!("each tool must be {{\"type\": \"function\", \"function\": {{\"name\": …}}}}, not {bad}");
        return Err(ApiError::bad_param("tools", message));
    }
    let callable: Vec<&Value> = match &choice {
        Choice::None => return Ok((tools, None)),
        Choice::Auto if tools.is_empty() => return Ok((tools, None)),
        Choice::Auto | Choice::Required => tools.iter().collect(),
        Choice::Named(name) => tools.iter().filter(|t| t["function"]["name"] == name.as_str()).collect(),
    };
    if callable.is_empty() {
        let why = match &choice {
            Choice::Named(name) => format!("tool_choice names {name:?}, which is not among the tools offered"),
            _ => "tool_choice requires a call, but no tools are offered".to_string(),
        };
        return Err(ApiError::bad_param("tool_choice", why));
    }
    let callable: Vec<CallableTool> = callable
        .iter()
        .map(|t| CallableTool {
            name: t["function"]["name"].as_str().unwrap_or_default().to_string(),
            parameters: t["function"]
                .get("parameters")
                .filter(|p| p.is_object())
                .cloned()
                .unwrap_or(json!({ "type": "object" })),
        })
        .collect();
    // The model's template decides the style (stage 0 sets it); JSON until then.
    let format = match choice {
        Choice::Auto => OutputFormat::ToolCalls { tools: callable, style: CallStyle::Json, single: false },
        _ => OutputFormat::JsonSchema { schema: call_schema(&callable) },
    };
    format.check().map_err(|e| ApiError::bad_param("tools", format!("a tool's parameters: {e}")))?;
    Ok((tools, Some(format)))
}

/// Sets the format the tools impose (`forced`) on a request's `format`; refuses a request that
/// requires a call and also asks for another shape of reply. A reply that asks for a shape keeps it
/// when the model may call or not (its calls are then not held to the tools' parameters).
pub fn impose(format: &mut Option<OutputFormat>, forced: Option<OutputFormat>) -> Result<(), ApiError> {
    match (format.is_some(), forced) {
        (_, None) | (true, Some(OutputFormat::ToolCalls { .. })) => Ok(()),
        (true, Some(_)) => Err(ApiError::bad_param(
            "tool_choice",
            "a required tool call and a response format cannot be asked for together: the call is the reply",
        )),
        (false, forced) => {
            *format = forced;
            Ok(())
        }
    }
}

/// Lets a reply make one tool call at most (OpenAI's `parallel_tool_calls: false`, Anthropic's
/// `disable_parallel_tool_use`): it ends after its first. A required call is one call already.
pub fn one_call_only(format: &mut Option<OutputFormat>) {
    if let Some(OutputFormat::ToolCalls { single, .. }) = format {
        *single = true;
    }
}

/// A message with the tool calls it makes, the id of the call it answers, and an assistant's reasoning.
pub struct Turn {
    pub message: ChatMessage,
    pub calls: Vec<Value>,
    pub answers: Option<String>,
    pub reasoning: Option<String>,
}

impl Turn {
    pub fn plain(message: ChatMessage) -> Turn {
        Turn { message, calls: vec![], answers: None, reasoning: None }
    }
}

/// The prompt for `turns` with the tools offered and the template's variables: plain messages when
/// nothing else is there (as prompts always went), else the messages as JSON with the rest, for the
/// template.
pub fn prompt(turns: Vec<Turn>, tools: Vec<Value>, variables: serde_json::Map<String, Value>) -> PromptInput {
    let plain = |t: &Turn| t.calls.is_empty() && t.answers.is_none() && t.reasoning.is_none();
    if tools.is_empty() && variables.is_empty() && turns.iter().all(plain) {
        return PromptInput::Messages(turns.into_iter().map(|t| t.message).collect());
    }
    PromptInput::Conversation { messages: turns.into_iter().map(message_json).collect(), tools, variables }
}

/// A message as chat templates take it: an assistant's `tool_calls` with their `arguments` as objects
/// (OpenAI sends them as JSON strings), a tool result with the `tool_call_id` it answers, an assistant's
/// reasoning as both `reasoning_content` (Qwen3's and DeepSeek's templates) and `thinking` (gpt-oss's).
fn message_json(turn: Turn) -> Value {
    let Turn { message, mut calls, answers, reasoning } = turn;
    for call in &mut calls {
        if let Some(arguments) = call["function"]["arguments"].as_str() {
            if let Ok(parsed) = serde_json::from_str::<Value>(arguments) {
                call["function"]["arguments"] = parsed;
            }
        }
    }
    let mut value = json!({ "role": message.role, "content": message.content });
    if !calls.is_empty() {
        value["tool_calls"] = Value::Array(calls);
    }
    if let Some(id) = answers {
        value["tool_call_id"] = json!(id);
    }
    if let Some(reasoning) = reasoning.filter(|r| !r.is_empty()) {
        value["reasoning_content"] = json!(reasoning);
        value["thinking"] = json!(reasoning);
    }
    value
}

/// One call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Value,
}

impl ToolCall {
    /// The call as OpenAI's `tool_calls` entries spell it (`arguments` as a JSON string).
    pub fn to_openai(&self, index: usize) -> Value {
        json!({
            "index": index,
            "id": format!("call_{}", uuid::Uuid::new_v4().simple()),
            "type": "function",
            "function": { "name": self.name, "arguments": self.arguments.to_string() },
        })
    }

    /// The call as an Anthropic `tool_use` content block.
    pub fn to_anthropic(&self) -> Value {
        let id = format!("toolu_{}", uuid::Uuid::new_v4().simple());
        json!({ "type": "tool_use", "id": id, "name": self.name, "input": self.arguments })
    }

    /// A call from a JSON object with `name` and `arguments` (or Llama's `parameters`).
    fn from_json(text: &str) -> Option<ToolCall> {
        let value: Value = serde_json::from_str(text.trim()).ok()?;
        let name = value.get("name")?.as_str()?.to_string();
        let arguments = value.get("arguments").or_else(|| value.get("parameters")).cloned().unwrap_or(json!({}));
        // Some models write the arguments as a JSON string.
        let arguments = match arguments {
            Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
            other => other,
        };
        Some(ToolCall { name, arguments })
    }

    /// A call written as Qwen3-Coder's and Qwen3.5's templates show them: `<function=NAME>`, then per
    /// argument `<parameter=KEY>` on a line, its value on the lines after, `</parameter>`, then
    /// `</function>`. A value that reads as JSON (a number, `true`, an object…) is taken as that JSON, any
    /// other as a string: the template writes objects and lists as JSON and the rest as they are.
    fn from_functions(text: &str) -> Option<ToolCall> {
        let rest = text.trim().strip_prefix("<function=")?;
        let (name, mut rest) = rest.split_once('>')?;
        let mut arguments = serde_json::Map::new();
        loop {
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix("</function>") {
                return after
                    .trim()
                    .is_empty()
                    .then(|| ToolCall { name: name.trim().to_string(), arguments: arguments.into() });
            }
            let (key, after) = rest.strip_prefix("<parameter=")?.split_once('>')?;
            let (value, after) = after.split_once("</parameter>")?;
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            arguments.insert(key.trim().to_string(), template_value(value));
            rest = after;
        }
    }

    /// A call written as GLM-4.5's and GLM-5's templates show them: the name, then per argument
    /// `<arg_key>KEY</arg_key>` and `<arg_value>VALUE</arg_value>` (a value that reads as JSON taken as
    /// that JSON, as the template writes it).
    fn from_arg_pairs(text: &str) -> Option<ToolCall> {
        let text = text.trim();
        let (name, mut rest) = match text.find("<arg_key>") {
            Some(at) => (&text[..at], &text[at..]),
            None => (text, ""),
        };
        let name = name.trim();
        if name.is_empty() || name.contains(char::is_whitespace) || name.contains(['<', '>', '{', '"']) {
            return None;
        }
        let mut arguments = serde_json::Map::new();
        loop {
            rest = rest.trim_start();
            if rest.is_empty() {
                return Some(ToolCall { name: name.to_string(), arguments: arguments.into() });
            }
            let (key, after) = rest.strip_prefix("<arg_key>")?.split_once("</arg_key>")?;
            let (value, after) = after.trim_start().strip_prefix("<arg_value>")?.split_once("</arg_value>")?;
            arguments.insert(key.trim().to_string(), template_value(value));
            rest = after;
        }
    }

    /// The calls of a MiniMax block: one `<invoke name="NAME">` per call, each with its arguments as
    /// M2 writes them (`<parameter name="KEY">VALUE</parameter>`) or as M3 does (`<KEY>VALUE</KEY>`, an
    /// object's or a list's as elements inside). None unless every invoke parses.
    fn from_invokes(text: &str) -> Option<Vec<ToolCall>> {
        let mut calls = Vec::new();
        let mut rest = text.trim();
        while !rest.is_empty() {
            let (name, after) = rest.strip_prefix("<invoke name=\"")?.split_once("\">")?;
            let (body, after) = after.split_once("</invoke>")?;
            let body = body.trim();
            let arguments: serde_json::Map<String, Value> = if body.starts_with("<parameter name=\"") {
                let mut arguments = serde_json::Map::new();
                let mut params = body;
                while !params.is_empty() {
                    let (key, after) = params.strip_prefix("<parameter name=\"")?.split_once("\">")?;
                    let (value, after) = after.split_once("</parameter>")?;
                    arguments.insert(key.to_string(), template_value(value));
                    params = after.trim();
                }
                arguments
            } else {
                xml_elements(body)?.into_iter().collect()
            };
            calls.push(ToolCall { name: name.trim().to_string(), arguments: arguments.into() });
            rest = after.trim();
        }
        (!calls.is_empty()).then_some(calls)
    }
}

/// DeepSeek V3.1's calls: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜>` each, the
/// arguments JSON. None unless every call parses.
fn deepseek_calls(text: &str) -> Option<Vec<ToolCall>> {
    const BEGIN: &str = "<｜tool▁call▁begin｜>";
    const SEP: &str = "<｜tool▁sep｜>";
    const END: &str = "<｜tool▁call▁end｜>";
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (name, after) = rest.strip_prefix(BEGIN)?.split_once(SEP)?;
        let (arguments, after) = after.split_once(END)?;
        let arguments: Value = serde_json::from_str(arguments.trim()).ok()?;
        calls.push(ToolCall { name: name.trim().to_string(), arguments });
        rest = after.trim();
    }
    (!calls.is_empty()).then_some(calls)
}

/// DeepSeek V3.2's DSML calls: `<｜DSML｜invoke name="NAME">` each, with its
/// `<｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>` lines (a string as it
/// is, any other value JSON). None unless every call parses.
fn dsml_calls(text: &str) -> Option<Vec<ToolCall>> {
    const INVOKE: &str = "<｜DSML｜invoke name=\"";
    const PARAMETER: &str = "<｜DSML｜parameter name=\"";
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (name, after) = rest.strip_prefix(INVOKE)?.split_once("\">")?;
        let (mut body, after) = after.split_once("</｜DSML｜invoke>")?;
        let mut arguments = serde_json::Map::new();
        body = body.trim();
        while !body.is_empty() {
            let (key, after) = body.strip_prefix(PARAMETER)?.split_once('"')?;
            let (string, after) = after.trim_start().strip_prefix("string=\"")?.split_once("\">")?;
            let (value, after) = after.split_once("</｜DSML｜parameter>")?;
            let value = match string {
                "true" => Value::String(value.to_string()),
                _ => serde_json::from_str(value.trim()).ok()?,
            };
            arguments.insert(key.to_string(), value);
            body = after.trim();
        }
        calls.push(ToolCall { name: name.trim().to_string(), arguments: arguments.into() });
        rest = after.trim();
    }
    (!calls.is_empty()).then_some(calls)
}

/// MiniMax M3's marker before each of its tags (a token of its vocabulary), dropped before parsing.
const MINIMAX_NAMESPACE: &str = "]<]minimax[>[";

/// `<KEY>VALUE</KEY>` elements one after another (MiniMax M3's arguments): a value made of elements
/// is an object, or a list when they are all `<item>`; any other value is read as
/// [`template_value`]. None unless all of `text` is elements.
fn xml_elements(text: &str) -> Option<Vec<(String, Value)>> {
    let mut elements = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (key, after) = rest.strip_prefix('<')?.split_once('>')?;
        if key.is_empty() || key.starts_with('/') || key.contains(char::is_whitespace) {
            return None;
        }
        let (open, close) = (format!("<{key}>"), format!("</{key}>"));
        // The matching close: nested elements of the same name open and close inside.
        let (mut depth, mut at) = (1usize, 0);
        let end = loop {
            let next_close = after[at..].find(&close)? + at;
            match after[at..].find(&open).map(|o| o + at).filter(|&o| o < next_close) {
                Some(nested) => (depth, at) = (depth + 1, nested + open.len()),
                None if depth == 1 => break next_close,
                None => (depth, at) = (depth - 1, next_close + close.len()),
            }
        };
        let body = &after[..end];
        let value = match xml_elements(body).filter(|e| !e.is_empty() && body.trim_start().starts_with('<')) {
            Some(inner) if inner.iter().all(|(k, _)| k == "item") => {
                Value::Array(inner.into_iter().map(|(_, v)| v).collect())
            }
            Some(inner) => Value::Object(inner.into_iter().collect()),
            None => template_value(body),
        };
        elements.push((key.to_string(), value));
        rest = after[end + close.len()..].trim();
    }
    Some(elements)
}

/// An argument's value as a template writes it: one that reads as JSON (a number, `true`, an object…)
/// is that JSON, any other a string (its surrounding newlines dropped).
fn template_value(value: &str) -> Value {
    let value = value.strip_prefix('\n').unwrap_or(value);
    let value = value.strip_suffix('\n').unwrap_or(value);
    let parsed = serde_json::from_str::<Value>(value).ok().filter(|v| !v.is_string());
    parsed.unwrap_or_else(|| Value::String(value.to_string()))
}

/// The blocks calls are written in: Hermes' and Qwen's, GLM's and MiniMax M3's (inside the same tags),
/// MiniMax M2's, DeepSeek V3.1's and V3.2's.
const BLOCKS: [(&str, &str); 4] = [
    (OPEN, CLOSE),
    ("<minimax:tool_call>", "</minimax:tool_call>"),
    (DEEPSEEK_OPEN, "<｜tool▁calls▁end｜>"),
    (DSML_OPEN, "</｜DSML｜function_calls>"),
];
const DEEPSEEK_OPEN: &str = "<｜tool▁calls▁begin｜>";
const DSML_OPEN: &str = "<｜DSML｜function_calls>";

/// The calls one block holds, by its opening tag.
fn block_calls(open: &str, inside: &str) -> Option<Vec<ToolCall>> {
    match open {
        OPEN => {
            let one = ToolCall::from_json(inside)
                .or_else(|| ToolCall::from_functions(inside))
                .or_else(|| ToolCall::from_arg_pairs(inside));
            one.map(|call| vec![call]).or_else(|| ToolCall::from_invokes(inside))
        }
        DEEPSEEK_OPEN => deepseek_calls(inside),
        DSML_OPEN => dsml_calls(inside),
        _ => ToolCall::from_invokes(inside),
    }
}

/// Splits a whole reply into its text and its calls. Blocks that do not parse stay in the text.
pub fn split(text: &str) -> (String, Vec<ToolCall>) {
    let unmarked = text.contains(MINIMAX_NAMESPACE).then(|| text.replace(MINIMAX_NAMESPACE, ""));
    let text = unmarked.as_deref().unwrap_or(text);
    if let Some(call) = text.trim_start().starts_with('{').then(|| ToolCall::from_json(text)).flatten() {
        return (String::new(), vec![call]);
    }
    let (mut content, mut calls, mut rest) = (String::new(), Vec::new(), text);
    // The earliest block of any kind, then on after it.
    while let Some((start, open, close)) =
        BLOCKS.iter().filter_map(|&(open, close)| Some((rest.find(open)?, open, close))).min_by_key(|b| b.0)
    {
        let after = &rest[start + open.len()..];
        let (inside, next) = match after.find(close) {
            Some(end) => (&after[..end], &after[end + close.len()..]),
            None => (after, ""),
        };
        match block_calls(open, inside) {
            Some(found) => {
                content.push_str(&rest[..start]);
                calls.extend(found);
            }
            None => content.push_str(&rest[..rest.len() - next.len()]),
        }
        rest = next;
    }
    content.push_str(rest);
    let content = if calls.is_empty() { content } else { content.trim().to_string() };
    (content, calls)
}

/// Streamed text of a reply that may call tools: text is passed on until a call may begin (`<tool_call>`,
/// `<minimax:tool_call>`, or a reply that opens with `{`); from there on it is held until the end.
#[derive(Default)]
pub struct ToolStream {
    held: String,
    holding: bool,
    started: bool,
}

impl ToolStream {
    /// Takes the next piece of text; returns what can be shown now.
    pub fn push(&mut self, text: &str) -> String {
        self.held.push_str(&text.replace(MINIMAX_NAMESPACE, ""));
        if !self.started {
            let trimmed = self.held.trim_start();
            if trimmed.is_empty() {
                return String::new();
            }
            self.started = true;
            self.holding = trimmed.starts_with('{');
        }
        if self.holding {
            return String::new();
        }
        if let Some(at) = BLOCKS.iter().filter_map(|(open, _)| self.held.find(open)).min() {
            self.holding = true;
            return self.held.drain(..at).collect();
        }
        // Keep a tail that may be the start of a block.
        let held = &self.held;
        let may_open = |n: usize| {
            held.is_char_boundary(held.len() - n)
                && BLOCKS.iter().any(|(open, _)| open.starts_with(&held[held.len() - n..]))
        };
        let longest = BLOCKS.iter().map(|(open, _)| open.len()).max().unwrap_or(0);
        let keep = (1..longest.min(held.len() + 1)).rev().find(|&n| may_open(n)).unwrap_or(0);
        self.held.drain(..self.held.len() - keep).collect()
    }

    /// The end of the reply: the text still to show, and the calls.
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        split(&std::mem::take(&mut self.held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen_blocks_and_llama_json_are_calls_and_other_text_is_content() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}</tool_call>";
        let (content, calls) = split(text);
        assert_eq!(content, "Let me check.");
        assert_eq!(calls[0], ToolCall { name: "weather".into(), arguments: json!({ "city": "Paris" }) });
        assert_eq!(calls[1], ToolCall { name: "time".into(), arguments: json!({ "tz": "CET" }) });
        let (content, calls) = split("{\"name\": \"weather\", \"parameters\": {\"city\": \"Oslo\"}}");
        assert_eq!((content.as_str(), calls[0].arguments.clone()), ("", json!({ "city": "Oslo" })));
        assert_eq!(split("Paris is sunny."), ("Paris is sunny.".to_string(), vec![]));
        let broken = "<tool_call>{not json</tool_call> ok";
        assert_eq!(split(broken), (broken.to_string(), vec![]));
        assert_eq!(calls[0].to_openai(0)["function"]["arguments"], "{\"city\":\"Oslo\"}");
    }

    #[test]
    fn qwen35_function_blocks_are_calls_with_their_parameters() {
        // As Qwen3.5's template writes an earlier call, and as the model then writes its own.
        let text = "I will look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan José\n</parameter>\n\
                    <parameter=days>\n3\n</parameter>\n<parameter=units>\n{\"temp\": \"C\"}\n</parameter>\n\
                    <parameter=note>\ntwo\nlines\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n\
                    </function>\n</tool_call>";
        let (content, calls) = split(text);
        assert_eq!(content, "I will look.");
        let arguments = json!({ "city": "San José", "days": 3, "units": { "temp": "C" }, "note": "two\nlines" });
        assert_eq!(calls[0], ToolCall { name: "get_weather".into(), arguments });
        assert_eq!(calls[1], ToolCall { name: "now".into(), arguments: json!({}) });
        let unclosed = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>";
        assert_eq!(split(unclosed), (unclosed.to_string(), vec![]), "a parameter never closed");
        let trailing = "<tool_call>\n<function=f>\n</function> and more\n</tool_call>";
        assert_eq!(split(trailing).1, vec![], "text after the function");
    }

    /// The calls a template writes into an earlier turn, read back: what the model, taught by the same
    /// template, writes for its own calls. Rendered with the templates llama.cpp ships (fetched into
    /// `models/templates/` by scripts/fetch-test-model).
    fn written_by(template: &str, bos: &str, eos: &str) -> (String, Vec<ToolCall>) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("models/templates/{template}.jinja"));
        let source = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-test-model)", path.display()));
        let template = crate::model::ChatTemplate::new(Some(&source), bos.into(), eos.into()).unwrap();
        let tools = [json!({ "type": "function", "function": { "name": "get_weather", "parameters": {
            "type": "object", "properties": { "city": { "type": "string" }, "days": { "type": "integer" } } } } })];
        let call = |city: &str, days: u32| json!({ "type": "function", "function": { "name": "get_weather", "arguments": { "city": city, "days": days } } });
        let messages = [
            json!({ "role": "user", "content": "QUESTION" }),
            json!({ "role": "assistant", "content": "", "tool_calls": [call("Paris", 2), call("San José", 3)] }),
            json!({ "role": "tool", "content": "Sunny" }),
            json!({ "role": "tool", "content": "Rain" }),
        ];
        let prompt = template.render_conversation(&messages, &tools, &serde_json::Map::new()).unwrap();
        // The turn after the question (the system prompt may show the format with placeholders).
        let turn = &prompt[prompt.find("QUESTION").unwrap()..];
        let turn = &turn[..turn.find("Sunny").unwrap()];
        split(turn)
    }

    #[test]
    fn glm_minimax_and_deepseek_calls_read_back_as_their_templates_write_them() {
        let expected = vec![
            ToolCall { name: "get_weather".into(), arguments: json!({ "city": "Paris", "days": 2 }) },
            ToolCall { name: "get_weather".into(), arguments: json!({ "city": "San José", "days": 3 }) },
        ];
        for (template, bos, eos) in
            [("GLM-4.6", "", "<|endoftext|>"), ("MiniMax-M2", "]~!b[", "[e~["), ("MiniMax-M3", "]~!b[", "[e~[")]
        {
            let (_, calls) = written_by(template, bos, eos);
            assert_eq!(calls, expected, "{template}");
        }
        // Qwen3.5's function blocks and DeepSeek V3.1's and V3.2's calls, read the same way.
        assert_eq!(written_by("Qwen3.5-4B", "", "<|im_end|>").1, expected);
        let deepseek = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
        for template in ["deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-V3.2"] {
            assert_eq!(written_by(template, deepseek.0, deepseek.1).1, expected, "{template}");
        }
        // M3's arguments of objects and lists, as elements.
        let m3 =
            "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"plan\">]<]minimax[>[<trip>]<]minimax[>[<city>Oslo\
                  ]<]minimax[>[</city>]<]minimax[>[<stops>]<]minimax[>[<item>1]<]minimax[>[</item>]<]minimax[>[<item>\
                  ]<]minimax[>[<item>x]<]minimax[>[</item>]<]minimax[>[</item>]<]minimax[>[</stops>]<]minimax[>[</trip>\
                  ]<]minimax[>[<fast>true]<]minimax[>[</fast>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>";
        let args = json!({ "trip": { "city": "Oslo", "stops": [1, ["x"]] }, "fast": true });
        assert_eq!(split(m3), (String::new(), vec![ToolCall { name: "plan".into(), arguments: args }]));
        // A GLM block without arguments is a call; text in the tags that is no name is not.
        assert_eq!(split("<tool_call>now</tool_call>").1, vec![ToolCall { name: "now".into(), arguments: json!({}) }]);
        for text in ["<tool_call>call it now</tool_call>", "<tool_call>f<arg_key>a</arg_key></tool_call>"] {
            assert_eq!(split(text), (text.to_string(), vec![]), "{text}");
        }
        let broken = "<minimax:tool_call><invoke name=\"f\"><parameter name=\"a\">1</invoke></minimax:tool_call>";
        assert_eq!(split(broken), (broken.to_string(), vec![]));
        // Streamed, MiniMax's block is held from its first piece.
        let mut s = ToolStream::default();
        let shown = ["Sure.", " <minimax:", "tool_call>\n<invoke name=\"now\">\n</invoke>\n</minimax:tool_call>"]
            .iter()
            .map(|piece| s.push(piece))
            .collect::<String>();
        assert_eq!(shown, "Sure. ");
        assert_eq!(s.finish().1, vec![ToolCall { name: "now".into(), arguments: json!({}) }]);
    }

    #[test]
    fn streaming_shows_text_at_once_and_holds_a_call_split_across_pieces() {
        let mut s = ToolStream::default();
        let mut shown = String::new();
        for piece in
            ["Sure", ", one moment.", "\n<tool", "_call>\n{\"name\": \"f\", ", "\"arguments\": {}}\n</tool_call>"]
        {
            shown += &s.push(piece);
        }
        assert_eq!(shown, "Sure, one moment.\n");
        let (rest, calls) = s.finish();
        assert_eq!((rest.as_str(), calls.len(), calls[0].name.as_str()), ("", 1, "f"));
        let mut s = ToolStream::default();
        assert_eq!(s.push("a <to"), "a ");
        assert_eq!(s.push("p> b"), "<top> b");
        assert_eq!(s.finish(), (String::new(), vec![]));
        let mut s = ToolStream::default();
        assert_eq!(s.push(" {\"name\""), "");
        assert_eq!(s.push(": \"g\"}"), "");
        assert_eq!(s.finish().1[0].name, "g");
    }
}
