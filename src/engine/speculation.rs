//! Speculative decoding from the prompt itself (prompt lookup): the tokens that followed the latest
//! earlier occurrence of the sequence's last few tokens are drafted as its next ones, the model runs
//! them all in one step, and the sampler keeps the drafts its own choice agrees with
//! ([`Sampler::verify`](super::Sampler::verify)) — code edits, quotes and repeated structure come out
//! several tokens per step. Each drafted row costs compute of its own, so [`SpeculationPolicy`] drafts
//! as many tokens as give a request the most tokens per unit of time — from how often its drafts are
//! kept and what a drafted row costs, measured on this stage ([`DraftCost`]) — and none where no
//! length pays.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Whether an instance drafts (a launch option).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum Speculation {
    /// Draft, and stop drafting for a request while its acceptance does not pay for the drafts.
    #[default]
    Auto,
    /// Draft whenever the history offers a draft.
    On,
    /// Never draft.
    Off,
}

impl Speculation {
    /// This choice for `config`'s model: off for a model with a recurrent state, which cannot go back
    /// from a refused draft.
    pub fn for_model(self, config: &crate::model::ModelConfig) -> Speculation {
        if config.linear_attention.is_some() {
            Speculation::Off
        } else {
            self
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Speculation::Auto => "auto",
            Speculation::On => "on",
            Speculation::Off => "off",
        }
    }
}

impl std::str::FromStr for Speculation {
    type Err = String;
    fn from_str(s: &str) -> Result<Speculation, String> {
        match s {
            "auto" => Ok(Speculation::Auto),
            "on" => Ok(Speculation::On),
            "off" => Ok(Speculation::Off),
            other => Err(format!("speculation {other:?}: use auto, on or off")),
        }
    }
}

/// Drafted tokens per step unless the launch says (`draft_tokens`).
pub const DEFAULT_DRAFT_TOKENS: usize = 8;
/// Most drafted tokens per step a launch may ask.
pub const MAX_DRAFT_TOKENS: usize = 32;
/// The longest and shortest runs of last tokens looked up in the history.
const LONGEST_MATCH: usize = 4;
const SHORTEST_MATCH: usize = 2;

/// Up to `most` tokens that followed the latest earlier occurrence of the history's last tokens (the
/// longest run of them, from [`LONGEST_MATCH`] down to [`SHORTEST_MATCH`], that occurred before);
/// empty when none did.
pub fn prompt_lookup(history: &[u32], most: usize) -> Vec<u32> {
    if most == 0 {
        return Vec::new();
    }
    for n in (SHORTEST_MATCH..=LONGEST_MATCH.min(history.len().saturating_sub(1))).rev() {
        let tail = &history[history.len() - n..];
        // The latest occurrence that ends before the tail begins to overlap it (so a token follows).
        let found = (0..history.len() - n).rev().find(|&at| &history[at..at + n] == tail);
        if let Some(at) = found {
            let from = at + n;
            let end = (from + most).min(history.len());
            return history[from..end].to_vec();
        }
    }
    Vec::new()
}

/// Steps without drafts a request waits, once drafting stopped paying for it, before it tries again.
const PAUSE_STEPS: u32 = 16;
/// Verified drafts (decayed) a request's chance of keeping one is judged on at least: about five steps
/// whose first draft was refused.
const JUDGED_AFTER: f64 = 4.0;

/// One request's drafting: how many tokens to draft next, from what it accepted so far and what a
/// drafted position costs on this stage.
#[derive(Clone, Debug)]
pub struct SpeculationPolicy {
    mode: Speculation,
    most: usize,
    /// Drafts verified (each kept one and each first refusal of a step), and those kept, decayed: their
    /// ratio is the chance that the next draft is kept once the ones before it were.
    tried: f64,
    kept: f64,
    /// Steps left without drafts.
    paused: u32,
}

/// The draft length (up to `most`) that gives the most tokens per unit of time when each draft is kept
/// with chance `keep` (once those before it were) and a drafted row costs `cost` of a one-row step;
/// with its gain over drafting nothing (0 drafts and 1.0 when no length gains).
pub fn best_draft_length(keep: f64, cost: f64, most: usize) -> (usize, f64) {
    let mut best = (0, 1.0);
    // Tokens a step gives with k drafts: 1 + keep + keep² + … + keep^k.
    let (mut tokens, mut power) = (1.0, 1.0);
    for k in 1..=most {
        power *= keep;
        tokens += power;
        let gain = tokens / (1.0 + cost * k as f64);
        if gain > best.1 {
            best = (k, gain);
        }
    }
    best
}

impl SpeculationPolicy {
    pub fn new(mode: Speculation, most: usize) -> SpeculationPolicy {
        SpeculationPolicy { mode, most: most.min(MAX_DRAFT_TOKENS), tried: 0.0, kept: 0.0, paused: 0 }
    }

    /// How many tokens to draft in this step at most (0: none), given the relative cost of a drafted
    /// row against a step of one row (see [`DraftCost`]): under `auto`, the best length for what the
    /// request kept so far (all it may, until it has been judged on enough drafts).
    pub fn budget(&mut self, cost: f64) -> usize {
        match self.mode {
            Speculation::Off => 0,
            Speculation::On => self.most,
            Speculation::Auto if self.paused > 0 => {
                self.paused -= 1;
                0
            }
            Speculation::Auto if self.tried < JUDGED_AFTER => self.most,
            Speculation::Auto => match best_draft_length(self.kept / self.tried, cost, self.most) {
                (0, _) => {
                    self.paused = PAUSE_STEPS;
                    // After the pause the request is judged afresh.
                    (self.tried, self.kept) = (0.0, 0.0);
                    0
                }
                (length, _) => length,
            },
        }
    }

    /// Whether the request may draft at all.
    pub fn drafts(&self) -> bool {
        self.mode != Speculation::Off && self.most > 0
    }

    /// After a step that drafted `drafted` tokens, of which the first `accepted` were kept.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        // Decay so that a request whose text stops repeating is judged on its recent steps.
        const KEEP: f64 = 0.9;
        let refused = if accepted < drafted { 1.0 } else { 0.0 };
        self.tried = self.tried * KEEP + accepted as f64 + refused;
        self.kept = self.kept * KEEP + accepted as f64;
    }
}

/// What a drafted row costs on this stage, as a share of a step of one row: a line fitted (least
/// squares, decayed) through the decode steps' times against their rows — one per request and each
/// drafted one.
#[derive(Clone, Debug, Default)]
pub struct DraftCost {
    // Decayed sums over the steps: count, rows, time, rows², rows × time.
    n: f64,
    rows: f64,
    time: f64,
    rows2: f64,
    rows_time: f64,
}

/// Assumed until steps of different sizes were measured: a CPU's decode step reads every weight once,
/// and a few more rows add some compute to it.
const ASSUMED_COST: f64 = 0.25;

impl DraftCost {
    /// A decode step of `requests` rows (one per request) and `drafted` drafted rows took `time`.
    pub fn record(&mut self, requests: usize, drafted: usize, time: Duration) {
        const KEEP: f64 = 0.98;
        let (r, t) = ((requests + drafted) as f64, time.as_secs_f64());
        self.n = self.n * KEEP + 1.0;
        self.rows = self.rows * KEEP + r;
        self.time = self.time * KEEP + t;
        self.rows2 = self.rows2 * KEEP + r * r;
        self.rows_time = self.rows_time * KEEP + r * t;
    }

    /// The extra time of one drafted row, as a share of a step of one row.
    pub fn relative(&self) -> f64 {
        self.measured().unwrap_or(ASSUMED_COST)
    }

    /// [`DraftCost::relative`] once steps of different sizes were measured.
    pub fn measured(&self) -> Option<f64> {
        let spread = self.n * self.rows2 - self.rows * self.rows;
        // Too few steps, or all of one size: no line to fit.
        if self.n < 2.0 || spread <= 1e-9 * self.n * self.n {
            return None;
        }
        let per_row = ((self.n * self.rows_time - self.rows * self.time) / spread).max(0.0);
        let fixed = (self.time - per_row * self.rows) / self.n;
        let one_row = fixed + per_row;
        (one_row > 0.0).then(|| per_row / one_row)
    }
}

/// The decode rate speculation gave, as a multiple of decoding without it: `generated` tokens took a
/// step each but the `accepted` drafts, and each of the `drafted` rows cost `cost` of a step.
pub fn estimated_speedup(generated: u64, drafted: u64, accepted: u64, cost: f64) -> f64 {
    let steps = generated.saturating_sub(accepted) as f64 + cost * drafted as f64;
    if steps <= 0.0 {
        1.0
    } else {
        generated as f64 / steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_drafts_what_followed_the_latest_longest_match() {
        // "a b c d" then "x a b" → after "a b" came "c d x a b" (the latest occurrence ending before the tail).
        let history = [1, 2, 3, 4, 9, 1, 2];
        assert_eq!(prompt_lookup(&history, 3), vec![3, 4, 9]);
        assert_eq!(prompt_lookup(&history, 10), vec![3, 4, 9, 1, 2]);
        // The longer match wins over a later shorter one: "7 1 2" occurred once, "1 2" later too.
        let history = [7, 1, 2, 5, 6, 1, 2, 8, 8, 7, 1, 2];
        assert_eq!(prompt_lookup(&history, 2), vec![5, 6]);
        // Nothing repeated: no draft; a single-token match is not enough.
        assert!(prompt_lookup(&[1, 2, 3, 4], 4).is_empty());
        assert!(prompt_lookup(&[5, 1, 6, 1], 4).is_empty());
        assert!(prompt_lookup(&[1], 4).is_empty());
        assert!(prompt_lookup(&[1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn auto_pauses_a_request_whose_drafts_are_rejected_and_tries_again() {
        let mut p = SpeculationPolicy::new(Speculation::Auto, 8);
        assert_eq!(p.budget(0.2), 8);
        for _ in 0..6 {
            p.record(8, 0);
        }
        assert_eq!(p.budget(0.2), 0, "nothing accepted: drafting stops");
        let paused = (0..100).take_while(|_| p.budget(0.2) == 0).count();
        assert_eq!(paused as u32, PAUSE_STEPS, "then it tries again after the pause");
        // A request that keeps most of its drafts keeps drafting: all it may where rows are cheap, fewer
        // where they cost more; and so does one under `on`.
        let mut p = SpeculationPolicy::new(Speculation::Auto, 8);
        (0..10).for_each(|_| p.record(8, 6));
        assert_eq!(p.budget(0.01), 8);
        let fewer = p.budget(0.3);
        assert!((1..8).contains(&fewer), "{fewer}");
        let mut on = SpeculationPolicy::new(Speculation::On, 8);
        (0..10).for_each(|_| on.record(8, 0));
        assert_eq!(on.budget(0.2), 8);
        assert_eq!(SpeculationPolicy::new(Speculation::Off, 8).budget(0.0), 0);
    }

    #[test]
    fn the_best_length_weighs_the_chance_of_keeping_against_the_cost() {
        // Free rows: draft all; every draft kept: draft all while a row costs less than a step.
        assert_eq!(best_draft_length(0.5, 0.0, 8).0, 8);
        assert_eq!(best_draft_length(1.0, 0.5, 8), (8, 9.0 / 5.0));
        // Half kept at 0.3 a row: one draft gives 1.5 tokens for 1.3 (1.15), two 1.75 for 1.6 (1.09).
        let (length, gain) = best_draft_length(0.5, 0.3, 8);
        assert_eq!(length, 1);
        assert!((gain - 1.5 / 1.3).abs() < 1e-9);
        // Rarely kept, or rows as dear as steps: no length gains.
        assert_eq!(best_draft_length(0.1, 0.2, 8), (0, 1.0));
        assert_eq!(best_draft_length(0.9, 1.0, 8), (0, 1.0));
    }

    #[test]
    fn the_cost_of_a_drafted_row_is_measured_from_the_steps() {
        let mut cost = DraftCost::default();
        assert_eq!(cost.relative(), ASSUMED_COST, "nothing measured yet");
        // Always one size: nothing to fit.
        (0..5).for_each(|_| cost.record(1, 4, Duration::from_millis(12)));
        assert_eq!(cost.relative(), ASSUMED_COST);
        // One row: 10 ms; with 8 drafted: 14 ms; two requests and 3 drafted: 12 ms → 0.5 ms a row, 5% of a
        // step of one row.
        for _ in 0..20 {
            cost.record(1, 0, Duration::from_millis(10));
            cost.record(1, 8, Duration::from_millis(14));
            cost.record(2, 3, Duration::from_millis(12));
        }
        assert!((cost.relative() - 0.05).abs() < 1e-6, "{}", cost.relative());
    }

    #[test]
    fn the_speedup_counts_the_steps_saved_against_the_rows_paid() {
        // 600 tokens, 300 of them kept drafts: 300 steps, plus 400 drafted rows at 0.25 of a step.
        assert!((estimated_speedup(600, 400, 300, 0.25) - 1.5).abs() < 1e-9);
        assert_eq!(estimated_speedup(10, 0, 0, 0.5), 1.0, "nothing drafted");
        assert_eq!(estimated_speedup(0, 0, 0, 0.5), 1.0);
    }
}
