//! The responses this node remembers, so that a request can go on from one (`previous_response_id`)
//! without sending the conversation again: each stored response's whole conversation as input items
//! (what was sent before it, and what it answered), for its model. At most [`KEPT`] responses, each for
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
    items: Vec<serde_json::Value>,
    bytes: usize,
    at: Instant,
}

#[derive(Default)]
pub struct ResponseLog {
    stored: Mutex<VecDeque<Stored>>,
}

impl ResponseLog {
    /// Remembers response `id` of `model` as the conversation `items`.
    pub fn keep(&self, id: &str, model: &str, items: Vec<serde_json::Value>) {
        let bytes = items.iter().map(|i| i.to_string().len()).sum();
        let mut stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        stored.push_back(Stored { id: id.to_string(), model: model.to_string(), items, bytes, at: Instant::now() });
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_oldest_go_first_and_the_rest_are_found() {
        let log = ResponseLog::default();
        for i in 0..KEPT + 2 {
            log.keep(&format!("resp_{i}"), "m", vec![json!({ "role": "user", "content": i.to_string() })]);
        }
        assert!(log.conversation("resp_0").is_none() && log.conversation("resp_1").is_none());
        let (model, items) = log.conversation(&format!("resp_{}", KEPT + 1)).unwrap();
        assert_eq!((model.as_str(), items[0]["content"].as_str()), ("m", Some((KEPT + 1).to_string().as_str())));
        // A few huge conversations push out the older ones by bytes.
        let huge = "x".repeat(KEPT_BYTES / 3);
        for i in 0..4 {
            log.keep(&format!("big_{i}"), "m", vec![json!({ "role": "user", "content": huge })]);
        }
        assert!(log.conversation("big_0").is_none() && log.conversation("big_3").is_some());
    }
}
