//! A rank's end of a tensor-parallel group: the sums inside its graphs, the leader's step broadcast
//! and logits gather, and the followers' loop.

use super::wire::{self, FromLeader, StepInput};
use super::GroupLinks;
use crate::engine::{EngineError, Segment, Stage, StageInput};
use crate::ggml::Collective;
use crate::links::RttWindow;
use crate::model::TensorSlice;
use crate::util::LockExt;
use std::sync::{Arc, Mutex};

const NOT_LINKED: &str = "the group's ranks are not connected";

/// One rank of a group: its share, every rank's share (the leader places their logits), and the links.
pub struct Group {
    slices: Vec<TensorSlice>,
    rank: usize,
    inner: Arc<Inner>,
    collective: Arc<dyn Collective>,
}

struct Inner {
    state: Mutex<State>,
}

struct State {
    /// None until the ranks have connected.
    links: Option<Box<dyn GroupLinks>>,
    /// Why the group broke, once it has: every later step fails with it.
    broken: Option<String>,
    mine: Vec<u8>,
    theirs: Vec<Vec<u8>>,
    /// How long the latest sums took, from sending this rank's part to holding every part.
    sums: RttWindow,
    /// Sums taken since the group was made.
    sums_taken: u64,
}

impl Group {
    /// Rank `links.rank()` of a group whose ranks hold `slices` (one per rank, in rank order).
    pub fn new(slices: Vec<TensorSlice>, links: Box<dyn GroupLinks>) -> Result<Group, String> {
        let group = Group::unlinked(slices, links.rank())?;
        group.link(links)?;
        Ok(group)
    }

    /// Rank `rank` of a group whose ranks hold `slices`, before the ranks connect ([`Group::link`]):
    /// a worker loads its slice first, then connects.
    pub fn unlinked(slices: Vec<TensorSlice>, rank: usize) -> Result<Group, String> {
        let ranks = slices.len();
        if rank >= ranks || slices.iter().enumerate().any(|(i, s)| s.rank != i || s.ranks != ranks) {
            return Err(format!("rank {rank} was given the shares of {ranks} ranks that do not number them in order"));
        }
        let state = State {
            links: None,
            broken: None,
            mine: Vec::new(),
            theirs: vec![Vec::new(); ranks],
            sums: RttWindow::default(),
            sums_taken: 0,
        };
        let inner = Arc::new(Inner { state: Mutex::new(state) });
        let collective: Arc<dyn Collective> = inner.clone();
        Ok(Group { slices, rank, inner, collective })
    }

    /// The links to the other ranks, once connected.
    pub fn link(&self, links: Box<dyn GroupLinks>) -> Result<(), String> {
        if links.rank() != self.rank || links.ranks() != self.slices.len() {
            return Err(format!(
                "links of rank {} of {} for rank {} of {}",
                links.rank(),
                links.ranks(),
                self.rank,
                self.slices.len()
            ));
        }
        self.inner.state.locked().links = Some(links);
        Ok(())
    }

    pub fn slice(&self) -> &TensorSlice {
        &self.slices[self.rank]
    }

    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }

    pub(crate) fn collective(&self) -> &Arc<dyn Collective> {
        &self.collective
    }

    /// The median time of the latest sums across the group (its links' latency, and the wait for the
    /// slowest rank).
    pub fn sum_p50(&self) -> Option<std::time::Duration> {
        self.inner.state.locked().sums.quantile(0.5)
    }

    /// How many sums this rank has taken part in: two per layer and step, one after attention and one
    /// after the feed-forward.
    pub fn sums_taken(&self) -> u64 {
        self.inner.state.locked().sums_taken
    }

    /// Why the group broke, if it has.
    pub fn broken(&self) -> Option<String> {
        self.inner.state.locked().broken.clone()
    }

    fn fail(state: &mut State, reason: String) -> EngineError {
        let reason = state.broken.get_or_insert(reason).clone();
        EngineError::GroupLost(reason)
    }

    /// The leader, before computing a step: sends it (its token ids, or the hidden states the previous
    /// stage sent a group of later layers) to every other rank.
    pub(crate) fn broadcast_step(&self, segments: &[Segment], input: &StageInput<'_>) -> Result<(), EngineError> {
        let mut state = self.inner.state.locked();
        if let Some(reason) = &state.broken {
            return Err(EngineError::GroupLost(reason.clone()));
        }
        let mut frame = std::mem::take(&mut state.mine);
        wire::encode_step(segments, input, &mut frame);
        let sent = match state.links.as_mut() {
            Some(links) => (1..self.slices.len()).try_for_each(|r| links.send(r, &frame)),
            None => Err(NOT_LINKED.to_string()),
        };
        state.mine = frame;
        sent.map_err(|e| Self::fail(&mut state, e))
    }

    /// After a step's compute: fails when a sum inside it failed.
    pub(crate) fn check(&self) -> Result<(), EngineError> {
        match &self.inner.state.locked().broken {
            Some(reason) => Err(EngineError::GroupLost(reason.clone())),
            None => Ok(()),
        }
    }

    /// After a step: the leader puts every rank's rows of the logits (`rows` rows; its own in
    /// `logits`) side by side into `logits`, the vocabulary's width each; another rank sends its own.
    pub(crate) fn gather_logits(
        &self,
        logits: &mut Vec<f32>,
        rows: usize,
        scratch: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        let mut state = self.inner.state.locked();
        if !self.is_leader() {
            let mut frame = std::mem::take(&mut state.mine);
            wire::encode_values(wire::LOGITS, logits, &mut frame);
            let sent = state.links.as_mut().ok_or(NOT_LINKED.to_string()).and_then(|l| l.send(0, &frame));
            state.mine = frame;
            return sent.map_err(|e| Self::fail(&mut state, e));
        }
        let vocabulary = self.slices[0].total(crate::model::layout::Part::Vocabulary);
        scratch.clear();
        scratch.resize(rows * vocabulary, 0.0);
        let mut frame = Vec::new();
        for (r, slice) in self.slices.iter().enumerate() {
            let range = slice.vocabulary.clone();
            let width = range.len();
            let mut place = |values: &mut dyn Iterator<Item = f32>| {
                for row in 0..rows {
                    let at = row * vocabulary + range.start;
                    for (dst, v) in scratch[at..at + width].iter_mut().zip(&mut *values) {
                        *dst = v;
                    }
                }
            };
            if r == 0 {
                if logits.len() != rows * width {
                    return Err(EngineError::Internal(format!(
                        "the leader computed {} logits, not {}",
                        logits.len(),
                        rows * width
                    )));
                }
                place(&mut logits.iter().copied());
                continue;
            }
            let received = state.links.as_mut().ok_or(NOT_LINKED.to_string()).and_then(|l| l.recv(r, &mut frame));
            if let Err(e) = received {
                return Err(Self::fail(&mut state, e));
            }
            match wire::values(&frame, wire::LOGITS, rows * width) {
                Ok(mut values) => place(&mut values),
                Err(e) => return Err(Self::fail(&mut state, format!("rank {r} sent malformed logits: {e}"))),
            }
        }
        std::mem::swap(logits, scratch);
        Ok(())
    }

    /// The leader: tells the other ranks the group ends.
    pub fn stop(&self) {
        let mut state = self.inner.state.locked();
        if let Some(links) = state.links.as_mut() {
            for r in 1..self.slices.len() {
                let _ = links.send(r, &[wire::STOP]);
            }
        }
    }
}

impl Collective for Inner {
    fn all_reduce(&self, local: &[f32], out: &mut [f32]) {
        let mut state = self.state.locked();
        out.fill(0.0);
        if state.broken.is_some() {
            return;
        }
        let started = std::time::Instant::now();
        let State { links, broken, mine, theirs, sums, sums_taken } = &mut *state;
        let Some(links) = links.as_mut() else {
            *broken = Some(NOT_LINKED.into());
            return;
        };
        wire::encode_values(wire::PARTIAL, local, mine);
        if let Err(e) = links.exchange(mine, theirs) {
            *broken = Some(e);
            return;
        }
        sums.record(started.elapsed());
        *sums_taken += 1;
        // The same order on every rank: rank 0's part, then rank 1's added, and so on.
        let rank = links.rank();
        for (r, frame) in theirs.iter().enumerate() {
            if r == rank {
                for (o, v) in out.iter_mut().zip(local) {
                    *o += v;
                }
                continue;
            }
            match wire::values(frame, wire::PARTIAL, local.len()) {
                Ok(values) => out.iter_mut().zip(values).for_each(|(o, v)| *o += v),
                Err(e) => {
                    *broken = Some(format!("rank {r} sent a malformed partial sum: {e}"));
                    out.fill(0.0);
                    return;
                }
            }
        }
    }
}

/// A rank other than the leader: runs each step the leader sends, until it says the group ends (`Ok`)
/// or a link or a step fails (the reason). Its logits go back to the leader after each step.
pub fn follow(stage: &mut Stage) -> Result<(), String> {
    follow_reporting(stage, |_, _| {})
}

/// One step a follower ran: its tokens, the requests' rows, and the time it took (its sums included).
#[derive(Clone, Copy, Debug)]
pub struct FollowedStep {
    pub tokens: usize,
    pub rows: usize,
    pub took: std::time::Duration,
}

/// [`follow`], telling `on_step` of each step it ran.
pub fn follow_reporting(stage: &mut Stage, mut on_step: impl FnMut(&Stage, FollowedStep)) -> Result<(), String> {
    let vocabulary = stage.config().vocabulary as u32;
    let mut frame = Vec::new();
    loop {
        let received = {
            let group = stage.group().ok_or("a follower needs its group")?;
            let mut state = group.inner.state.locked();
            state.links.as_mut().ok_or(NOT_LINKED.to_string()).and_then(|l| l.recv(0, &mut frame))
        };
        received.map_err(|e| format!("the group's leader is gone ({e})"))?;
        match wire::decode_from_leader(&frame).map_err(|e| format!("the leader sent a malformed frame: {e}"))? {
            FromLeader::Stop => return Ok(()),
            FromLeader::Step { segments, input } => {
                let started = std::time::Instant::now();
                let tokens = segments.iter().map(|s| s.tokens).sum();
                let input = match &input {
                    StepInput::Tokens(ids) => {
                        if let Some(bad) = ids.iter().find(|&&t| t >= vocabulary) {
                            return Err(format!("the leader sent token {bad}, outside the vocabulary"));
                        }
                        StageInput::Tokens(ids)
                    }
                    // The stage checks that the values are the segments' rows of its width.
                    StepInput::Hidden(values) => StageInput::Hidden { values, tokens },
                };
                stage.forward_batch(&segments, input).map_err(|e| e.to_string())?;
                let step = FollowedStep { tokens, rows: segments.len(), took: started.elapsed() };
                on_step(stage, step);
            }
        }
    }
}
