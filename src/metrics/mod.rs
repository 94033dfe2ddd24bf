//! Token rates: per request (time to first token, prefill and decode tokens/s, from the worker's report)
//! and cluster-wide (tokens per second over a sliding window, from the stage-0 workers' counters).

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Cluster-wide rates over the last [`WINDOW`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct ClusterRates {
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    pub requests_per_minute: f64,
    pub window_seconds: f64,
}

pub const WINDOW: Duration = Duration::from_secs(10);

/// When the requests of the last [`WINDOW`] finished (for requests per minute).
#[derive(Default)]
pub struct RequestWindow {
    finished: VecDeque<Instant>,
}

impl RequestWindow {
    pub fn record(&mut self) {
        self.finished.push_back(Instant::now());
        self.expire();
    }

    fn expire(&mut self) {
        while self.finished.front().is_some_and(|at| at.elapsed() > WINDOW) {
            self.finished.pop_front();
        }
    }

    pub fn per_minute(&mut self) -> f64 {
        self.expire();
        self.finished.len() as f64 * 60.0 / WINDOW.as_secs_f64()
    }
}

/// Cumulative (prompt, generated) token counters of each instance's stage 0, sampled every second; the
/// rates are their growth over the window.
#[derive(Default)]
pub struct CounterWindow {
    samples: VecDeque<(Instant, Counters)>,
}

/// (prompt, generated) tokens of each instance.
type Counters = std::collections::HashMap<String, (u64, u64)>;

impl CounterWindow {
    pub fn rates(&mut self, counters: &[(String, u64, u64)]) -> ClusterRates {
        let now = Instant::now();
        self.samples.push_back((now, counters.iter().map(|(id, p, g)| (id.clone(), (*p, *g))).collect()));
        while self.samples.len() > 2 && self.samples.front().is_some_and(|s| now.duration_since(s.0) > WINDOW) {
            self.samples.pop_front();
        }
        let (first_at, first) = self.samples.front().expect("just pushed");
        let secs = now.duration_since(*first_at).as_secs_f64();
        if secs <= 0.0 {
            return ClusterRates { window_seconds: 0.0, ..Default::default() };
        }
        let (mut prompt, mut generated) = (0u64, 0u64);
        for (id, p, g) in counters {
            let (p0, g0) = first.get(id).copied().unwrap_or((0, 0));
            prompt += p.saturating_sub(p0);
            generated += g.saturating_sub(g0);
        }
        ClusterRates {
            prefill_tokens_per_second: prompt as f64 / secs,
            decode_tokens_per_second: generated as f64 / secs,
            requests_per_minute: 0.0,
            window_seconds: secs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_per_minute_count_the_window() {
        let mut w = RequestWindow::default();
        assert_eq!(w.per_minute(), 0.0);
        w.record();
        w.record();
        assert_eq!(w.per_minute(), 12.0);
    }
}
