//! Token rates: per request (time to first token, prefill and decode tokens/s, from the worker's report)
//! and cluster-wide (tokens per second over a sliding window, from the stage-0 workers' counters).

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Cluster-wide rates over the last [`WINDOW`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterRates {
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    pub requests_per_minute: f64,
    pub window_seconds: f64,
}

pub const WINDOW: Duration = Duration::from_secs(10);

/// Finished requests of the last [`WINDOW`].
#[derive(Default)]
pub struct RateWindow {
    finished: VecDeque<(Instant, usize, usize, Duration, Duration)>,
}

impl RateWindow {
    /// Records a finished request: its prompt and generated tokens and how long each phase took.
    pub fn record(&mut self, prompt_tokens: usize, generated: usize, prefill: Duration, decode: Duration) {
        self.finished.push_back((Instant::now(), prompt_tokens, generated, prefill, decode));
        self.expire();
    }

    fn expire(&mut self) {
        while self.finished.front().is_some_and(|f| f.0.elapsed() > WINDOW) {
            self.finished.pop_front();
        }
    }

    /// Tokens processed per second of wall time over the window (requests in parallel add up).
    pub fn rates(&mut self) -> ClusterRates {
        self.expire();
        let secs = WINDOW.as_secs_f64();
        let prompt: usize = self.finished.iter().map(|f| f.1).sum();
        let generated: usize = self.finished.iter().map(|f| f.2).sum();
        ClusterRates {
            prefill_tokens_per_second: prompt as f64 / secs,
            decode_tokens_per_second: generated as f64 / secs,
            requests_per_minute: self.finished.len() as f64 * 60.0 / secs,
            window_seconds: secs,
        }
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
    fn rates_sum_the_window() {
        let mut w = RateWindow::default();
        w.record(100, 50, Duration::from_millis(100), Duration::from_millis(500));
        w.record(100, 50, Duration::from_millis(100), Duration::from_millis(500));
        let r = w.rates();
        assert_eq!(r.decode_tokens_per_second, 10.0);
        assert_eq!(r.prefill_tokens_per_second, 20.0);
        assert_eq!(r.requests_per_minute, 12.0);
    }
}
