//! Structured output: a reply constrained to JSON (any object, or one matching a JSON schema) while it is
//! sampled. llguidance compiles the schema into a grammar and, before every token, says which tokens of
//! the model's vocabulary may come next; the sampler drops the others, so the reply always parses. The
//! stage that samples builds the vocabulary's token trie once, on the first constrained request.
//!
//! Tool calls the model may make among free text (`tool_choice: auto`) are constrained lazily, as
//! llama.cpp's lazy grammars are: nothing is masked until the reply's text ends with the call's opening
//! (`<tool_call>`); from there until its closing, only a call of an offered tool with arguments valid
//! for its parameters may come, in the style of the model's template (see [`tool_calls`]); then the
//! text is free again, or with one call only, the reply ends.

use super::tool_calls::{self, CallStyle, CallableTool};
use crate::model::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

/// The shape a reply must have.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputFormat {
    /// Any JSON object.
    JsonObject,
    /// JSON that validates against `schema`.
    JsonSchema { schema: serde_json::Value },
    /// Free text in which each tool call the model opens (`<tool_call>`) is a call of one of `tools`
    /// with arguments valid for its parameters, written in `style`, up to `</tool_call>`; with
    /// `single`, the reply ends after its first call (OpenAI's `parallel_tool_calls: false`).
    ToolCalls {
        tools: Vec<CallableTool>,
        style: CallStyle,
        #[serde(default)]
        single: bool,
    },
}

impl OutputFormat {
    /// The grammar of the reply. Unless the schema says otherwise (llguidance's `x-guidance` options),
    /// the JSON is written on one line with a space after `,` and `:`: free whitespace would let a
    /// model pad the reply with newlines until it runs out of tokens.
    /// For tool calls, the grammar of one call after its opening (see [`tool_calls`]).
    fn grammar(&self) -> TopLevelGrammar {
        match self {
            OutputFormat::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            OutputFormat::JsonSchema { schema } => TopLevelGrammar::from_json_schema(compact(schema.clone())),
            OutputFormat::ToolCalls { tools, style, .. } => tool_calls::grammar(tools, *style, compact),
        }
    }

    /// The text after which the grammar starts, for a format that waits for one.
    fn trigger(&self) -> Option<&str> {
        match self {
            OutputFormat::ToolCalls { .. } => Some(tool_calls::OPEN),
            _ => None,
        }
    }

    /// Compiles the format without a model's vocabulary, so that a schema llguidance cannot use is
    /// refused when the request arrives (the message says what is wrong), not when it is sampled.
    pub fn check(&self) -> Result<(), String> {
        static BYTES: std::sync::OnceLock<Result<ParserFactory, String>> = std::sync::OnceLock::new();
        let factory = BYTES
            .get_or_init(|| ParserFactory::new_simple(&ApproximateTokEnv::single_byte_env()).map_err(|e| e.to_string()))
            .as_ref()?;
        factory.create_parser(self.grammar()).map(|_| ()).map_err(|e| format!("the JSON schema cannot be used: {e}"))
    }
}

/// `schema` written on one line with a space after `,` and `:`, unless it says otherwise.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(fields) = schema.as_object_mut() {
        fields.entry("x-guidance").or_insert_with(
            || serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// A model's vocabulary as llguidance sees it: each token's bytes (control tokens marked as special).
struct VocabularyEnv {
    trie: TokTrie,
    tokenizer: Mutex<Tokenizer>,
}

impl TokenizerEnv for VocabularyEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<u32> {
        let text = String::from_utf8_lossy(bytes);
        let tokenizer = self.tokenizer.lock().unwrap_or_else(|p| p.into_inner());
        tokenizer.encode_plain(&text).unwrap_or_default()
    }
}

/// Builds constraints for one model, from its tokenizer (the trie is built on first use).
pub struct Grammars {
    tokenizer: Option<Tokenizer>,
    built: Option<Result<Built, String>>,
}

struct Built {
    factory: ParserFactory,
    /// Every token that ends generation: the grammar's end allows them all.
    ends: Arc<Vec<u32>>,
}

impl Grammars {
    pub fn new(tokenizer: Tokenizer) -> Grammars {
        Grammars { tokenizer: Some(tokenizer), built: None }
    }

    /// A constraint for one request's reply.
    pub fn constraint(&mut self, format: &OutputFormat) -> Result<Constraint, String> {
        let tokenizer = &mut self.tokenizer;
        let built = self.built.get_or_insert_with(|| match tokenizer.take() {
            Some(tokenizer) => build(tokenizer),
            None => Err("no tokenizer for structured output".into()),
        });
        let built = built.as_ref().map_err(Clone::clone)?;
        let parser = built.factory.create_parser(format.grammar()).map_err(|e| format!("the JSON schema: {e}"))?;
        let env = built.factory.tok_env().clone();
        let eos = env.tok_trie().eos_token();
        let matcher = Matcher::new(Ok(parser));
        let single = matches!(format, OutputFormat::ToolCalls { single: true, .. });
        let (active, lazy) = match format.trigger() {
            None => (Some(matcher), None),
            Some(trigger) => {
                let trigger = trigger.as_bytes().to_vec();
                (None, Some(Lazy { trigger, pristine: matcher, tail: Vec::new(), env, single }))
            }
        };
        Ok(Constraint { active, lazy, eos, ends: built.ends.clone(), failed: None })
    }
}

fn build(tokenizer: Tokenizer) -> Result<Built, String> {
    let size = tokenizer.vocabulary_size();
    let mut words = Vec::with_capacity(size);
    let mut ends = Vec::new();
    for id in 0..size as u32 {
        let mut bytes = Vec::new();
        if tokenizer.is_control(id) {
            bytes.push(TokTrie::SPECIAL_TOKEN_MARKER);
            bytes.extend_from_slice(tokenizer.token_text(id).as_bytes());
        } else {
            tokenizer.token_bytes(id, &mut bytes);
        }
        if tokenizer.is_end_of_generation(id) {
            ends.push(id);
        }
        words.push(bytes);
    }
    let eos = *ends.first().ok_or("the model has no end-of-generation token")?;
    let trie = TokTrie::from(&TokRxInfo::new(size as u32, eos), &words);
    let env: TokEnv = Arc::new(VocabularyEnv { trie, tokenizer: Mutex::new(tokenizer) });
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
    factory.quiet();
    Ok(Built { factory, ends: Arc::new(ends) })
}

/// One request's constraint: which tokens may come next, given those sampled so far.
pub struct Constraint {
    /// The grammar in force; none while a lazy one waits for its trigger.
    active: Option<Matcher>,
    lazy: Option<Lazy>,
    eos: u32,
    ends: Arc<Vec<u32>>,
    /// Why nothing but the end may come now: the grammar broke (logged), or the one call a reply may
    /// make is complete.
    failed: Option<String>,
}

/// A grammar that starts each time the reply's text ends with `trigger`, and ends when it is complete.
struct Lazy {
    trigger: Vec<u8>,
    /// The grammar as it starts, cloned for each use.
    pristine: Matcher,
    /// The reply's last bytes while no grammar is in force, as long as the trigger at most.
    tail: Vec<u8>,
    env: TokEnv,
    /// The reply ends when the grammar has completed once.
    single: bool,
}

impl Lazy {
    /// Whether the reply's text, with `token` after it, ends with the trigger, or with the trigger and a
    /// newline (a token `>\n`: the grammars begin with an optional newline, so they start alike). A
    /// token that runs further past the trigger leaves that call unconstrained.
    fn triggered_by(&mut self, token: u32) -> bool {
        let bytes = self.env.tok_trie().decode_raw(&[token]);
        self.tail.extend(bytes.iter().filter(|&&b| b != TokTrie::SPECIAL_TOKEN_MARKER));
        let keep = self.tail.len().saturating_sub(self.trigger.len() + 1);
        self.tail.drain(..keep);
        self.tail.ends_with(&self.trigger) || self.tail.strip_suffix(b"\n").is_some_and(|t| t.ends_with(&self.trigger))
    }
}

impl Constraint {
    /// Sets the logits of every token the grammar does not allow next to −∞. When the grammar is
    /// complete (or broke), only ending the reply is allowed; while a lazy grammar waits, nothing is
    /// masked.
    pub fn mask(&mut self, logits: &mut [f32]) {
        if self.failed.is_none() && self.active.is_none() {
            return;
        }
        let mask = match self.failed.is_none().then(|| self.active.as_mut().map(Matcher::compute_mask_or_eos)) {
            Some(Some(Ok(mask))) => mask,
            Some(Some(Err(e))) => {
                self.fail(e.to_string());
                end_only(self.eos, logits.len())
            }
            _ => end_only(self.eos, logits.len()),
        };
        let may_end = mask.is_allowed(self.eos);
        for (id, logit) in logits.iter_mut().enumerate() {
            let id = id as u32;
            let allowed = (id as usize) < mask.len() && mask.is_allowed(id);
            let ends_reply = may_end && self.ends.contains(&id);
            if !(allowed || ends_reply) {
                *logit = f32::NEG_INFINITY;
            }
        }
    }

    /// Advances the grammar by the sampled `token`: a lazy one starts after its trigger and, once
    /// complete, waits for the next.
    pub fn commit(&mut self, token: u32) {
        if self.failed.is_some() || self.ends.contains(&token) {
            return;
        }
        let Some(matcher) = self.active.as_mut() else {
            if let Some(lazy) = self.lazy.as_mut() {
                if lazy.triggered_by(token) {
                    self.active = Some(lazy.pristine.deep_clone());
                    lazy.tail.clear();
                }
            }
            return;
        };
        if let Err(e) = matcher.consume_token(token) {
            return self.fail(e.to_string());
        }
        if let Some(lazy) = self.lazy.as_ref().filter(|_| matcher.is_accepting().unwrap_or(false)) {
            if lazy.single {
                // Nothing may follow: the mask now allows only the end.
                self.failed = Some("one tool call only".into());
            } else {
                self.active = None;
            }
        }
    }

    fn fail(&mut self, why: String) {
        tracing::warn!("structured output: {why}; ending the reply");
        self.failed = Some(why);
    }
}

fn end_only(eos: u32, size: usize) -> SimpleVob {
    let mut mask = SimpleVob::alloc(size.max(eos as usize + 1));
    mask.allow_token(eos);
    mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_llguidance_cannot_use_are_refused_with_the_reason() {
        assert!(OutputFormat::JsonObject.check().is_ok());
        let schema = serde_json::json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        assert!(OutputFormat::JsonSchema { schema }.check().is_ok());
        let bad = OutputFormat::JsonSchema { schema: serde_json::json!({"type": "no-such-type"}) };
        let err = bad.check().unwrap_err();
        assert!(err.contains("JSON schema"), "{err}");
    }

    #[test]
    fn tool_names_and_keys_that_look_like_grammar_stay_text() {
        let parameters = serde_json::json!({ "type": "object", "required": ["k\"ey>"], "properties": {
            "k\"ey>": { "type": "string" }, "n/": { "type": "integer" }, "u": { "enum": ["a\"", "b\n"] },
        } });
        let tools = vec![CallableTool { name: "na\"me\n/".into(), parameters }];
        for style in [CallStyle::Json, CallStyle::XmlFunctions] {
            let format = OutputFormat::ToolCalls { tools: tools.clone(), style, single: false };
            assert_eq!(format.check(), Ok(()), "{style:?}");
        }
    }
}
