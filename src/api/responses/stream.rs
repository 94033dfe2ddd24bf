//! A response streamed as the Responses API's server-sent events, each named by its `type` and
//! numbered (`sequence_number`): `response.created` and `response.in_progress`; for each output item in
//! turn `response.output_item.added`, its content part's `added`, deltas (`response.reasoning_text.delta`
//! for reasoning, `response.output_text.delta` for the message, `response.function_call_arguments.delta`
//! for a call, whole since a call is held back until it parses), the part's and the item's `done`; then
//! `response.completed` (or `response.incomplete` at the token limit) with the whole response, or
//! `response.failed` with the error.

use super::{call_item, message_item, reasoning_item, remember, usage, Shape};
use crate::api::generation::{self, Piece};
use crate::api::reply::{Part, ReplyStream};
use crate::api::tools::ToolCall;
use crate::api::ApiState;
use crate::engine::FinishReason;
use crate::model::ReplyFormat;
use crate::worker::FrontEvent;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

/// Numbers the events.
#[derive(Default)]
struct Events {
    next: u64,
}

impl Events {
    fn event(&mut self, kind: &str, mut data: Value) -> Event {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.next);
        self.next += 1;
        Event::default().event(kind).data(data.to_string())
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Reasoning,
    Message,
}

/// The item being streamed.
struct Open {
    kind: Kind,
    id: String,
    index: usize,
    text: String,
}

/// The output so far: the items done, and the one being streamed.
#[derive(Default)]
struct Output {
    done: Vec<Value>,
    open: Option<Open>,
}

impl Output {
    /// A piece of the reply: into the open item of its kind, or a new one.
    fn push(&mut self, part: Part, events: &mut Events) -> Vec<Event> {
        let (kind, text) = match part {
            Part::Reasoning(t) => (Kind::Reasoning, t),
            Part::Content(t) => (Kind::Message, t),
        };
        if text.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if self.open.as_ref().map(|o| o.kind) != Some(kind) {
            out.extend(self.close(events));
            out.extend(self.begin(kind, events));
        }
        let Some(open) = self.open.as_mut() else { return out };
        open.text.push_str(&text);
        let name = if kind == Kind::Message { "response.output_text.delta" } else { "response.reasoning_text.delta" };
        let data = json!({ "item_id": open.id, "output_index": open.index, "content_index": 0, "delta": text, "logprobs": [] });
        out.push(events.event(name, data));
        out
    }

    fn begin(&mut self, kind: Kind, events: &mut Events) -> Vec<Event> {
        let index = self.done.len();
        let (id, item, part) = match kind {
            Kind::Message => {
                let id = super::new_id("msg");
                let item = message_item(&id, "", "in_progress");
                (id, item, json!({ "type": "output_text", "text": "", "annotations": [], "logprobs": [] }))
            }
            Kind::Reasoning => {
                let id = super::new_id("rs");
                let item =
                    json!({ "type": "reasoning", "id": id, "summary": [], "content": [], "status": "in_progress" });
                (id, item, json!({ "type": "reasoning_text", "text": "" }))
            }
        };
        let added = json!({ "output_index": index, "item": item });
        let part_added = json!({ "item_id": id, "output_index": index, "content_index": 0, "part": part });
        self.open = Some(Open { kind, id, index, text: String::new() });
        vec![events.event("response.output_item.added", added), events.event("response.content_part.added", part_added)]
    }

    /// Ends the open item, if any.
    fn close(&mut self, events: &mut Events) -> Vec<Event> {
        let Some(Open { kind, id, index, text }) = self.open.take() else { return Vec::new() };
        let (done_name, part, item) = match kind {
            Kind::Message => (
                "response.output_text.done",
                json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": [] }),
                message_item(&id, &text, "completed"),
            ),
            Kind::Reasoning => (
                "response.reasoning_text.done",
                json!({ "type": "reasoning_text", "text": text }),
                reasoning_item(&id, &text),
            ),
        };
        let at = json!({ "item_id": id, "output_index": index, "content_index": 0 });
        let mut text_done = at.clone();
        text_done["text"] = json!(text);
        let mut part_done = at;
        part_done["part"] = part;
        let out = vec![
            events.event(done_name, text_done),
            events.event("response.content_part.done", part_done),
            events.event("response.output_item.done", json!({ "output_index": index, "item": item })),
        ];
        self.done.push(item);
        out
    }

    /// A call the reply made, as an item of its own.
    fn call(&mut self, call: &ToolCall, events: &mut Events) -> Vec<Event> {
        let mut out = self.close(events);
        let index = self.done.len();
        let id = super::new_id("fc");
        let mut item = call_item(&id, call, "in_progress");
        let arguments = call.arguments.to_string();
        out.push(events.event("response.output_item.added", json!({ "output_index": index, "item": item })));
        let at = json!({ "item_id": id, "output_index": index });
        let mut delta = at.clone();
        delta["delta"] = json!(arguments);
        out.push(events.event("response.function_call_arguments.delta", delta));
        let mut done = at;
        done["arguments"] = json!(arguments);
        done["name"] = json!(call.name);
        out.push(events.event("response.function_call_arguments.done", done));
        item["arguments"] = json!(arguments);
        item["status"] = json!("completed");
        out.push(events.event("response.output_item.done", json!({ "output_index": index, "item": item })));
        self.done.push(item);
        out
    }
}

/// Streams the started request's reply as Responses events; remembers the response as `keep` says.
pub(super) fn respond(
    state: ApiState,
    events: UnboundedReceiver<FrontEvent>,
    format: ReplyFormat,
    with_tools: bool,
    shape: Shape,
    keep: Option<Vec<Value>>,
) -> Response {
    let mut numbered = Events::default();
    let created = shape.response("in_progress", vec![], None, None);
    let first = vec![
        numbered.event("response.created", json!({ "response": created })),
        numbered.event("response.in_progress", json!({ "response": created })),
    ];
    let mut reader = ReplyStream::new(format, with_tools);
    let mut output = Output::default();
    let mut keep = keep;
    let remembering = state.clone();
    let model = shape.model.clone();
    let stream = generation::relay(state, model, events, first, move |piece| match piece {
        Piece::Text(text) => reader.push(&text).into_iter().flat_map(|p| output.push(p, &mut numbered)).collect(),
        Piece::Done(reason, report) => {
            let (rest, calls) = reader.finish();
            let mut out: Vec<Event> = rest.into_iter().flat_map(|p| output.push(p, &mut numbered)).collect();
            if output.done.is_empty() && output.open.is_none() && calls.is_empty() {
                // A reply of nothing is an empty message, as a whole response gives it.
                out.extend(output.begin(Kind::Message, &mut numbered));
            }
            for call in &calls {
                out.extend(output.call(call, &mut numbered));
            }
            out.extend(output.close(&mut numbered));
            let response =
                shape.response("completed", std::mem::take(&mut output.done), Some(usage(&report)), Some(reason));
            remember(&remembering, keep.take(), &response);
            let name = if reason == FinishReason::Length { "response.incomplete" } else { "response.completed" };
            out.push(numbered.event(name, json!({ "response": response })));
            out
        }
        Piece::Failed(message) => {
            let mut response = shape.response("failed", std::mem::take(&mut output.done), None, None);
            response["error"] = json!({ "code": "server_error", "message": message });
            vec![numbered.event("response.failed", json!({ "response": response }))]
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}
