//! A model's reply as the chat APIs return it: its reasoning, its answer, and the tools it calls. How
//! the reply is laid out is the model's ([`ReplyFormat`], which the worker learns from the chat template
//! that rendered the prompt): gpt-oss's harmony messages ([`harmony`]), reasoning between `<think>` tags
//! ([`thinking`]), or plain text; the answer may then hold Qwen's or Llama's tool calls
//! ([`crate::api::tools`]). [`ReplyStream`] does this while the reply streams, holding back only text that
//! may be a marker or a call, so clients see reasoning and answer as they come.

mod harmony;
mod thinking;

use super::tools::{ToolCall, ToolStream};
use crate::model::ReplyFormat;
#[cfg(test)]
use crate::model::ThinkTags;

/// A piece of a reply.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    Reasoning(String),
    Content(String),
}

/// A whole reply, split.
#[derive(Debug, Default, PartialEq)]
pub struct Reply {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ToolCall>,
}

enum Layout {
    Plain,
    Harmony(harmony::Harmony),
    Thinking(thinking::Thinking),
}

/// A reply read as it streams.
pub struct ReplyStream {
    layout: Layout,
    /// The answer's calls in Qwen's or Llama's form, when the request offered tools (harmony's calls are
    /// messages of their own).
    calls: Option<ToolStream>,
}

impl ReplyStream {
    /// A reader for a reply laid out as `format`; calls are looked for only when `tools_offered`.
    pub fn new(format: ReplyFormat, tools_offered: bool) -> ReplyStream {
        let layout = match format {
            ReplyFormat::Plain => Layout::Plain,
            ReplyFormat::Harmony => Layout::Harmony(harmony::Harmony::new(tools_offered)),
            ReplyFormat::Thinking { open, tags } => Layout::Thinking(thinking::Thinking::new(open, tags)),
        };
        let calls = (tools_offered && !matches!(layout, Layout::Harmony(_))).then(ToolStream::default);
        ReplyStream { layout, calls }
    }

    /// Takes the next piece of text; returns what can be shown now.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        let parts = match &mut self.layout {
            Layout::Plain => vec![Part::Content(text.to_string())],
            Layout::Harmony(h) => h.push(text),
            Layout::Thinking(t) => t.push(text),
        };
        self.through_calls(parts)
    }

    /// The end of the reply: what is left to show, and the calls it made.
    pub fn finish(&mut self) -> (Vec<Part>, Vec<ToolCall>) {
        let (parts, mut calls) = match &mut self.layout {
            Layout::Plain => (vec![], vec![]),
            Layout::Harmony(h) => h.finish(),
            Layout::Thinking(t) => (t.finish(), vec![]),
        };
        let mut parts = self.through_calls(parts);
        if let Some(stream) = &mut self.calls {
            let (rest, found) = stream.finish();
            parts.push(Part::Content(rest));
            calls.extend(found);
        }
        (merged(parts), calls)
    }

    /// The answer's text passes the call reader, when there is one.
    fn through_calls(&mut self, parts: Vec<Part>) -> Vec<Part> {
        let parts = match &mut self.calls {
            None => parts,
            Some(stream) => parts
                .into_iter()
                .map(|part| match part {
                    Part::Content(text) => Part::Content(stream.push(&text)),
                    reasoning => reasoning,
                })
                .collect(),
        };
        merged(parts)
    }
}

/// A whole reply laid out as `format`, split (calls only when `tools_offered`).
pub fn split(format: ReplyFormat, tools_offered: bool, text: &str) -> Reply {
    let mut stream = ReplyStream::new(format, tools_offered);
    let mut parts = stream.push(text);
    let (rest, calls) = stream.finish();
    parts.extend(rest);
    let mut reply = Reply { calls, ..Reply::default() };
    for part in parts {
        match part {
            Part::Reasoning(t) => reply.reasoning.push_str(&t),
            Part::Content(t) => reply.content.push_str(&t),
        }
    }
    if !reply.calls.is_empty() {
        reply.content = reply.content.trim().to_string();
    }
    reply
}

/// `parts` without empty ones, neighbours of one kind joined.
fn merged(parts: Vec<Part>) -> Vec<Part> {
    let mut out: Vec<Part> = Vec::with_capacity(parts.len());
    for part in parts {
        match (out.last_mut(), part) {
            (_, Part::Reasoning(t) | Part::Content(t)) if t.is_empty() => {}
            (Some(Part::Reasoning(a)), Part::Reasoning(b)) | (Some(Part::Content(a)), Part::Content(b)) => {
                a.push_str(&b)
            }
            (_, part) => out.push(part),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn qwen3_reasons_then_calls_a_tool_in_its_answer() {
        let reply = "<think>\nWeather needs the tool.\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let split = split(ReplyFormat::Thinking { open: false, tags: ThinkTags::Think }, true, reply);
        assert_eq!(split.reasoning, "Weather needs the tool.");
        assert_eq!(split.content, "");
        assert_eq!(split.calls, vec![ToolCall { name: "w".into(), arguments: json!({ "city": "Oslo" }) }]);
        // Streamed in pieces, the reasoning comes out before the reply ends and the call is held.
        let mut stream = ReplyStream::new(ReplyFormat::Thinking { open: false, tags: ThinkTags::Think }, true);
        let shown: Vec<Part> = reply.split_inclusive(' ').flat_map(|p| stream.push(p)).collect();
        assert_eq!(merged(shown), vec![Part::Reasoning("Weather needs the tool.".into())]);
        assert_eq!(stream.finish().1.len(), 1);
    }

    #[test]
    fn plain_replies_are_content_and_calls_need_tools_offered() {
        let call = "<tool_call>{\"name\": \"w\", \"arguments\": {}}</tool_call>";
        assert_eq!(split(ReplyFormat::Plain, false, call), Reply { content: call.into(), ..Reply::default() });
        assert_eq!(split(ReplyFormat::Plain, true, call).calls.len(), 1);
        let harmony = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done.";
        assert_eq!(
            split(ReplyFormat::Harmony, false, harmony),
            Reply { reasoning: "Think.".into(), content: "Done.".into(), calls: vec![] }
        );
    }
}
