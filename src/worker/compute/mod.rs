//! A worker's compute thread: it owns the stage and runs it one batched step at a time. Stage 0
//! ([`head`]) admits requests into KV slots (queueing the rest), tokenizes, and runs every step as one
//! batch of all the requests that have something to run ([`schedule`]): new prompts in chunks beside
//! the others' decode rows, a decoding request's row followed by the tokens it drafts from its history
//! (speculative decoding, see [`engine::prompt_lookup`]). It turns returning tokens into text and
//! decides when a request ends. The stages after it run each step they receive as the batch it is and
//! pass its hidden states on; the last stage samples each request's token with that request's own
//! sampler, verifying its drafts (sent ahead of the step in a `Draft` frame) and returning the ones it
//! keeps and one more. Several steps are in the
//! ring at once, so that no stage waits.

mod head;
mod prefix_index;
mod prefix_store;
mod prompt_cache;
mod saved_prefixes;
mod schedule;

pub use head::Head;
pub use prefix_index::PrefixIndex;
pub use prefix_store::{identity as prefix_identity, key_of as prefix_key, Budget, PrefixDisk, PrefixStore};
pub use prompt_cache::Reuse;

use super::protocol::{FrontEvent, FrontRequest, StageStats};
use crate::engine::{self, HiddenStates, Sampler, Segment, Stage, StageInput, WireFormat};
use crate::transport::{FrameSink, FrameSource, Records, RingFrame, Sampled, StepRows};
use crate::util::LockExt;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, TryRecvError};
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
    /// The worker is stopping: save what the prompt cache has not saved yet, then answer.
    Flush(std::sync::mpsc::Sender<()>),
}

/// How long stage 0 idles before it saves the slots whose requests ended.
const SAVE_WHEN_IDLE: Duration = Duration::from_millis(500);
/// How long a stopping worker waits for its saved prefixes to reach the disk.
pub const FLUSH_AT_STOP: Duration = Duration::from_millis(700);

pub struct Compute {
    pub stage: Stage,
    pub stages: usize,
    pub head: Option<Head>,
    /// The next stage (none on a single-stage instance).
    sink: Option<Box<dyn FrameSink>>,
    /// Buffers of processed frames, back to the reader thread (stage 0).
    pub recycle: Option<std::sync::mpsc::Sender<Vec<u8>>>,
    pub stats: Arc<Mutex<StageStats>>,
    /// The last stage's samplers, by slot.
    samplers: HashMap<u32, Sampler>,
    /// The last stage: drafts of the next step's rows, by slot.
    drafts: HashMap<u32, Vec<u32>>,
    /// Structured output's grammars, on the stage that samples.
    grammars: Option<engine::Grammars>,
    wire: Vec<u8>,
    frame: Vec<u8>,
    hidden: HiddenStates,
    // Reused for every step.
    segments: Vec<Segment>,
    rows: Vec<StepRows>,
    sampled: Vec<Sampled>,
    /// Set when writing to the next stage failed.
    broken: Option<String>,
    /// This stage's saved prefixes (none where it cannot save them).
    prefixes: Option<prefix_store::PrefixStore>,
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
            drafts: HashMap::new(),
            grammars,
            wire: Vec::new(),
            frame: Vec::new(),
            hidden: HiddenStates::default(),
            segments: Vec::new(),
            rows: Vec::new(),
            sampled: Vec::new(),
            broken: None,
            prefixes: None,
        }
    }

    /// With a store of saved prefixes (the prompt cache beyond the slots).
    pub fn with_prefix_store(mut self, store: prefix_store::PrefixStore) -> Compute {
        self.prefixes = Some(store);
        self
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

    /// Stage 0: takes in all the work that has arrived (requests, cancellations, frames its reader
    /// thread received), then runs one batched step of whatever the requests have to run, and again,
    /// until the ring breaks or every sender is gone; returns why it stopped.
    pub fn run(mut self, work: Receiver<Work>) -> String {
        loop {
            let item = if self.has_step() {
                match work.try_recv() {
                    Ok(item) => Some(item),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => return "stopped".into(),
                }
            } else if self.has_unsaved() {
                match work.recv_timeout(SAVE_WHEN_IDLE) {
                    Ok(item) => Some(item),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        self.save_idle();
                        continue;
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return "stopped".into(),
                }
            } else {
                match work.recv() {
                    Ok(item) => Some(item),
                    Err(_) => return "stopped".into(),
                }
            };
            match item {
                Some(Work::Frame(buf)) => {
                    self.on_frame(&buf);
                    if let Some(r) = &self.recycle {
                        let _ = r.send(buf);
                    }
                }
                Some(Work::Request { id, request, events }) => self.on_request(id, *request, events),
                Some(Work::Cancel { id }) => self.on_cancel(id),
                Some(Work::Flush(done)) => {
                    self.flush_saved(FLUSH_AT_STOP);
                    let _ = done.send(());
                }
                Some(Work::RingBroken(reason)) => {
                    self.fail_all(&format!("the instance lost a stage: {reason}"));
                    return reason;
                }
                None => self.step_at_head(),
            }
            if let Some(reason) = self.broken.take() {
                self.fail_all(&format!("the instance lost a stage: {reason}"));
                return reason;
            }
        }
    }

    fn send(&mut self, frame: &RingFrame<'_>) {
        let Some(sink) = self.sink.as_mut() else { return };
        frame.encode(&mut self.frame);
        if let Err(e) = sink.send(&self.frame) {
            self.broken.get_or_insert(format!("the next stage is gone ({e})"));
        }
    }

    fn record_step(&self, tokens: usize, compute: Duration) {
        let sum_p50 = || self.stage.group().and_then(|g| g.sum_p50());
        self.stats.locked().record_step(tokens, self.segments.len(), compute, sum_p50);
    }

    /// Runs this stage on the step in `self.segments` (the output stays in the stage); returns the time
    /// it took.
    fn step(&mut self, input: StageInput<'_>) -> Result<Duration, engine::EngineError> {
        let tokens = self.segments.iter().map(|s| s.tokens).sum();
        let t = Instant::now();
        self.stage.forward_batch(&self.segments, input)?;
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

    /// Encodes this stage's output (hidden states of every row) into `self.wire`.
    fn encode_output(&mut self) {
        let out = self.stage.last_output();
        let width = self.stage.config().hidden_width(self.stage.layers().end);
        HiddenStates::encode(width, out.len() / width, out, WireFormat::F32, &mut self.wire);
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
                self.drafts.remove(&slot);
            }
            // Kept for the step that follows; only for slots this stage has (a frame cannot grow the map).
            RingFrame::Draft { slot, tokens, .. } if last => {
                if (slot as usize) < self.stage.options().sequences {
                    self.drafts.insert(slot, tokens);
                }
            }
            RingFrame::Forward { rows, compute_us, hidden } => self.on_step(rows, compute_us, hidden),
            RingFrame::Prefix { request, slot, op } => self.on_prefix(request, slot, op),
            // Begin and End pass through the middle; Failed and Tokens travel on to stage 0.
            other => self.send(&other),
        }
    }

    /// A step from the previous stage: run it, then pass its hidden states on or, on the last stage,
    /// sample a token for each request that asks and send them back.
    fn on_step(&mut self, rows: Records<'_, StepRows>, compute_us: u32, hidden: &[u8]) {
        self.segments.clear();
        self.segments.extend(rows.iter().map(|r| Segment {
            seq: r.slot as usize,
            start: r.start as usize,
            tokens: r.tokens as usize,
            logits: r.sample,
            drafted: r.drafted as usize,
        }));
        let decoded = self.hidden.decode_from(hidden).map_err(|e| e.to_string());
        let values = std::mem::take(&mut self.hidden.values);
        let result = decoded.and_then(|_| {
            self.step(StageInput::Hidden { values: &values, tokens: self.hidden.tokens }).map_err(|e| e.to_string())
        });
        self.hidden.values = values;
        let took = match result {
            Ok(took) => took,
            Err(message) => {
                for r in rows.iter() {
                    self.send(&RingFrame::Failed { request: r.request, slot: r.slot, message: message.clone() });
                }
                return;
            }
        };
        let compute_us = compute_us.saturating_add(took.as_micros() as u32);
        if !self.stage.is_last() {
            self.encode_output();
            let wire = std::mem::take(&mut self.wire);
            self.send(&RingFrame::Forward { rows, compute_us, hidden: &wire });
            self.wire = wire;
            return;
        }
        let vocabulary = self.stage.config().vocabulary;
        let mut sampled = std::mem::take(&mut self.sampled);
        sampled.clear();
        let mut missing = Vec::new();
        let mut logits = self.stage.last_output();
        for r in rows.iter().filter(|r| r.sample) {
            // The stage gave each sampling row its drafts' rows too; a shorter output is a broken step.
            let Some((own, rest)) = logits.split_at_checked((r.drafted as usize + 1) * vocabulary) else {
                missing.push((r, "the step gave no logits for these rows".into()));
                continue;
            };
            logits = rest;
            let drafts = self.drafts.remove(&r.slot).unwrap_or_default();
            match self.samplers.get_mut(&r.slot) {
                Some(_) if drafts.len() != r.drafted as usize => {
                    missing.push((r, format!("{} drafted tokens arrived for rows of {}", drafts.len(), r.drafted)))
                }
                Some(sampler) => {
                    sampled.extend(sampler.verify(own, vocabulary, &drafts).into_iter().map(|token| Sampled {
                        request: r.request,
                        slot: r.slot,
                        token,
                    }))
                }
                None => missing.push((r, "no sampler for this request".into())),
            }
        }
        for (r, message) in missing {
            self.send(&RingFrame::Failed { request: r.request, slot: r.slot, message });
        }
        if !sampled.is_empty() {
            self.send(&RingFrame::Tokens { tokens: Records::Items(&sampled), compute_us });
        }
        self.sampled = sampled;
    }
}
