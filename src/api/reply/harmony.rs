//! gpt-oss's replies in OpenAI's harmony format, read as they stream. A reply is one or more messages,
//! each a header and a body: `<|channel|>analysis<|message|>…<|end|>` is reasoning,
//! `<|start|>assistant<|channel|>final<|message|>…` the answer, a `commentary` message without a
//! recipient a preamble to show, and one addressed `to=functions.NAME` (in the header, before or after
//! the channel) a call whose body is its JSON arguments. `<|call|>` and `<|return|>` end the generation
//! (they are end-of-generation tokens and never reach the text); `<|end|>` ends a message. A reply that
//! does not open with a header (a constrained reply is plain JSON) is content as it is.

use super::Part;
use crate::api::tools::ToolCall;

const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
/// What a header starts with.
const HEADER_STARTS: [&str; 4] = ["<|channel|>", "<|start|>", " to=", "to="];
/// What ends a message's body.
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];
/// A header longer than this is not one: the rest of the reply is content.
const MAX_HEADER: usize = 512;

/// Where a message's body goes.
#[derive(Clone, Debug, PartialEq)]
enum Route {
    Reasoning,
    Content,
    /// Arguments of a call to this function, gathered until the message ends.
    Call(String),
}

#[derive(Debug, PartialEq)]
enum State {
    /// Gathering a message's header; `checked` once it is known to start like one.
    Header {
        checked: bool,
    },
    Body(Route),
    /// Not harmony: everything is content.
    Raw,
}

/// A harmony reply read piece by piece.
pub struct Harmony {
    state: State,
    pending: String,
    arguments: String,
    calls_offered: bool,
    calls: Vec<ToolCall>,
}

impl Harmony {
    /// A reader for a reply; a message to `functions.NAME` is a call only when the request offered tools.
    pub fn new(calls_offered: bool) -> Harmony {
        Harmony {
            state: State::Header { checked: false },
            pending: String::new(),
            arguments: String::new(),
            calls_offered,
            calls: Vec::new(),
        }
    }

    /// Takes the next piece of text; returns what can be shown now.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match &self.state {
                State::Raw => {
                    out.push(Part::Content(std::mem::take(&mut self.pending)));
                    return out;
                }
                State::Header { checked } => {
                    if let Some(at) = self.pending.find(MESSAGE) {
                        let header: String = self.pending.drain(..at + MESSAGE.len()).collect();
                        self.state = State::Body(self.route(&header[..at]));
                        continue;
                    }
                    let starts_like_one = *checked
                        || HEADER_STARTS.iter().any(|s| s.starts_with(&self.pending) || self.pending.starts_with(s));
                    if !starts_like_one || self.pending.len() > MAX_HEADER {
                        self.state = State::Raw;
                        continue;
                    }
                    self.state = State::Header { checked: HEADER_STARTS.iter().any(|s| self.pending.starts_with(s)) };
                    return out;
                }
                State::Body(route) => {
                    let route = route.clone();
                    let end = ENDS.iter().filter_map(|e| self.pending.find(e).map(|at| (at, e.len()))).min();
                    match end {
                        Some((at, len)) => {
                            let body: String = self.pending.drain(..at).collect();
                            self.pending.drain(..len);
                            out.extend(self.deliver(&route, body));
                            out.extend(self.end_message(&route));
                            self.state = State::Header { checked: false };
                        }
                        None => {
                            let keep = held_tail(&self.pending);
                            let body: String = self.pending.drain(..self.pending.len() - keep).collect();
                            out.extend(self.deliver(&route, body));
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// The end of the reply: what is left to show, and the calls made.
    pub fn finish(&mut self) -> (Vec<Part>, Vec<ToolCall>) {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        match std::mem::replace(&mut self.state, State::Raw) {
            State::Raw => out.push(Part::Content(rest)),
            // A header cut short (the reply hit its token limit) says nothing to show.
            State::Header { checked: true } => {}
            State::Header { checked: false } => {
                if !HEADER_STARTS.iter().any(|s| s.starts_with(&rest)) {
                    out.push(Part::Content(rest));
                }
            }
            State::Body(route) => {
                out.extend(self.deliver(&route, rest));
                out.extend(self.end_message(&route));
            }
        }
        (out, std::mem::take(&mut self.calls))
    }

    /// Where the body after `header` goes.
    fn route(&self, header: &str) -> Route {
        let word_after = |marker: &str| {
            header.rfind(marker).map(|at| {
                let rest = &header[at + marker.len()..];
                let end = rest.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(rest.len());
                rest[..end].to_string()
            })
        };
        let recipient = word_after("to=").filter(|r| r != "assistant");
        match (recipient, word_after(CHANNEL).as_deref()) {
            (Some(r), _) => match r.strip_prefix("functions.") {
                Some(name) if self.calls_offered && !name.is_empty() => Route::Call(name.to_string()),
                // A built-in tool the request did not offer (browser, python): part of the reasoning.
                _ => Route::Reasoning,
            },
            (None, Some("analysis")) => Route::Reasoning,
            (None, _) => Route::Content,
        }
    }

    fn deliver(&mut self, route: &Route, text: String) -> Option<Part> {
        match route {
            _ if text.is_empty() => None,
            Route::Reasoning => Some(Part::Reasoning(text)),
            Route::Content => Some(Part::Content(text)),
            Route::Call(_) => {
                self.arguments.push_str(&text);
                None
            }
        }
    }

    /// A call's message ended: the call, or its text as reasoning when its arguments are not JSON (a
    /// reply cut short by its token limit).
    fn end_message(&mut self, route: &Route) -> Option<Part> {
        let Route::Call(name) = route else { return None };
        let text = std::mem::take(&mut self.arguments);
        match serde_json::from_str(text.trim()) {
            Ok(arguments) => {
                self.calls.push(ToolCall { name: name.clone(), arguments });
                None
            }
            Err(_) => Some(Part::Reasoning(text)),
        }
    }
}

/// How many bytes at the end of `text` may begin a message's end marker, so are held back.
fn held_tail(text: &str) -> usize {
    (1..=text.len().min(10))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && ENDS.iter().any(|e| e.starts_with(&text[text.len() - n..])))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `text` fed in pieces of `size` bytes (or whole), merged by kind.
    fn read(text: &str, size: usize, calls: bool) -> (Vec<Part>, Vec<ToolCall>) {
        let mut h = Harmony::new(calls);
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut n = size.min(rest.len());
            while !rest.is_char_boundary(n) {
                n += 1;
            }
            parts.extend(h.push(&rest[..n]));
            rest = &rest[n..];
        }
        let (tail, calls) = h.finish();
        parts.extend(tail);
        (super::super::merged(parts), calls)
    }

    fn every_split(text: &str, calls: bool) -> (Vec<Part>, Vec<ToolCall>) {
        let whole = read(text, text.len().max(1), calls);
        for size in 1..12 {
            assert_eq!(read(text, size, calls), whole, "{text:?} in pieces of {size}");
        }
        whole
    }

    #[test]
    fn analysis_is_reasoning_and_final_is_the_answer() {
        // gpt-oss's reply after a prompt ending `<|start|>assistant` (OpenAI's harmony guide's example).
        let reply = "<|channel|>analysis<|message|>User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.";
        let (parts, calls) = every_split(reply, false);
        assert_eq!(
            parts,
            vec![
                Part::Reasoning("User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.".into()),
                Part::Content("2 + 2 = 4.".into())
            ]
        );
        assert!(calls.is_empty());
    }

    #[test]
    fn a_message_to_a_function_is_a_call_with_the_recipient_in_either_place() {
        let in_channel = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"Tokyo\"}";
        let in_role = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"location\":\"Tokyo\"}";
        for reply in [in_channel, in_role] {
            let (parts, calls) = every_split(reply, true);
            assert_eq!(parts, vec![Part::Reasoning("Need weather.".into())], "{reply}");
            assert_eq!(calls, vec![ToolCall { name: "get_weather".into(), arguments: json!({ "location": "Tokyo" }) }]);
        }
        // Without tools offered, such a message is reasoning, not a call.
        let (parts, calls) = every_split(in_channel, false);
        assert_eq!(parts, vec![Part::Reasoning("Need weather.{\"location\":\"Tokyo\"}".into())]);
        assert!(calls.is_empty());
    }

    #[test]
    fn preambles_show_and_cut_or_broken_replies_lose_nothing_that_was_said() {
        let preamble = "<|channel|>commentary<|message|>Checking the forecast.<|end|><|start|>assistant<|channel|>commentary to=functions.f<|message|>{}";
        let (parts, calls) = every_split(preamble, true);
        assert_eq!(parts, vec![Part::Content("Checking the forecast.".into())]);
        assert_eq!(calls[0].name, "f");
        // Cut by the token limit inside the arguments: the text is kept as reasoning, no call is made.
        let (parts, calls) = every_split("<|channel|>commentary to=functions.f<|message|>{\"a\": ", true);
        assert_eq!((parts, calls.len()), (vec![Part::Reasoning("{\"a\": ".into())], 0));
        // Cut inside a header: nothing to show.
        assert_eq!(
            every_split("<|channel|>analysis<|message|>Hm.<|end|><|start|>assist", false).0,
            vec![Part::Reasoning("Hm.".into())]
        );
        // Not harmony (a reply constrained to JSON): content as it is.
        assert_eq!(every_split("{\"a\": 1}", false).0, vec![Part::Content("{\"a\": 1}".into())]);
        assert_eq!(every_split("<b>bold</b>", false).0, vec![Part::Content("<b>bold</b>".into())]);
        // A built-in tool the request did not offer is reasoning.
        let browse = "<|channel|>analysis to=browser.search code<|message|>{\"query\": \"x\"}";
        assert_eq!(every_split(browse, true), (vec![Part::Reasoning("{\"query\": \"x\"}".into())], vec![]));
    }
}
