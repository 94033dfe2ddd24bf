//! Text to token ids and back, with llama.cpp's own vocabulary code, and streaming-safe detokenization.

use super::gguf::{GgufFile, Value};
use super::ModelError;
use crate::ggml::Vocab;

/// A model's tokenizer.
pub struct Tokenizer {
    vocab: Vocab,
}

impl Tokenizer {
    /// Loads the tokenizer of `file` with llama.cpp, after checking the metadata llama.cpp trusts
    /// (array types and lengths; llama.cpp itself replaces out-of-range special token ids), so a damaged file gives an error, not a crash.
    pub fn load(file: &GgufFile) -> Result<Tokenizer, ModelError> {
        check_metadata(file)?;
        Ok(Tokenizer { vocab: Vocab::load(file.path())? })
    }

    /// Token ids of a prompt: BOS is added if the model asks for it, and the text of special tokens
    /// (such as `<|im_start|>`) becomes those tokens — as `llama-tokenize` does.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        Ok(self.vocab.tokenize(text, true, true)?)
    }

    /// Token ids of literal text: no BOS, special-token text stays text.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        Ok(self.vocab.tokenize(text, false, false)?)
    }

    /// The texts of the vocabulary's markup tokens: what `encode` turns into control tokens (see
    /// [`Vocab::markup_tokens`]).
    pub fn markup_texts(&self) -> Vec<String> {
        self.vocab.markup_tokens().into_iter().map(|(_, text)| text).collect()
    }

    /// Token ids of one part of a prompt: with BOS when `add_special` (and the model asks for it), the
    /// text of special tokens parsed when `parse_special`.
    pub(super) fn encode_part(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, ModelError> {
        Ok(self.vocab.tokenize(text, add_special, parse_special)?)
    }

    /// Appends the bytes of token `id` to `out`. Control tokens (EOS, chat markers) give no bytes.
    pub fn token_bytes(&self, id: u32, out: &mut Vec<u8>) {
        self.vocab.piece(id, false, out);
    }

    /// The text of token `id`, with control tokens spelled out (for logs and debugging).
    pub fn token_text(&self, id: u32) -> String {
        let mut bytes = Vec::new();
        self.vocab.piece(id, true, &mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Whole text of `ids` (control tokens omitted).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            self.token_bytes(id, &mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.vocab.is_end_of_generation(id)
    }

    /// Whether `id` is a control token (chat markers, EOS), which has no text of its own.
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.is_control(id)
    }

    pub fn vocabulary_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos_text(&self) -> String {
        self.vocab.bos().map(|id| self.token_text(id)).unwrap_or_default()
    }

    pub fn eos_text(&self) -> String {
        self.vocab.eos().map(|id| self.token_text(id)).unwrap_or_default()
    }

    pub fn adds_bos(&self) -> bool {
        self.vocab.adds_bos()
    }
}

fn check_metadata(file: &GgufFile) -> Result<(), ModelError> {
    let invalid =
        |key: &str, problem: String| ModelError::InvalidKey { path: file.path().into(), key: key.into(), problem };
    let array = |key: &str| -> Result<Option<&[Value]>, ModelError> {
        match file.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(other) => Err(invalid(key, format!("is a {} where an array is expected", other.type_name()))),
        }
    };
    match file.get("tokenizer.ggml.model") {
        Some(Value::String(_)) => {}
        Some(other) => {
            return Err(invalid("tokenizer.ggml.model", format!("is a {}, not a string", other.type_name())))
        }
        None => return Err(ModelError::MissingKey { path: file.path().into(), key: "tokenizer.ggml.model".into() }),
    }
    let tokens = array("tokenizer.ggml.tokens")?
        .ok_or_else(|| ModelError::MissingKey { path: file.path().into(), key: "tokenizer.ggml.tokens".into() })?;
    if tokens.is_empty() || tokens.iter().any(|t| !matches!(t, Value::String(_))) {
        return Err(invalid("tokenizer.ggml.tokens", "must be a non-empty array of strings".into()));
    }
    let n = tokens.len();
    let same_length = |key: &str, ok: fn(&Value) -> bool, kind: &str| -> Result<(), ModelError> {
        match array(key)? {
            Some(items) if items.len() != n => Err(invalid(key, format!("has {} entries for {n} tokens", items.len()))),
            Some(items) if !items.iter().all(ok) => Err(invalid(key, format!("must be an array of {kind}"))),
            _ => Ok(()),
        }
    };
    same_length("tokenizer.ggml.scores", |v| matches!(v, Value::F32(_)), "f32")?;
    same_length("tokenizer.ggml.token_type", |v| matches!(v, Value::I32(_)), "i32")?;
    if let Some(merges) = array("tokenizer.ggml.merges")? {
        if !merges.iter().all(|m| matches!(m, Value::String(_))) {
            return Err(invalid("tokenizer.ggml.merges", "must be an array of strings".into()));
        }
    }
    Ok(())
}

/// Turns token bytes into text as they arrive, never splitting a UTF-8 character: bytes of an
/// incomplete character are held until the rest comes; bytes that can never be valid become U+FFFD.
#[derive(Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// Adds `bytes` and returns the text that is now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(valid) => {
                    text.push_str(valid);
                    self.pending.clear();
                    return text;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    text.push_str(std::str::from_utf8(&self.pending[..valid]).expect("checked valid prefix"));
                    match e.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return text;
                        }
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Ends the stream: held bytes that never completed a character become U+FFFD.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::TextStream;

    #[test]
    fn multibyte_characters_split_across_tokens_are_held_back() {
        let mut s = TextStream::default();
        let euro = "€".as_bytes(); // three bytes
        assert_eq!(s.push(b"a"), "a");
        assert_eq!(s.push(&euro[..1]), "");
        assert_eq!(s.push(&euro[1..2]), "");
        assert_eq!(s.push(&euro[2..]), "€");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters_without_losing_the_rest() {
        let mut s = TextStream::default();
        assert_eq!(s.push(b"x\xffy"), "x\u{fffd}y");
        assert_eq!(s.push(&"日".as_bytes()[..2]), "");
        assert_eq!(s.finish(), "\u{fffd}");
    }
}
