//! The responses this node remembers, so that a request can go on from one (`previous_response_id`)
//! without sending the conversation again, and a client can read one back or delete it: each stored
//! response object and its whole conversation as input items (what was sent before it, and what it
//! answered), for its model. At most [`KEPT`] responses, each for
//! [`KEPT_FOR`]; the oldest go first. Memory only: a restarted node remembers none (the prompt cache
//! still has the conversation's rows, so a client that sends it whole loses no time).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most responses remembered.
pub const KEPT: usize = 1024;
/// How long a response is remembered.
pub const KEPT_FOR: Duration = Duration::from_secs(6 * 3600);
/// Most bytes of conversation the remembered responses hold in all (their items as JSON).
pub const KEPT_BYTES: usize = 256 << 20;

struct Stored {
    id: String,
    model: String,
    /// The conversation: its first `inputs` items went in, the rest are the response's output.
    items: Vec<serde_json::Value>,
    inputs: usize,
    /// The response object as it was answered.
    response: serde_json::Value,
    bytes: usize,
    at: Instant,
}

/// A remembered response as a client reads it back.
pub struct Remembered {
    pub response: serde_json::Value,
    /// The items that went in (the conversation before its output).
    pub inputs: Vec<serde_json::Value>,
}

#[derive(Default)]
pub struct ResponseLog {
    stored: Mutex<VecDeque<Stored>>,
}

impl ResponseLog {
    /// Remembers `response` (its `id` and `model`) as the conversation `inputs` then `output`.
    pub fn keep(&self, response: serde_json::Value, inputs: Vec<serde_json::Value>, output: &[serde_json::Value]) {
        let id = response["id"].as_str().unwrap_or_default().to_string();
        let model = response["model"].as_str().unwrap_or_default().to_string();
        let count = inputs.len();
        let mut items = inputs;
        items.extend(output.iter().cloned());
        let bytes = items.iter().map(|i| i.to_string().len()).sum::<usize>() + response.to_string().len();
        let at = Instant::now();
        let mut stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        stored.push_back(Stored { id, model, items, inputs: count, response, bytes, at });
        let mut total: usize = stored.iter().map(|s| s.bytes).sum();
        while stored.len() > KEPT || total > KEPT_BYTES || stored.front().is_some_and(|s| s.at.elapsed() > KEPT_FOR) {
            let Some(old) = stored.pop_front() else { break };
            total -= old.bytes;
        }
    }

    /// The conversation of response `id`, and its model, if it is remembered.
    pub fn conversation(&self, id: &str) -> Option<(String, Vec<serde_json::Value>)> {
        let stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        let s = stored.iter().find(|s| s.id == id && s.at.elapsed() <= KEPT_FOR)?;
        Some((s.model.clone(), s.items.clone()))
    }

    /// Response `id` and what went into it, if it is remembered.
    pub fn get(&self, id: &str) -> Option<Remembered> {
        let stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        let s = stored.iter().find(|s| s.id == id && s.at.elapsed() <= KEPT_FOR)?;
        Some(Remembered { response: s.response.clone(), inputs: s.items[..s.inputs].to_vec() })
    }

    /// Forgets response `id`; whether it was remembered.
    pub fn forget(&self, id: &str) -> bool {
        let mut stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        let before = stored.len();
        stored.retain(|s| s.id != id);
        stored.len() < before
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_oldest_go_first_and_the_rest_are_found() {
        let log = ResponseLog::default();
        let keep = |id: String, content: String| {
            log.keep(json!({ "id": id, "model": "m" }), vec![json!({ "role": "user", "content": content })], &[])
        };
        for i in 0..KEPT + 2 {
            keep(format!("resp_{i}"), i.to_string());
        }
        assert!(log.conversation("resp_0").is_none() && log.conversation("resp_1").is_none());
        let (model, items) = log.conversation(&format!("resp_{}", KEPT + 1)).unwrap();
        assert_eq!((model.as_str(), items[0]["content"].as_str()), ("m", Some((KEPT + 1).to_string().as_str())));
        // A few huge conversations push out the older ones by bytes.
        let huge = "x".repeat(KEPT_BYTES / 3);
        for i in 0..4 {
            keep(format!("big_{i}"), huge.clone());
        }
        assert!(log.conversation("big_0").is_none() && log.conversation("big_3").is_some());
    }

    #[test]
    fn a_response_is_read_back_with_its_inputs_and_forgotten_once() {
        let log = ResponseLog::default();
        let output = [json!({ "type": "message", "role": "assistant", "content": "Paris." })];
        log.keep(json!({ "id": "resp_1", "model": "m", "status": "completed" }), vec![json!("Capital?")], &output);
        let read = log.get("resp_1").unwrap();
        assert_eq!((read.response["status"].as_str(), read.inputs), (Some("completed"), vec![json!("Capital?")]));
        assert_eq!(log.conversation("resp_1").unwrap().1.len(), 2, "goes on from its output too");
        assert!(log.forget("resp_1") && !log.forget("resp_1"));
        assert!(log.get("resp_1").is_none() && log.conversation("resp_1").is_none());
    }
}
