//! A worker's compute thread: it owns the stage and handles, in arrival order, frames from the previous
//! stage and (on stage 0) requests from clients. Stage 0 schedules requests onto KV slots, tokenizes,
//! processes prompts in batches, turns returning tokens into text and decides when a request ends; the
//! last stage samples; stages in between run their layers and pass the hidden states on. Several
//! requests can be in the ring at once, each in its own slot, so no stage has to wait for one request.

use super::protocol::{FrontEvent, FrontRequest, GenerationReport, PromptInput, StageStats};
use crate::engine::{self, FinishReason, HiddenStates, Sampler, Stage, StageInput, TokenStream, WireFormat};
use crate::links::RttWindow;
use crate::model::{ChatTemplate, ModelError, ReplyFormat, Tokenizer};
use crate::transport::{FrameSink, FrameSource, RingFrame};
use crate::util::LockExt;
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

pub enum Work {
    /// A frame from the previous stage (its buffer goes back to the reader afterwards).
    Frame(Vec<u8>),
    Request {
        id: u64,
        /// Boxed: a request is far larger than the other kinds of work.
        request: Box<FrontRequest>,
        events: UnboundedSender<FrontEvent>,
    },
    /// The client went away.
    Cancel { id: u64 },
    /// The ring is broken: fail everything and stop.
    RingBroken(String),
}

struct Active {
    slot: u32,
    events: UnboundedSender<FrontEvent>,
    stream: TokenStream,
    max_tokens: usize,
    generated: usize,
    /// The position the next token is fed at.
    pos: usize,
    prompt_tokens: usize,
    started: Instant,
    first_token: Option<Instant>,
    /// When the last decode step left this stage (for the hop time).
    sent_at: Option<Instant>,
    hops: RttWindow,
    /// Single-stage instances sample here.
    sampler: Option<Sampler>,
}

/// Stage 0's state.
pub struct Head {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    active: HashMap<u64, Active>,
    free_slots: Vec<u32>,
    waiting: VecDeque<(u64, FrontRequest, UnboundedSender<FrontEvent>)>,
    hops: RttWindow,
}

impl Head {
    pub fn new(tokenizer: Tokenizer, template: ChatTemplate, slots: usize) -> Head {
        Head {
            tokenizer,
            template,
            active: HashMap::new(),
            free_slots: (0..slots as u32).rev().collect(),
            waiting: VecDeque::new(),
            hops: RttWindow::default(),
        }
    }
}

pub struct Compute {
    pub stage: Stage,
    pub stages: usize,
    pub head: Option<Head>,
    /// The next stage (none on a single-stage instance).
    sink: Option<Box<dyn FrameSink>>,
    /// Buffers of processed frames, back to the reader thread (stage 0).
    pub recycle: Option<std::sync::mpsc::Sender<Vec<u8>>>,
    pub stats: Arc<Mutex<StageStats>>,
    samplers: HashMap<u32, Sampler>,
    /// Structured output's grammars, on the stage that samples.
    grammars: Option<engine::Grammars>,
    wire: Vec<u8>,
    frame: Vec<u8>,
    hidden: HiddenStates,
    /// Set when writing to the next stage failed.
    broken: Option<String>,
}

impl Compute {
    pub fn new(
        stage: Stage,
        stages: usize,
        head: Option<Head>,
        sink: Option<Box<dyn FrameSink>>,
        recycle: Option<std::sync::mpsc::Sender<Vec<u8>>>,
        stats: Arc<Mutex<StageStats>>,
        grammars: Option<engine::Grammars>,
    ) -> Compute {
        Compute {
            stage,
            stages,
            head,
            sink,
            recycle,
            stats,
            samplers: HashMap::new(),
            grammars,
            wire: Vec::new(),
            frame: Vec::new(),
            hidden: HiddenStates::default(),
            broken: None,
        }
    }

    /// Stages after the first: reads the previous stage's frames itself and handles them in order,
    /// until either neighbour is gone; returns why it stopped.
    pub fn run_relay(mut self, mut source: Box<dyn FrameSource>) -> String {
        let mut buf = Vec::new();
        loop {
            if let Err(e) = source.recv_into(&mut buf) {
                return format!("the previous stage is gone ({e})");
            }
            self.on_frame(&buf);
            if let Some(reason) = self.broken.take() {
                return reason;
            }
        }
    }

    /// Stage 0: handles work (requests, and frames its reader thread received) until the ring breaks or
    /// every sender is gone; returns why it stopped.
    pub fn run(mut self, work: Receiver<Work>) -> String {
        while let Ok(item) = work.recv() {
            match item {
                Work::Frame(buf) => {
                    self.on_frame(&buf);
                    if let Some(r) = &self.recycle {
                        let _ = r.send(buf);
                    }
                }
                Work::Request { id, request, events } => self.on_request(id, *request, events),
                Work::Cancel { id } => self.on_cancel(id),
                Work::RingBroken(reason) => {
                    self.fail_all(&format!("the instance lost a stage: {reason}"));
                    return reason;
                }
            }
            if let Some(reason) = self.broken.take() {
                self.fail_all(&format!("the instance lost a stage: {reason}"));
                return reason;
            }
        }
        "stopped".into()
    }

    fn send(&mut self, frame: &RingFrame<'_>) {
        let Some(sink) = self.sink.as_mut() else { return };
        frame.encode(&mut self.frame);
        if let Err(e) = sink.send(&self.frame) {
            self.broken.get_or_insert(format!("the next stage is gone ({e})"));
        }
    }

    fn record_step(&self, tokens: usize, compute: Duration) {
        let mut s = self.stats.locked();
        s.steps += 1;
        s.tokens += tokens as u64;
        s.compute_us_total += compute.as_micros() as u64;
    }

    /// Runs this stage on a step (the output stays in the stage); returns the time it took.
    fn step(&mut self, slot: u32, start: usize, input: StageInput<'_>) -> Result<Duration, engine::EngineError> {
        let tokens = match &input {
            StageInput::Tokens(t) => t.len(),
            StageInput::Hidden { tokens, .. } => *tokens,
        };
        let t = Instant::now();
        self.stage.forward(slot as usize, start, input)?;
        let took = t.elapsed();
        self.record_step(tokens, took);
        Ok(took)
    }

    /// A sampler for a request, constrained when it asks for structured output.
    fn sampler(&mut self, sampling: &engine::SamplingParams) -> Result<Sampler, String> {
        let mut sampler = Sampler::new(sampling.clone());
        if let Some(format) = &sampling.format {
            let grammars = self.grammars.as_mut().ok_or("this stage cannot constrain its output")?;
            sampler.constrain(grammars.constraint(format)?);
        }
        Ok(sampler)
    }

    // ---- every stage but the first ----

    fn on_frame(&mut self, bytes: &[u8]) {
        let frame = match RingFrame::decode(bytes) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!("malformed frame from the previous stage: {e}");
                return;
            }
        };
        if self.head.is_some() {
            return self.on_frame_at_head(frame);
        }
        let last = self.stage.is_last();
        match frame {
            RingFrame::Begin { request, slot, ref sampling, ref recent } if last => match self.sampler(sampling) {
                Ok(mut sampler) => {
                    recent.iter().for_each(|&t| sampler.accept(t));
                    self.samplers.insert(slot, sampler);
                }
                Err(message) => self.send(&RingFrame::Failed { request, slot, message }),
            },
            RingFrame::End { slot, .. } if last => {
                self.samplers.remove(&slot);
            }
            RingFrame::Forward { request, slot, start, tokens, sample, compute_us, hidden } => {
                if let Err(e) = self.hidden.decode_from(hidden) {
                    self.send(&RingFrame::Failed { request, slot, message: e.to_string() });
                    return;
                }
                let values = std::mem::take(&mut self.hidden.values);
                let result =
                    self.step(slot, start as usize, StageInput::Hidden { values: &values, tokens: tokens as usize });
                self.hidden.values = values;
                let took = match result {
                    Ok(took) => took,
                    Err(e) => {
                        self.send(&RingFrame::Failed { request, slot, message: e.to_string() });
                        return;
                    }
                };
                let compute_us = compute_us.saturating_add(took.as_micros() as u32);
                if last {
                    if sample {
                        let Some(sampler) = self.samplers.get_mut(&slot) else {
                            self.send(&RingFrame::Failed {
                                request,
                                slot,
                                message: "no sampler for this request".into(),
                            });
                            return;
                        };
                        let token = sampler.sample(self.stage.last_output());
                        sampler.accept(token);
                        self.send(&RingFrame::Token { request, slot, token, compute_us });
                    }
                } else {
                    let out = self.stage.last_output();
                    let width = self.stage.config().embedding;
                    HiddenStates::encode(width, out.len() / width, out, WireFormat::F32, &mut self.wire);
                    let wire = std::mem::take(&mut self.wire);
                    self.send(&RingFrame::Forward { request, slot, start, tokens, sample, compute_us, hidden: &wire });
                    self.wire = wire;
                }
            }
            // Begin and End pass through the middle; Failed travels on to stage 0.
            other => self.send(&other),
        }
    }

    // ---- stage 0 ----

    fn on_frame_at_head(&mut self, frame: RingFrame<'_>) {
        match frame {
            RingFrame::Token { request, token, compute_us, .. } => self.on_token(request, token, Some(compute_us)),
            RingFrame::Failed { request, message, .. } => self.finish(request, Err(message)),
            other => tracing::debug!("stage 0 ignores a returning {:?} frame", other.request()),
        }
    }

    fn on_request(&mut self, id: u64, request: FrontRequest, events: UnboundedSender<FrontEvent>) {
        let head = self.head.as_mut().expect("requests go to stage 0");
        match head.free_slots.pop() {
            Some(slot) => self.start(id, slot, request, events),
            None => head.waiting.push_back((id, request, events)),
        }
    }

    fn reject(events: &UnboundedSender<FrontEvent>, message: String) {
        let _ = events.send(FrontEvent::Error { message, client_error: true });
    }

    fn start(&mut self, id: u64, slot: u32, request: FrontRequest, events: UnboundedSender<FrontEvent>) {
        let context = self.stage.context();
        let single = self.stages == 1;
        // Validated once (a format's schema is compiled to check it); single-stage instances sample here.
        let valid = request.sampling.validate();
        let sampler = single.then(|| valid.clone().and_then(|_| self.sampler(&request.sampling)));
        let head = self.head.as_mut().expect("stage 0");
        let encode = |text: &str| head.tokenizer.encode(text).map_err(|e| e.to_string());
        let mut reply = ReplyFormat::Plain;
        let mut templated = |rendered: Result<String, ModelError>| {
            let text = rendered.map_err(|e| e.to_string())?;
            reply = head.template.reply_format(&text);
            encode(&text)
        };
        let prompt = match &request.prompt {
            PromptInput::Text(t) => encode(t),
            PromptInput::Messages(m) => templated(head.template.render(m)),
            PromptInput::Conversation { messages, tools, variables } => {
                templated(head.template.render_conversation(messages, tools, variables))
            }
            PromptInput::Tokens(t) => Ok(t.clone()),
        };
        let vocabulary = head.tokenizer.vocabulary_size();
        let prompt = match prompt {
            Ok(p) if p.is_empty() => Err("the prompt is empty".to_string()),
            Ok(p) if p.len() >= context => {
                Err(format!("the prompt is {} tokens but the instance's context holds {context}; shorten it", p.len()))
            }
            Ok(p) if p.iter().any(|&t| t as usize >= vocabulary) => {
                Err("a prompt token is outside the vocabulary".into())
            }
            Ok(p) => Ok(p),
            Err(e) => Err(e),
        };
        let prompt = match prompt.and_then(|p| valid.map(|_| p)) {
            Ok(p) => p,
            Err(message) => {
                Self::reject(&events, message);
                head.free_slots.push(slot);
                return self.start_waiting();
            }
        };
        let mut sampler = match sampler.transpose() {
            Ok(sampler) => sampler,
            Err(message) => {
                Self::reject(&events, message);
                head.free_slots.push(slot);
                return self.start_waiting();
            }
        };
        let _ = events.send(FrontEvent::Started { prompt_tokens: prompt.len(), reply });
        if let Some(s) = sampler.as_mut() {
            prompt.iter().for_each(|&t| s.accept(t));
        }
        let recent_from = prompt.len().saturating_sub(request.sampling.repeat_last_n);
        head.active.insert(
            id,
            Active {
                slot,
                events,
                stream: TokenStream::new(&request.stop, request.ignore_eos),
                max_tokens: request.max_tokens,
                generated: 0,
                pos: prompt.len(),
                prompt_tokens: prompt.len(),
                started: Instant::now(),
                first_token: None,
                sent_at: None,
                hops: RttWindow::default(),
                sampler,
            },
        );
        self.stats.locked().active_requests = head.active.len();
        if request.max_tokens == 0 {
            return self.finish(id, Ok(FinishReason::Length));
        }
        if !single {
            self.send(&RingFrame::Begin {
                request: id,
                slot,
                sampling: request.sampling.clone(),
                recent: prompt[recent_from..].to_vec(),
            });
        }
        let batch = self.stage.options().batch;
        let chunks: Vec<&[u32]> = prompt.chunks(batch).collect();
        let mut pos = 0;
        for (i, chunk) in chunks.iter().enumerate() {
            let last_chunk = i + 1 == chunks.len();
            if let Err(e) = self.step(slot, pos, StageInput::Tokens(chunk)) {
                return self.finish(id, Err(e.to_string()));
            }
            if !single {
                self.forward_hidden(id, slot, pos, chunk.len(), last_chunk);
            }
            pos += chunk.len();
        }
        if single {
            self.sample_locally(id);
        }
    }

    fn forward_hidden(&mut self, request: u64, slot: u32, start: usize, tokens: usize, sample: bool) {
        let out = self.stage.last_output();
        let width = self.stage.config().embedding;
        HiddenStates::encode(width, out.len() / width, out, WireFormat::F32, &mut self.wire);
        let wire = std::mem::take(&mut self.wire);
        // Stamped before the write: on a busy machine the next stage may run before the write returns.
        if sample {
            if let Some(a) = self.head.as_mut().and_then(|h| h.active.get_mut(&request)) {
                a.sent_at = Some(Instant::now());
            }
        }
        let frame = RingFrame::Forward {
            request,
            slot,
            start: start as u32,
            tokens: tokens as u32,
            sample,
            compute_us: 0,
            hidden: &wire,
        };
        self.send(&frame);
        self.wire = wire;
    }

    /// Single-stage instances: sample from this stage's logits and go on.
    fn sample_locally(&mut self, id: u64) {
        let Some(active) = self.head.as_mut().and_then(|h| h.active.get_mut(&id)) else { return };
        let Some(sampler) = active.sampler.as_mut() else { return };
        let token = sampler.sample(self.stage.last_output());
        sampler.accept(token);
        self.on_token(id, token, None);
    }

    fn on_token(&mut self, id: u64, token: u32, others_us: Option<u32>) {
        let stages = self.stages as u64;
        let context = self.stage.context();
        let Some(head) = self.head.as_mut() else { return };
        let Some(a) = head.active.get_mut(&id) else { return };
        let now = Instant::now();
        a.first_token.get_or_insert(now);
        if let (Some(sent), Some(others)) = (a.sent_at.take(), others_us) {
            // The ring time of a decode step, less the other stages' compute, shared by the hops.
            let ring_us = now.duration_since(sent).as_micros() as u64;
            let hop = Duration::from_micros(ring_us.saturating_sub(others as u64) / stages.max(1));
            a.hops.record(hop);
            head.hops.record(hop);
        }
        a.generated += 1;
        let (text, stop) = a.stream.push(&head.tokenizer, token);
        if !text.is_empty() && a.events.send(FrontEvent::Text { text }).is_err() {
            return self.finish(id, Ok(FinishReason::Cancelled));
        }
        if stop {
            return self.finish(id, Ok(FinishReason::Stop));
        }
        if a.generated >= a.max_tokens || a.pos + 1 > context {
            return self.finish(id, Ok(FinishReason::Length));
        }
        let (slot, pos) = (a.slot, a.pos);
        a.pos += 1;
        if let Err(e) = self.step(slot, pos, StageInput::Tokens(&[token])) {
            return self.finish(id, Err(e.to_string()));
        }
        if self.stages == 1 {
            self.sample_locally(id);
        } else {
            self.forward_hidden(id, slot, pos, 1, true);
        }
    }

    fn on_cancel(&mut self, id: u64) {
        let Some(head) = self.head.as_mut() else { return };
        head.waiting.retain(|(w, _, _)| *w != id);
        if head.active.contains_key(&id) {
            self.finish(id, Ok(FinishReason::Cancelled));
        }
    }

    /// Ends request `id`: the last text and the report (or the error) to the client, the slot freed
    /// along the ring, and the next waiting request started.
    fn finish(&mut self, id: u64, outcome: Result<FinishReason, String>) {
        let stages = self.stages;
        let Some(head) = self.head.as_mut() else { return };
        let Some(mut a) = head.active.remove(&id) else { return };
        head.free_slots.push(a.slot);
        match outcome {
            Ok(reason) => {
                if reason != FinishReason::Stop {
                    let tail = a.stream.finish();
                    if !tail.is_empty() {
                        let _ = a.events.send(FrontEvent::Text { text: tail });
                    }
                }
                let now = Instant::now();
                // The prompt is processed when the first token comes back from the last stage.
                let ttft = a.first_token.unwrap_or(now).duration_since(a.started);
                // Without a token back, the prompt was not run (max_tokens 0): no rate to report.
                let prefill = if a.first_token.is_some() { ttft } else { Duration::ZERO };
                let decode = now.duration_since(a.first_token.unwrap_or(now));
                let report = GenerationReport {
                    prompt_tokens: a.prompt_tokens,
                    generated_tokens: a.generated,
                    time_to_first_token_ms: ttft.as_secs_f64() * 1000.0,
                    prefill_tokens_per_second: engine::rate(a.prompt_tokens, prefill),
                    decode_tokens_per_second: engine::rate(a.generated.saturating_sub(1), decode),
                    hop_p50_us: a.hops.quantile(0.5).map(|d| d.as_micros() as u64),
                    stop_sequence: a.stream.stop_sequence().map(str::to_string),
                };
                let _ = a.events.send(FrontEvent::Done { finish_reason: reason, report });
            }
            Err(message) => {
                let _ = a.events.send(FrontEvent::Error { message, client_error: false });
            }
        }
        {
            let mut s = self.stats.locked();
            s.requests += 1;
            s.generated_tokens += a.generated as u64;
            s.active_requests = head.active.len();
            s.hop_p50_us = head.hops.quantile(0.5).map(|d| d.as_micros() as u64);
            s.hop_p99_us = head.hops.quantile(0.99).map(|d| d.as_micros() as u64);
        }
        if stages > 1 {
            self.send(&RingFrame::End { request: id, slot: a.slot });
        }
        self.start_waiting();
    }

    fn start_waiting(&mut self) {
        let Some(head) = self.head.as_mut() else { return };
        if head.free_slots.is_empty() {
            return;
        }
        if let Some((id, request, events)) = head.waiting.pop_front() {
            let slot = head.free_slots.pop().expect("checked");
            self.start(id, slot, request, events);
        }
    }

    fn fail_all(&mut self, message: &str) {
        let Some(head) = self.head.as_mut() else { return };
        let ids: Vec<u64> = head.active.keys().copied().collect();
        for (_, _, events) in head.waiting.drain(..) {
            let _ = events.send(FrontEvent::Error { message: message.to_string(), client_error: false });
        }
        for id in ids {
            self.finish(id, Err(message.to_string()));
        }
    }
}
