//! Vocabularies for tests of tokenization and chat markup: SmolLM2's tokenizer with a family's chat
//! markers added as control tokens, in a weightless GGUF (the vocabularies of those families' real models
//! are too large to ship).

use super::gguf_writer::{GgufWriter, Meta};
use shoal::model::{GgufFile, Value};
use std::path::PathBuf;

/// SmolLM2's tokenizer with `markers` added as control tokens (those it has already stay as they are),
/// written to `name`.gguf in the tests' directory.
pub fn with_control_tokens(name: &str, markers: &[&str]) -> PathBuf {
    let source = GgufFile::open(&super::model_path()).unwrap();
    let known: Vec<String> = match source.get("tokenizer.ggml.tokens") {
        Some(Value::Array(tokens)) => tokens.iter().filter_map(|t| t.as_str().map(String::from)).collect(),
        _ => panic!("SmolLM2 has a token list"),
    };
    let added: Vec<&str> = markers.iter().copied().filter(|m| !known.iter().any(|k| k == m)).collect();
    let mut g = GgufWriter::default();
    for (key, value) in source.metadata() {
        let value = match (key.as_str(), value.clone()) {
            ("tokenizer.ggml.tokens", Value::Array(mut tokens)) => {
                tokens.extend(added.iter().map(|t| Value::String(t.to_string())));
                Value::Array(tokens)
            }
            ("tokenizer.ggml.token_type", Value::Array(mut types)) => {
                types.extend(added.iter().map(|_| Value::I32(3)));
                Value::Array(types)
            }
            (_, value) => value,
        };
        g = g.meta(key, Meta::Value(value));
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.gguf"));
    let part = path.with_extension(format!("{}.part", std::process::id()));
    std::fs::write(&part, g.bytes()).unwrap();
    std::fs::rename(&part, &path).unwrap();
    path
}
