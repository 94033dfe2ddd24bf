//! Structured output: a reply constrained to JSON (any object, or one matching a JSON schema) while it is
//! sampled. llguidance compiles the schema into a grammar and, before every token, says which tokens of
//! the model's vocabulary may come next; the sampler drops the others, so the reply always parses. The
//! stage that samples builds the vocabulary's token trie once, on the first constrained request.

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
}

impl OutputFormat {
    /// The grammar of the reply. Unless the schema says otherwise (llguidance's `x-guidance` options),
    /// the JSON is written on one line with a space after `,` and `:`: free whitespace would let a
    /// model pad the reply with newlines until it runs out of tokens.
    fn grammar(&self) -> TopLevelGrammar {
        let mut schema = match self {
            OutputFormat::JsonObject => serde_json::json!({"type": "object"}),
            OutputFormat::JsonSchema { schema } => schema.clone(),
        };
        if let Some(fields) = schema.as_object_mut() {
            fields.entry("x-guidance").or_insert_with(
                || serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
            );
        }
        TopLevelGrammar::from_json_schema(schema)
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
        let eos = built.factory.tok_env().tok_trie().eos_token();
        Ok(Constraint { matcher: Matcher::new(Ok(parser)), eos, ends: built.ends.clone(), failed: None })
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
    matcher: Matcher,
    eos: u32,
    ends: Arc<Vec<u32>>,
    /// Why the grammar broke, if it did: the reply then ends.
    failed: Option<String>,
}

impl Constraint {
    /// Sets the logits of every token the grammar does not allow next to −∞. When the grammar is
    /// complete (or broke), only ending the reply is allowed.
    pub fn mask(&mut self, logits: &mut [f32]) {
        let mask = match self.failed.is_none().then(|| self.matcher.compute_mask_or_eos()) {
            Some(Ok(mask)) => mask,
            Some(Err(e)) => {
                self.fail(e.to_string());
                end_only(self.eos, logits.len())
            }
            None => end_only(self.eos, logits.len()),
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

    /// Advances the grammar by the sampled `token`.
    pub fn commit(&mut self, token: u32) {
        if self.failed.is_some() || self.ends.contains(&token) {
            return;
        }
        if let Err(e) = self.matcher.consume_token(token) {
            self.fail(e.to_string());
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
}
