//! Replies that reason between `<think>` and `</think>` before answering (Qwen3, DeepSeek R1 and V3.1,
//! GLM-4.5, Kimi K2 Thinking; MiniMax M3 between `<mm:think>` and `</mm:think>`), read as they stream. The reply may open with `<think>`, or start inside
//! the block when the prompt opened it; either way what comes before `</think>` is reasoning, and the
//! answer after it. Whitespace around the reasoning and before the answer is the layout's, not theirs.

use super::Part;
use crate::model::ThinkTags;

#[derive(Debug, PartialEq)]
enum State {
    /// At the start of a reply that may open with `<think>`.
    Opening,
    /// Inside the block; `started` once its first visible character is out.
    Reasoning { started: bool },
    /// After the block (or a reply without one); `started` likewise.
    Answer { started: bool },
}

/// A reply with a reasoning block, read piece by piece.
pub struct Thinking {
    state: State,
    pending: String,
    /// The block's opening and closing markers.
    open: &'static str,
    close: &'static str,
}

impl Thinking {
    /// A reader for a reply that starts inside the block when `open` (the prompt opened it), the block
    /// between `tags`' markers.
    pub fn new(open: bool, tags: ThinkTags) -> Thinking {
        let state = if open { State::Reasoning { started: false } } else { State::Opening };
        let (open, close) = tags.markers();
        Thinking { state, pending: String::new(), open, close }
    }

    /// Takes the next piece of text; returns what can be shown now.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Opening => {
                    let trimmed = self.pending.trim_start();
                    if let Some(after) = trimmed.strip_prefix(self.open) {
                        self.pending = after.to_string();
                        self.state = State::Reasoning { started: false };
                        continue;
                    }
                    if self.open.starts_with(trimmed) {
                        return out;
                    }
                    // No block: the reply as it is.
                    self.state = State::Answer { started: true };
                }
                State::Reasoning { started } => {
                    if !started {
                        self.pending = self.pending.trim_start().to_string();
                    }
                    if let Some(at) = self.pending.find(self.close) {
                        let reasoning: String = self.pending.drain(..at + self.close.len()).collect();
                        let reasoning = reasoning[..at].trim_end();
                        if !reasoning.is_empty() {
                            out.push(Part::Reasoning(reasoning.to_string()));
                        }
                        self.state = State::Answer { started: false };
                        continue;
                    }
                    // Hold back what may begin `</think>` and the whitespace before it.
                    let keep = self.pending.len() - held_tail(&self.pending, self.close);
                    let keep = self.pending[..keep].trim_end().len();
                    if keep > 0 {
                        out.push(Part::Reasoning(self.pending.drain(..keep).collect()));
                        self.state = State::Reasoning { started: true };
                    }
                    return out;
                }
                State::Answer { started } => {
                    if !started {
                        self.pending = self.pending.trim_start().to_string();
                        if self.pending.is_empty() {
                            return out;
                        }
                        self.state = State::Answer { started: true };
                    }
                    out.push(Part::Content(std::mem::take(&mut self.pending)));
                    return out;
                }
            }
        }
    }

    /// The end of the reply: what is left to show.
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Reasoning { started } => {
                // Whitespace held back before the cut belongs to the reasoning only before more text.
                let rest = if started { rest.trim_end() } else { rest.trim() };
                (!rest.is_empty()).then(|| Part::Reasoning(rest.to_string())).into_iter().collect()
            }
            // A reply of nothing but the start of `<think>` (or whitespace) is that text.
            State::Opening | State::Answer { .. } if !rest.is_empty() => vec![Part::Content(rest)],
            _ => vec![],
        }
    }
}

/// How many bytes at the end of `text` may begin `marker`.
fn held_tail(text: &str, marker: &str) -> usize {
    (1..=text.len().min(marker.len() - 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_split(text: &str, open: bool) -> Vec<Part> {
        every_split_of(text, open, ThinkTags::Think)
    }

    fn every_split_of(text: &str, open: bool, tags: ThinkTags) -> Vec<Part> {
        let read = |size: usize| {
            let mut t = Thinking::new(open, tags);
            let mut parts = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(size) {
                parts.extend(t.push(&piece.iter().collect::<String>()));
            }
            parts.extend(t.finish());
            super::super::merged(parts)
        };
        let whole = read(text.len().max(1));
        for size in 1..12 {
            assert_eq!(read(size), whole, "{text:?} in pieces of {size}");
        }
        whole
    }

    #[test]
    fn minimax_m3_reasons_between_its_own_markers() {
        let m3 = "<mm:think>Weigh it.</mm:think>\n\nThe answer.";
        let want = vec![Part::Reasoning("Weigh it.".into()), Part::Content("The answer.".into())];
        assert_eq!(every_split_of(m3, false, ThinkTags::MiniMax), want);
        // Another family's markers are text to it.
        let other = "<think>x</think>y";
        assert_eq!(every_split_of(other, false, ThinkTags::MiniMax), vec![Part::Content(other.into())]);
    }

    #[test]
    fn the_block_is_reasoning_and_the_rest_the_answer() {
        let qwen = "<think>\nThe user greets me.\n\nI greet back.\n</think>\n\nHello! How can I help?";
        assert_eq!(
            every_split(qwen, false),
            vec![
                Part::Reasoning("The user greets me.\n\nI greet back.".into()),
                Part::Content("Hello! How can I help?".into())
            ]
        );
        // DeepSeek V3.1's prompt opens the block: the reply starts inside it.
        assert_eq!(
            every_split("Short thought.</think>Answer.", true),
            vec![Part::Reasoning("Short thought.".into()), Part::Content("Answer.".into())]
        );
        // Thinking turned off (the prompt holds an empty block): the reply is the answer, kept as it is.
        assert_eq!(every_split("  Plain <b>answer</b>.", false), vec![Part::Content("  Plain <b>answer</b>.".into())]);
        assert_eq!(every_split("<thin", false), vec![Part::Content("<thin".into())]);
        // Cut by the token limit while reasoning: the reasoning so far.
        assert_eq!(every_split("<think>Still going </thi", false), vec![Part::Reasoning("Still going </thi".into())]);
        assert_eq!(every_split("<think></think>\n\nOnly this.", false), vec![Part::Content("Only this.".into())]);
    }
}
