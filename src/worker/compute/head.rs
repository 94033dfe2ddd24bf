//! Stage 0's side of the compute thread: requests are admitted into free KV slots in the order they
//! came (the others wait in a bounded queue; a request finding it full is refused at once as busy),
//! their prompts rendered and tokenized, and each step runs, as one batch, the rows the schedule picks
//! from every admitted request. Tokens coming back (or, on a one-stage instance, sampled here) become
//! text for the client, and each request ends on a stop, its length, the context's end, a
//! cancellation or a failure, freeing its slot for the next in the queue.

use super::prefix_index::PrefixIndex;
use super::prompt_cache::{Reuse, SlotHistory, CHECKPOINT_BEFORE_END};
use super::schedule::{self, Need};
use super::Compute;
use crate::engine::{
    self, CallStyle, DraftCost, FinishReason, OutputFormat, Sampler, Segment, Speculation, SpeculationPolicy,
    StageInput, TokenStream,
};
use crate::links::RttWindow;
use crate::model::{CallFormat, ChatTemplate, Literals, Markup, ModelError, ReplyFormat, Tokenizer};
use crate::transport::{PrefixOp, Records, RingFrame, Sampled, StepRows};
use crate::util::LockExt;
use crate::worker::protocol::{FrontEvent, FrontRequest, GenerationReport, PromptInput};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// Requests that may wait for a slot, per slot; one more is refused as busy.
pub const QUEUE_PER_SLOT: usize = 4;

pub(super) struct Active {
    id: u64,
    pub(super) slot: u32,
    events: UnboundedSender<FrontEvent>,
    stream: TokenStream,
    max_tokens: usize,
    generated: usize,
    pub(super) prompt: Vec<u32>,
    /// Prompt tokens already run (from the start: those the slot's cache gave back).
    pub(super) prefilled: usize,
    /// Prompt tokens the slot's cache or a saved prefix gave back (see [`super::prompt_cache`]).
    pub(super) cached: usize,
    /// A saved prefix is being written back into the slot along the ring: nothing runs until it is.
    pub(super) restoring: bool,
    /// The chunks the prompt is cut into.
    pub(super) chunk: usize,
    /// Where the prefill stops once before the prompt's end, for a hybrid model's stages to keep a
    /// checkpoint of the state there (see [`super::prompt_cache::CHECKPOINT_BEFORE_END`]).
    checkpoint_at: Option<usize>,
    /// The token to feed next, once sampled; none while its step is on the ring.
    next: Option<u32>,
    /// The position the next token is fed at.
    pos: usize,
    /// How long the request waited for its slot.
    queued: Duration,
    started: Instant,
    first_token: Option<Instant>,
    /// When its last decode row left this stage (for the hop time).
    sent_at: Option<Instant>,
    hops: RttWindow,
    /// Single-stage instances sample here.
    sampler: Option<Sampler>,
    /// The prompt and the tokens generated so far, where drafts are looked up.
    seen: Vec<u32>,
    /// The drafted tokens of its step on the ring (speculative decoding).
    drafts: Vec<u32>,
    policy: SpeculationPolicy,
    /// Tokens drafted and drafted tokens kept, over the request.
    drafted: usize,
    accepted: usize,
}

impl Active {
    fn need(&self) -> Need {
        if self.restoring {
            Need::Waiting
        } else if self.prefilled < self.prompt.len() {
            let end = self.checkpoint_at.filter(|&at| self.prefilled < at).unwrap_or(self.prompt.len());
            Need::Prefill { remaining: end - self.prefilled, chunk: self.chunk }
        } else if self.next.is_some() {
            Need::Decode
        } else {
            Need::Waiting
        }
    }
}

struct Waiting {
    id: u64,
    request: FrontRequest,
    events: UnboundedSender<FrontEvent>,
    since: Instant,
}

/// Stage 0's state.
pub struct Head {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// The vocabulary's markup, which a request's text may not produce (see [`Markup`]).
    markup: Markup,
    /// Admitted requests, oldest first.
    active: Vec<Active>,
    /// Free KV slots, highest first: a request takes the one whose cache holds the most of its prompt,
    /// else the lowest, so busy slots stay together and their decode rows attend as one batch (see
    /// `engine`'s attention runs).
    free_slots: Vec<u32>,
    /// What each slot's cache holds, for the prompt cache.
    pub(super) history: SlotHistory,
    /// The saved prefixes beyond the slots (none where the stages cannot save them).
    pub(super) saved: Option<PrefixIndex>,
    /// Slots whose last request ended and whose rows are not saved yet.
    pub(super) unsaved: Vec<bool>,
    waiting: VecDeque<Waiting>,
    queue_limit: usize,
    /// Whether prompts are cut into chunks that follow each other through the stages (else each runs
    /// in chunks of the whole batch); `SHOAL_PIPELINED_PREFILL=0` turns it off, to measure what it saves.
    pub(super) pipelined_prefill: bool,
    hops: RttWindow,
    /// Whether requests draft tokens (see [`engine::Speculation`], already off for a model with a
    /// recurrent state).
    speculation: Speculation,
    draft_tokens: usize,
    /// What a drafted row costs on this stage.
    draft_cost: DraftCost,
    // Reused for every step.
    needs: Vec<Need>,
    tokens: Vec<u32>,
    drafts: Vec<(u64, u32, Vec<u32>)>,
}

impl Head {
    pub fn new(tokenizer: Tokenizer, template: ChatTemplate, slots: usize, reuse: Reuse) -> Head {
        Head {
            history: SlotHistory::new(slots, reuse),
            saved: None,
            unsaved: vec![false; slots],
            markup: Markup::of(&tokenizer),
            tokenizer,
            template,
            active: Vec::new(),
            free_slots: (0..slots as u32).rev().collect(),
            waiting: VecDeque::new(),
            queue_limit: QUEUE_PER_SLOT * slots.max(1),
            pipelined_prefill: std::env::var("SHOAL_PIPELINED_PREFILL").map_or(true, |v| v != "0"),
            hops: RttWindow::default(),
            speculation: Speculation::Off,
            draft_tokens: 0,
            draft_cost: DraftCost::default(),
            needs: Vec::new(),
            tokens: Vec::new(),
            drafts: Vec::new(),
        }
    }

    /// Drafting `mode`, at most `draft_tokens` a step (see [`engine::Speculation`]).
    pub fn with_speculation(mut self, mode: Speculation, draft_tokens: usize) -> Head {
        self.speculation = mode;
        self.draft_tokens = draft_tokens.min(engine::MAX_DRAFT_TOKENS);
        self
    }

    /// Swaps `slot` (just taken) for the free slot whose cache holds the most of `prompt`; that slot and
    /// how many of the prompt's tokens it gives back.
    /// `checkpoints` tells the positions a slot's recurrent state can go back to.
    fn slot_for(&mut self, slot: u32, prompt: &[u32], checkpoints: impl Fn(u32) -> Vec<usize>) -> (u32, usize) {
        self.free_slot(slot);
        let (best, cached) = self.history.best(&self.free_slots, prompt, checkpoints).expect("a slot was just freed");
        self.free_slots.retain(|&s| s != best);
        (best, cached)
    }

    /// Returns `slot` to the free ones, keeping them highest first.
    fn free_slot(&mut self, slot: u32) {
        let at = self.free_slots.partition_point(|&free| free > slot);
        self.free_slots.insert(at, slot);
    }

    /// With saved prefixes beyond the slots, kept as `index` says.
    pub fn with_saved_prefixes(mut self, index: PrefixIndex) -> Head {
        self.saved = Some(index);
        self
    }

    pub(super) fn find(&mut self, id: u64) -> Option<&mut Active> {
        self.active.iter_mut().find(|a| a.id == id)
    }
}

impl Compute {
    pub(super) fn on_frame_at_head(&mut self, frame: RingFrame<'_>) {
        match frame {
            RingFrame::Tokens { tokens, compute_us } => {
                let tokens: Vec<Sampled> = tokens.iter().collect();
                // A request's tokens of one step are together: its verified drafts and one more.
                for run in tokens.chunk_by(|a, b| a.request == b.request) {
                    let ids: Vec<u32> = run.iter().map(|t| t.token).collect();
                    self.on_tokens(run[0].request, &ids, Some(compute_us));
                }
            }
            RingFrame::Failed { request, message, .. } => self.finish(request, Err(message)),
            RingFrame::Prefix { request, op: PrefixOp::Restore { key, failed, .. }, .. } => {
                self.restored(request, key, failed)
            }
            other => tracing::debug!("stage 0 ignores a returning {other:?} frame"),
        }
    }

    pub(super) fn on_request(&mut self, id: u64, request: FrontRequest, events: UnboundedSender<FrontEvent>) {
        let head = self.head.as_mut().expect("requests go to stage 0");
        if let Some(slot) = head.free_slots.pop() {
            return self.start(id, slot, request, events, Duration::ZERO);
        }
        if head.waiting.len() >= head.queue_limit {
            let message = format!(
                "the model is busy: {} requests run and {} wait, the most it queues; try again shortly",
                head.active.len(),
                head.waiting.len()
            );
            let _ = events.send(FrontEvent::Busy { message });
            return;
        }
        head.waiting.push_back(Waiting { id, request, events, since: Instant::now() });
        self.stats.locked().queued_requests = head.waiting.len();
    }

    /// Renders and tokenizes the prompt of `request`; the prompt, and how the reply will be laid out.
    fn prompt_of(&mut self, request: &FrontRequest) -> Result<(Vec<u32>, ReplyFormat), String> {
        let head = self.head.as_mut().expect("stage 0");
        let mut reply = ReplyFormat::Plain;
        // A request's own text is guarded, so that only the template's markup becomes control tokens.
        let mut literals = Literals::default();
        let rendered = match &request.prompt {
            PromptInput::Text(t) => Ok(t.clone()),
            PromptInput::Messages(m) => head.template.render(&head.markup.guard_messages(m, &mut literals)),
            PromptInput::Conversation { messages, tools, variables } => {
                let markup = &head.markup;
                let messages = markup.guard_values(messages, &mut literals);
                let tools = markup.guard_values(tools, &mut literals);
                let variables = markup.guard_map(variables, &mut literals);
                head.template.render_conversation(&messages, &tools, &variables)
            }
            PromptInput::Tokens(_) => Ok(String::new()),
        };
        let text = rendered.map_err(|e: ModelError| e.to_string())?;
        let prompt = match &request.prompt {
            PromptInput::Tokens(t) => t.clone(),
            PromptInput::Text(_) => head.tokenizer.encode(&text).map_err(|e| e.to_string())?,
            _ => {
                reply = head.template.reply_format(&text);
                head.tokenizer.encode_guarded(&text, &literals).map_err(|e| e.to_string())?
            }
        };
        let vocabulary = head.tokenizer.vocabulary_size();
        if prompt.is_empty() {
            return Err("the prompt is empty".to_string());
        }
        if prompt.iter().any(|&t| t as usize >= vocabulary) {
            return Err("a prompt token is outside the vocabulary".into());
        }
        Ok((prompt, reply))
    }

    /// Admits a request into `slot`: its prompt is checked and its first step waits for the schedule.
    fn start(
        &mut self,
        id: u64,
        slot: u32,
        mut request: FrontRequest,
        events: UnboundedSender<FrontEvent>,
        queued: Duration,
    ) {
        let single = self.stages == 1;
        // Calls the model may make are held to the style its template writes them in, where it is known.
        if let Some(OutputFormat::ToolCalls { style, .. }) = request.sampling.format.as_mut() {
            match self.head.as_ref().expect("stage 0").template.call_format() {
                CallFormat::HermesJson => *style = CallStyle::Json,
                CallFormat::XmlFunctions => *style = CallStyle::XmlFunctions,
                CallFormat::Other => request.sampling.format = None,
            }
        }
        // Validated once (a format's schema is compiled to check it), and the length before a sampler's
        // grammar is compiled; single-stage instances sample here.
        let context = self.stage.context();
        let refused = |message: String| FrontEvent::Error { message, client_error: true };
        let admitted = request.sampling.validate().and_then(|_| self.prompt_of(&request)).map_err(refused).and_then(
            |(p, reply)| {
                if p.len() >= context {
                    return Err(FrontEvent::TooLong { prompt_tokens: p.len(), context });
                }
                let sampler = if single { Some(self.sampler(&request.sampling).map_err(refused)?) } else { None };
                Ok((p, reply, sampler))
            },
        );
        let (prompt, reply, mut sampler) = match admitted {
            Ok(admitted) => admitted,
            Err(refusal) => {
                let _ = events.send(refusal);
                self.head.as_mut().expect("stage 0").free_slot(slot);
                return self.start_waiting();
            }
        };
        let stage = &self.stage;
        let checkpoints = |slot: u32| stage.checkpoints(slot as usize);
        let (slot, mut cached) = self.head.as_mut().expect("stage 0").slot_for(slot, &prompt, checkpoints);
        self.save_before_reuse(slot, cached);
        let restoring = self.restore_saved(id, slot, &prompt, &mut cached);
        let _ = events.send(FrontEvent::Started { prompt_tokens: prompt.len(), reply });
        if let Some(s) = sampler.as_mut() {
            prompt.iter().for_each(|&t| s.accept(t));
        }
        if !single {
            let recent_from = prompt.len().saturating_sub(request.sampling.repeat_last_n);
            self.send(&RingFrame::Begin {
                request: id,
                slot,
                sampling: request.sampling.clone(),
                recent: prompt[recent_from..].to_vec(),
            });
        }
        let head = self.head.as_mut().expect("stage 0");
        let (speculation, draft_tokens) = (head.speculation, head.draft_tokens);
        let prompt_copy = if speculation == Speculation::Off { Vec::new() } else { prompt.clone() };
        let pipeline = if head.pipelined_prefill { self.stages } else { 1 };
        let chunk = schedule::prompt_chunk(prompt.len() - cached, pipeline, self.stage.options().batch);
        let checkpoint_at = (head.history.keeps_checkpoints())
            .then(|| prompt.len().saturating_sub(CHECKPOINT_BEFORE_END))
            .filter(|&at| at > cached);
        head.active.push(Active {
            id,
            slot,
            events,
            stream: TokenStream::new(&request.stop, request.ignore_eos),
            max_tokens: request.max_tokens,
            generated: 0,
            pos: prompt.len(),
            prompt,
            prefilled: cached,
            cached,
            restoring,
            chunk,
            checkpoint_at,
            next: None,
            queued,
            started: Instant::now(),
            first_token: None,
            sent_at: None,
            hops: RttWindow::default(),
            sampler,
            seen: prompt_copy,
            drafts: Vec::new(),
            policy: SpeculationPolicy::new(speculation, draft_tokens),
            drafted: 0,
            accepted: 0,
        });
        self.stats.locked().active_requests = head.active.len();
        if request.max_tokens == 0 {
            self.finish(id, Ok(FinishReason::Length));
        }
    }

    /// Whether an admitted request has rows to run.
    pub(super) fn has_step(&self) -> bool {
        self.head.as_ref().is_some_and(|h| h.active.iter().any(|a| a.need() != Need::Waiting))
    }

    /// Runs one batched step of the rows the schedule picks, and sends it on (or samples it here). A
    /// decoding request's row may carry drafted tokens after its next one, in the room the step has.
    pub(super) fn step_at_head(&mut self) {
        let batch = self.stage.options().batch;
        let context = self.stage.context();
        let head = self.head.as_mut().expect("stage 0");
        head.needs.clear();
        head.needs.extend(head.active.iter().map(Active::need));
        let mut picked = schedule::next_step(&head.needs, self.stages, batch);
        if picked.is_empty() {
            return;
        }
        // Decode rows first, by slot: rows of neighbouring slots attend as one batch.
        picked.sort_by_key(|&(i, tokens)| (tokens > 1, head.active[i].slot));
        // Drafts fit the step's batch, and all of them together the most one request may draft (what the
        // last stage's compute buffer holds logits for, see `StageOptions::draft_rows`).
        let mut room = batch.saturating_sub(picked.iter().map(|&(_, tokens)| tokens).sum()).min(head.draft_tokens);
        let cost = head.draft_cost.relative();
        let only_decode = picked.iter().all(|&(i, _)| head.active[i].next.is_some());
        let mut drafted_rows = 0;
        self.segments.clear();
        self.rows.clear();
        head.tokens.clear();
        head.drafts.clear();
        for &(i, tokens) in &picked {
            let a = &mut head.active[i];
            let fed_from = head.tokens.len();
            let (start, tokens, sample) = match a.next.take() {
                Some(token) => {
                    // Drafts fit the step's room, the context and the reply's length.
                    let most = a
                        .policy
                        .budget(cost)
                        .min(room)
                        .min(context.saturating_sub(a.pos + 1))
                        .min(a.max_tokens.saturating_sub(a.generated + 1));
                    a.drafts = engine::prompt_lookup(&a.seen, most);
                    room -= a.drafts.len();
                    drafted_rows += a.drafts.len();
                    head.tokens.push(token);
                    head.tokens.extend_from_slice(&a.drafts);
                    a.pos += 1;
                    (a.pos - 1, 1 + a.drafts.len(), true)
                }
                None => {
                    head.tokens.extend_from_slice(&a.prompt[a.prefilled..a.prefilled + tokens]);
                    a.prefilled += tokens;
                    (a.prefilled - tokens, tokens, a.prefilled == a.prompt.len())
                }
            };
            let drafted = a.drafts.len();
            if drafted > 0 {
                head.drafts.push((a.id, a.slot, a.drafts.clone()));
            }
            head.history.ran(a.slot, start, &head.tokens[fed_from..]);
            self.segments.push(Segment { seq: a.slot as usize, start, tokens, logits: sample, drafted });
            self.rows.push(StepRows {
                request: a.id,
                slot: a.slot,
                start: start as u32,
                tokens: tokens as u32,
                sample,
                drafted: drafted as u8,
            });
        }
        let tokens = std::mem::take(&mut head.tokens);
        let result = self.step(StageInput::Tokens(&tokens));
        let head = self.head.as_mut().expect("stage 0");
        head.tokens = tokens;
        if let (Ok(took), true) = (&result, only_decode) {
            head.draft_cost.record(picked.len(), drafted_rows, *took);
        }
        let rows = std::mem::take(&mut self.rows);
        match result {
            Err(e) => {
                // A failed step leaves its slots' caches in doubt; `finish` forgets them.
                let message = e.to_string();
                rows.iter().for_each(|r| self.finish(r.request, Err(message.clone())));
            }
            Ok(_) if self.stages == 1 => self.sample_here(&rows),
            Ok(_) => {
                self.encode_output();
                let wire = std::mem::take(&mut self.wire);
                // The drafts go ahead of the step, for the last stage to verify.
                for (request, slot, tokens) in std::mem::take(&mut self.head.as_mut().expect("stage 0").drafts) {
                    self.send(&RingFrame::Draft { request, slot, tokens });
                }
                // Stamped before the write: on a busy machine the next stage may run before it returns.
                let now = Instant::now();
                let head = self.head.as_mut().expect("stage 0");
                for r in rows.iter().filter(|r| r.sample) {
                    if let Some(a) = head.find(r.request) {
                        a.sent_at = Some(now);
                    }
                }
                self.send(&RingFrame::Forward { rows: Records::Items(&rows), compute_us: 0, hidden: &wire });
                self.wire = wire;
            }
        }
        self.rows = rows;
    }

    /// Single-stage instances: each row that asks samples from its logits (verifying its drafts), then
    /// goes on.
    fn sample_here(&mut self, rows: &[StepRows]) {
        let vocabulary = self.stage.config().vocabulary;
        let head = self.head.as_mut().expect("stage 0");
        let mut sampled = Vec::with_capacity(rows.len());
        let mut logits = self.stage.last_output();
        for r in rows.iter().filter(|r| r.sample) {
            // The stage gave each sampling row its drafts' rows too; a shorter output is a broken step.
            let Some((own, rest)) = logits.split_at_checked((r.drafted as usize + 1) * vocabulary) else {
                sampled.push((r.request, Vec::new()));
                continue;
            };
            logits = rest;
            let Some(a) = head.find(r.request) else { continue };
            let Some(sampler) = a.sampler.as_mut() else { continue };
            sampled.push((r.request, sampler.verify(own, vocabulary, &a.drafts)));
        }
        for (id, tokens) in sampled {
            self.on_tokens(id, &tokens, None);
        }
    }

    /// The tokens a step gave request `id`: the drafts the last stage kept, then one of its own.
    fn on_tokens(&mut self, id: u64, tokens: &[u32], others_us: Option<u32>) {
        let stages = self.stages as u64;
        let context = self.stage.context();
        let Some(head) = self.head.as_mut() else { return };
        let Some(a) = head.active.iter_mut().find(|a| a.id == id) else { return };
        let drafts = std::mem::take(&mut a.drafts);
        let kept = tokens.len().saturating_sub(1);
        // What the slot's cache holds after the fed token is the drafts: only those can come back as kept.
        if tokens.is_empty() {
            return self.finish(id, Err("the step gave no token for this request".into()));
        }
        if kept > drafts.len() || tokens[..kept] != drafts[..kept] {
            let message = format!("the last stage returned {} tokens that do not follow the drafts", tokens.len());
            return self.finish(id, Err(message));
        }
        a.policy.record(drafts.len(), kept);
        a.drafted += drafts.len();
        a.accepted += kept;
        let now = Instant::now();
        a.first_token.get_or_insert(now);
        if let (Some(sent), Some(others)) = (a.sent_at.take(), others_us) {
            // The ring time of a step, less the other stages' compute, shared by the hops.
            let ring_us = now.duration_since(sent).as_micros() as u64;
            let hop = Duration::from_micros(ring_us.saturating_sub(others as u64) / stages.max(1));
            a.hops.record(hop);
            head.hops.record(hop);
        }
        for (i, &token) in tokens.iter().enumerate() {
            if i > 0 {
                // A kept draft: its position is already in the cache.
                a.pos += 1;
            }
            if a.policy.drafts() {
                a.seen.push(token);
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
        }
        a.next = tokens.last().copied();
    }

    pub(super) fn on_cancel(&mut self, id: u64) {
        let Some(head) = self.head.as_mut() else { return };
        head.waiting.retain(|w| w.id != id);
        self.stats.locked().queued_requests = head.waiting.len();
        if head.find(id).is_some() {
            self.finish(id, Ok(FinishReason::Cancelled));
        }
    }

    /// Ends request `id`: the last text and the report (or the error) to the client, the slot freed
    /// along the ring, and the next waiting request started.
    fn finish(&mut self, id: u64, outcome: Result<FinishReason, String>) {
        let stages = self.stages;
        let Some(head) = self.head.as_mut() else { return };
        let Some(index) = head.active.iter().position(|a| a.id == id) else { return };
        let mut a = head.active.remove(index);
        head.free_slot(a.slot);
        if outcome.is_err() {
            // A step of it failed somewhere along the ring: what the slot's caches hold is in doubt.
            head.history.forget(a.slot);
        }
        // Saved once the slot is wanted for another conversation, or the instance idles.
        head.unsaved[a.slot as usize] = outcome.is_ok();
        match outcome {
            Ok(reason) => {
                if reason != FinishReason::Stop {
                    let tail = a.stream.finish();
                    if !tail.is_empty() {
                        let _ = a.events.send(FrontEvent::Text { text: tail });
                    }
                }
                let _ = a.events.send(FrontEvent::Done { finish_reason: reason, report: report(&a) });
            }
            Err(message) => {
                let _ = a.events.send(FrontEvent::Error { message, client_error: false });
            }
        }
        {
            let mut s = self.stats.locked();
            s.requests += 1;
            s.generated_tokens += a.generated as u64;
            s.prompt_tokens += a.prompt.len() as u64;
            s.cached_tokens += a.cached as u64;
            s.drafted_tokens += a.drafted as u64;
            s.accepted_tokens += a.accepted as u64;
            s.draft_row_cost = head.draft_cost.measured();
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
        if let Some(w) = head.waiting.pop_front() {
            self.stats.locked().queued_requests = head.waiting.len();
            let slot = head.free_slots.pop().expect("checked");
            self.start(w.id, slot, w.request, w.events, w.since.elapsed());
        }
    }

    pub(super) fn fail_all(&mut self, message: &str) {
        let Some(head) = self.head.as_mut() else { return };
        let ids: Vec<u64> = head.active.iter().map(|a| a.id).collect();
        for w in head.waiting.drain(..) {
            let _ = w.events.send(FrontEvent::Error { message: message.to_string(), client_error: false });
        }
        for id in ids {
            self.finish(id, Err(message.to_string()));
        }
    }
}

/// The counts and rates of a finished request.
fn report(a: &Active) -> GenerationReport {
    let now = Instant::now();
    // The prompt is processed when the first token comes back from the last stage.
    let ttft = a.first_token.unwrap_or(now).duration_since(a.started);
    // Without a token back, the prompt was not run (max_tokens 0): no rate to report.
    let prefill = if a.first_token.is_some() { ttft } else { Duration::ZERO };
    let decode = now.duration_since(a.first_token.unwrap_or(now));
    GenerationReport {
        prompt_tokens: a.prompt.len(),
        cached_tokens: a.cached,
        generated_tokens: a.generated,
        queue_ms: a.queued.as_secs_f64() * 1000.0,
        time_to_first_token_ms: ttft.as_secs_f64() * 1000.0,
        prefill_tokens_per_second: engine::rate(a.prompt.len() - a.cached, prefill),
        decode_tokens_per_second: engine::rate(a.generated.saturating_sub(1), decode),
        hop_p50_us: a.hops.quantile(0.5).map(|d| d.as_micros() as u64),
        drafted_tokens: a.drafted,
        accepted_tokens: a.accepted,
        stop_sequence: a.stream.stop_sequence().map(str::to_string),
    }
}
