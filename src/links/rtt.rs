//! Round-trip times of a link over a sliding window of recent probes, as p50 and p99.

use std::collections::VecDeque;
use std::time::Duration;

/// Probes kept (about a minute at the probe rate).
const WINDOW: usize = 200;

#[derive(Clone, Debug, Default)]
pub struct RttWindow {
    samples: VecDeque<Duration>,
}

impl RttWindow {
    pub fn record(&mut self, rtt: Duration) {
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(rtt);
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The `q` quantile (0..=1) of the window, nearest-rank.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        let mut sorted: Vec<Duration> = self.samples.iter().copied().collect();
        sorted.sort_unstable();
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        Some(sorted[rank - 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_a_window() {
        let mut w = RttWindow::default();
        assert_eq!(w.quantile(0.5), None);
        for ms in 1..=100 {
            w.record(Duration::from_millis(ms));
        }
        assert_eq!(w.quantile(0.5), Some(Duration::from_millis(50)));
        assert_eq!(w.quantile(0.99), Some(Duration::from_millis(99)));
        for _ in 0..WINDOW {
            w.record(Duration::from_millis(7));
        }
        assert_eq!(w.quantile(0.99), Some(Duration::from_millis(7)), "old samples leave the window");
    }
}
