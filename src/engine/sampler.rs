//! Choosing the next token from logits: the structured-output mask (when the request asks for JSON),
//! repetition penalty, then greedy, or top-k, top-p and min-p filtering with a temperature and a seeded
//! random draw — the order llama.cpp's default chain uses. Drafted tokens (speculative decoding) are
//! verified against the same distribution ([`Sampler::verify`]).

use super::constraint::{Constraint, OutputFormat};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// How to sample. These travel with a request to whichever stage samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 picks the most likely token (greedy); higher values flatten the distribution.
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the most likely tokens whose probabilities sum to at least p (1 = all).
    pub top_p: f32,
    /// Drop tokens less likely than min_p × the most likely one (0 = none).
    pub min_p: f32,
    /// Divide the logits of recently seen tokens by this (1 = off).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repeat_last_n: usize,
    /// Seed of the random draw: equal seeds give equal outputs.
    pub seed: u64,
    /// The shape the reply must have (JSON), enforced token by token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<OutputFormat>,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
            format: None,
        }
    }
}

impl SamplingParams {
    /// Checks ranges; the message names the parameter and its valid range.
    pub fn validate(&self) -> Result<(), String> {
        let check = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_string()) };
        check(self.temperature.is_finite() && self.temperature >= 0.0, "temperature must be 0 or more")?;
        check(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0, "top_p must be in (0, 1]")?;
        check(self.min_p.is_finite() && (0.0..=1.0).contains(&self.min_p), "min_p must be in [0, 1]")?;
        check(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0, "repeat_penalty must be above 0")?;
        self.format.as_ref().map_or(Ok(()), OutputFormat::check)
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    recent: VecDeque<u32>,
    candidates: Vec<(u32, f32)>,
    penalized: Vec<f32>,
    masked: Vec<f32>,
    constraint: Option<Constraint>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Sampler {
            params,
            rng,
            recent: VecDeque::new(),
            candidates: Vec::new(),
            penalized: Vec::new(),
            masked: Vec::new(),
            constraint: None,
        }
    }

    /// Constrains every token sampled from now on (structured output).
    pub fn constrain(&mut self, constraint: Constraint) {
        self.constraint = Some(constraint);
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a token of the context (prompt or generated) for the repetition penalty.
    pub fn accept(&mut self, token: u32) {
        if self.params.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Picks the next token from `logits` (one value per vocabulary entry).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_with(logits, None)
    }

    /// Verifies `drafts` against `logits`, one row of the vocabulary's width per draft and one after
    /// them (the rows of a step that fed the last token, then the drafts). Returns the tokens to emit,
    /// each already [accepted](Sampler::accept): the drafts it keeps, then one of its own — in place of
    /// the first draft it does not keep, or after them all.
    ///
    /// Greedy keeps a draft when it is the most likely token, so the tokens are those of decoding one at
    /// a time. Sampling keeps a draft with the probability the distribution gives it and otherwise draws
    /// from the distribution without it (speculative sampling's rule for a draft of certainty), so each
    /// emitted token follows the distribution sampling one at a time would draw from.
    pub fn verify(&mut self, logits: &[f32], vocabulary: usize, drafts: &[u32]) -> Vec<u32> {
        let mut out = Vec::with_capacity(drafts.len() + 1);
        for (i, row) in logits.chunks(vocabulary).take(drafts.len() + 1).enumerate() {
            let draft = drafts.get(i).copied();
            let token = self.sample_with(row, draft);
            self.accept(token);
            out.push(token);
            if draft != Some(token) {
                break;
            }
        }
        out
    }

    /// [`Sampler::sample`], keeping `draft` by the rule [`Sampler::verify`] describes.
    fn sample_with(&mut self, logits: &[f32], draft: Option<u32>) -> u32 {
        assert!(!logits.is_empty(), "no logits to sample from");
        let Some(mut constraint) = self.constraint.take() else { return self.sample_from(logits, draft) };
        let mut masked = std::mem::take(&mut self.masked);
        masked.clear();
        masked.extend_from_slice(logits);
        constraint.mask(&mut masked);
        let token = self.sample_from(&masked, draft);
        constraint.commit(token);
        (self.masked, self.constraint) = (masked, Some(constraint));
        token
    }

    fn sample_from(&mut self, logits: &[f32], draft: Option<u32>) -> u32 {
        let penalty = self.params.repeat_penalty;
        let logits = if penalty != 1.0 && !self.recent.is_empty() {
            penalize(logits, &self.recent, penalty, &mut self.penalized);
            &self.penalized[..]
        } else {
            logits
        };
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        draw(&self.params, &mut self.rng, &mut self.candidates, logits, draft)
    }
}

/// Copies `logits` into `out` with the logits of `recent` tokens moved toward zero by `penalty`
/// (divided when positive, multiplied when negative), once per distinct token.
fn penalize(logits: &[f32], recent: &VecDeque<u32>, penalty: f32, out: &mut Vec<f32>) {
    out.clear();
    out.extend_from_slice(logits);
    let mut seen: Vec<u32> = recent.iter().copied().collect();
    seen.sort_unstable();
    seen.dedup();
    for id in seen {
        if let Some(l) = out.get_mut(id as usize) {
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
    }
}

/// Filters the candidates with top-k, top-p and min-p (on probabilities at temperature 1), then draws
/// one with the temperature applied. With a draft: keeps it with its probability, else draws from the
/// others.
fn draw(
    p: &SamplingParams,
    rng: &mut ChaCha8Rng,
    cands: &mut Vec<(u32, f32)>,
    logits: &[f32],
    draft: Option<u32>,
) -> u32 {
    cands.clear();
    cands.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
    let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if p.top_k > 0 && p.top_k < cands.len() {
        cands.select_nth_unstable_by(p.top_k - 1, by_logit);
        cands.truncate(p.top_k);
    }
    cands.sort_unstable_by(by_logit);
    let max = cands[0].1;
    if p.top_p < 1.0 {
        let total: f32 = cands.iter().map(|c| (c.1 - max).exp()).sum();
        let mut cumulative = 0.0;
        let keep = cands
            .iter()
            .position(|c| {
                cumulative += (c.1 - max).exp() / total;
                cumulative >= p.top_p
            })
            .map_or(cands.len(), |i| i + 1);
        cands.truncate(keep);
    }
    if p.min_p > 0.0 {
        // p_i / p_max = exp(l_i - l_max)
        let floor = p.min_p.ln();
        let keep = cands.iter().take_while(|c| c.1 - max >= floor).count().max(1);
        cands.truncate(keep);
    }
    let weight = |c: &(u32, f32)| ((c.1 - max) / p.temperature).exp();
    let mut sum: f32 = cands.iter().map(weight).sum();
    if let Some(draft) = draft {
        let drafted = cands.iter().find(|c| c.0 == draft).map_or(0.0, weight);
        if rng.random::<f32>() * sum < drafted {
            return draft;
        }
        cands.retain(|c| c.0 != draft);
        if cands.is_empty() {
            return draft;
        }
        sum = cands.iter().map(weight).sum();
    }
    let mut point = rng.random::<f32>() * sum;
    for c in cands.iter() {
        let w = weight(c);
        if point < w {
            return c.0;
        }
        point -= w;
    }
    cands[cands.len() - 1].0
}

/// Index of the largest value (the first one on ties).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams { temperature, top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingParams::default() }
    }

    #[test]
    fn greedy_takes_the_largest_logit() {
        let mut s = Sampler::new(params(0.0));
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_draws_follow_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams { seed, ..params(1.0) });
            (0..4000).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let ones = draw(7).iter().filter(|&&t| t == 1).count() as f32 / 4000.0;
        assert!((ones - 0.75).abs() < 0.03, "token 1 drawn {ones} of the time, expected 0.75");
        assert!(!draw(7).contains(&2), "a token with zero probability was drawn");
    }

    #[test]
    fn top_k_top_p_and_min_p_limit_the_candidates() {
        let logits = [4.0f32, 3.0, 2.0, 1.0, 0.0];
        let seen = |p: SamplingParams| {
            let mut s = Sampler::new(p);
            let mut ids: Vec<u32> = (0..2000).map(|_| s.sample(&logits)).collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        assert_eq!(seen(SamplingParams { top_k: 2, ..params(5.0) }), vec![0, 1]);
        // Probabilities ≈ 0.64, 0.24, 0.09, …: 0.64 + 0.24 reaches 0.85.
        assert_eq!(seen(SamplingParams { top_p: 0.85, ..params(5.0) }), vec![0, 1]);
        // min_p 0.3 keeps tokens at least 0.3 × as likely as the best: e^-1 ≈ 0.37 passes, e^-2 does not.
        assert_eq!(seen(SamplingParams { min_p: 0.3, ..params(5.0) }), vec![0, 1]);
    }

    #[test]
    fn repetition_penalty_pushes_seen_tokens_down() {
        let mut s = Sampler::new(SamplingParams { repeat_penalty: 2.0, ..params(0.0) });
        s.accept(0);
        // 3.0 / 2 = 1.5 < 2.0
        assert_eq!(s.sample(&[3.0, 2.0]), 1);
    }

    #[test]
    fn greedy_verification_keeps_the_drafts_argmax_agrees_with() {
        let mut s = Sampler::new(params(0.0));
        // Rows: argmax 1, then 2, then 0.
        let logits = [0.0, 5.0, 1.0, /**/ 0.0, 1.0, 5.0, /**/ 5.0, 1.0, 0.0];
        assert_eq!(s.verify(&logits, 3, &[1, 2]), vec![1, 2, 0], "both kept, then one more");
        assert_eq!(s.verify(&logits, 3, &[1, 0]), vec![1, 2], "the second replaced");
        assert_eq!(s.verify(&logits, 3, &[2, 2]), vec![1], "the first replaced");
        assert_eq!(s.verify(&logits[..3], 3, &[]), vec![1], "no drafts: one token");
    }

    /// The first emitted token of a verified draft follows the sampling distribution. 40,000 draws:
    /// a frequency's standard error is at most 0.0025, the bound 0.01 is four of them. A rule that
    /// redraws from the whole distribution after a rejection (a common mistake) gives the draft
    /// p + (1 − p)·p — 0.4375 here instead of 0.25 — far outside it.
    #[test]
    fn sampled_verification_follows_the_distribution() {
        // Probabilities 0.25, 0.5, 0.125, 0.125 at temperature 1.
        let logits = [0.5f32.ln(), 1.0f32.ln(), 0.25f32.ln(), 0.25f32.ln()];
        let row_after = [0.0f32; 4];
        let both = [&logits[..], &row_after[..]].concat();
        let expected = [0.25, 0.5, 0.125, 0.125];
        const DRAWS: usize = 40_000;
        const BOUND: f64 = 0.01;
        for draft in [0u32, 1, 2] {
            let mut s = Sampler::new(SamplingParams { seed: 11 + draft as u64, ..params(1.0) });
            let mut counts = [0usize; 4];
            for _ in 0..DRAWS {
                counts[s.verify(&both, 4, &[draft])[0] as usize] += 1;
            }
            for (token, &count) in counts.iter().enumerate() {
                let frequency = count as f64 / DRAWS as f64;
                assert!(
                    (frequency - expected[token]).abs() < BOUND,
                    "draft {draft}: token {token} emitted {frequency}, expected {}",
                    expected[token]
                );
            }
        }
        // The broken rule, with the same draws: the bound catches it.
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut redraw = Sampler::new(SamplingParams { seed: 6, ..params(1.0) });
        let kept = (0..DRAWS).filter(|_| rng.random::<f32>() < 0.25 || redraw.sample(&logits) == 0).count() as f64
            / DRAWS as f64;
        assert!((kept - 0.25).abs() > BOUND, "the broken rule gives the draft {kept}");
    }

    #[test]
    fn invalid_parameters_are_named() {
        let bad = SamplingParams { top_p: 0.0, ..SamplingParams::default() };
        assert!(bad.validate().unwrap_err().contains("top_p"));
        assert!(SamplingParams::default().validate().is_ok());
    }
}
