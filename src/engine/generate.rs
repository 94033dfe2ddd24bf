//! Generating a continuation: prompt processing in batches, then one token at a time, with sampling,
//! streaming-safe detokenization, stop strings, end-of-generation tokens and timing.

use super::pipeline::LocalPipeline;
use super::sampler::{Sampler, SamplingParams};
use super::stop::StopStrings;
use super::EngineError;
use crate::model::{TextStream, Tokenizer};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// What to generate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens (for benchmarks and comparisons).
    pub ignore_eos: bool,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// max_tokens reached, or the context is full.
    Length,
    /// A stop string or an end-of-generation token.
    Stop,
    /// The caller stopped it (for example, the client went away).
    Cancelled,
}

/// Counts and times of one generation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// From the start until the first generated token was known.
    pub time_to_first_token: Duration,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    pub finish_reason: FinishReason,
    /// The generated token ids.
    #[serde(skip)]
    pub tokens: Vec<u32>,
}

impl GenerationStats {
    pub fn prefill_tokens_per_second(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_time)
    }

    /// Decode rate over the tokens after the first (the first one's time is part of prefill).
    pub fn decode_tokens_per_second(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.decode_time)
    }
}

pub fn rate(tokens: usize, time: Duration) -> f64 {
    if time.is_zero() {
        0.0
    } else {
        tokens as f64 / time.as_secs_f64()
    }
}

/// Turns generated token ids into text for the client: detokenizes without splitting characters, holds
/// back possible stop strings, and decides when generation is over.
pub struct TokenStream {
    text: TextStream,
    stops: StopStrings,
    bytes: Vec<u8>,
    ignore_eos: bool,
}

impl TokenStream {
    pub fn new(stop: &[String], ignore_eos: bool) -> TokenStream {
        TokenStream { text: TextStream::default(), stops: StopStrings::new(stop), bytes: Vec::new(), ignore_eos }
    }

    /// Takes the next token; returns the text to show now and whether generation must stop here.
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> (String, bool) {
        if !self.ignore_eos && tokenizer.is_end_of_generation(token) {
            return (self.finish(), true);
        }
        self.bytes.clear();
        tokenizer.token_bytes(token, &mut self.bytes);
        let text = self.text.push(&self.bytes);
        self.stops.push(&text)
    }

    /// The stop string that ended generation, if one did.
    pub fn stop_sequence(&self) -> Option<&str> {
        self.stops.matched()
    }

    /// Text still held at the end.
    pub fn finish(&mut self) -> String {
        let tail = self.text.finish();
        let (mut shown, stopped) = self.stops.push(&tail);
        if !stopped {
            shown.push_str(&self.stops.finish());
        }
        shown
    }
}

/// Generates a continuation of `request.prompt` on `pipeline` (sequence 0, from an empty cache).
/// `on_text` receives each piece of text as soon as it is final; returning `false` cancels.
pub fn generate(
    pipeline: &mut LocalPipeline,
    tokenizer: &Tokenizer,
    request: &GenerateRequest,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats, EngineError> {
    request.sampling.validate().map_err(EngineError::BadInput)?;
    if request.sampling.format.is_some() {
        return Err(EngineError::BadInput("structured output is served by a node's API, not here".into()));
    }
    let prompt = &request.prompt;
    if prompt.is_empty() {
        return Err(EngineError::BadInput("the prompt is empty".into()));
    }
    let context = pipeline.context();
    if prompt.len() >= context {
        return Err(EngineError::ContextFull { needed: prompt.len() + 1, context });
    }
    let started = Instant::now();
    let mut sampler = Sampler::new(request.sampling.clone());
    prompt.iter().for_each(|&t| sampler.accept(t));
    pipeline.truncate(0, 0);
    let mut pos = 0;
    for chunk in prompt.chunks(pipeline.batch()) {
        pipeline.forward(0, pos, chunk)?;
        pos += chunk.len();
    }
    let prefill_time = started.elapsed();
    let mut stream = TokenStream::new(&request.stop, request.ignore_eos);
    let mut tokens = Vec::with_capacity(request.max_tokens);
    let mut time_to_first_token = Duration::ZERO;
    let mut finish_reason = FinishReason::Length;
    let mut logits_ready = true;
    while tokens.len() < request.max_tokens {
        if !logits_ready {
            if pos >= context {
                break;
            }
            let last = *tokens.last().expect("a token was generated");
            pipeline.forward(0, pos, &[last])?;
            pos += 1;
        }
        let next = sampler.sample(pipeline.stages().last().expect("a pipeline has stages").last_output());
        sampler.accept(next);
        tokens.push(next);
        if tokens.len() == 1 {
            time_to_first_token = started.elapsed();
        }
        let (text, stop) = stream.push(tokenizer, next);
        if !text.is_empty() && !on_text(&text) {
            finish_reason = FinishReason::Cancelled;
            break;
        }
        if stop {
            finish_reason = FinishReason::Stop;
            break;
        }
        logits_ready = false;
    }
    if finish_reason != FinishReason::Stop {
        let tail = stream.finish();
        if !tail.is_empty() {
            on_text(&tail);
        }
    }
    let decode_time = started.elapsed().saturating_sub(time_to_first_token);
    Ok(GenerationStats {
        prompt_tokens: prompt.len(),
        generated_tokens: tokens.len(),
        time_to_first_token,
        prefill_time,
        decode_time: if tokens.is_empty() { Duration::ZERO } else { decode_time },
        finish_reason,
        tokens,
    })
}
