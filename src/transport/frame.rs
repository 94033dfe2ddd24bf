//! The frames that travel around a ring of stages, in a compact binary form. Hidden states and the
//! lists of rows are borrowed from the received bytes, never copied: a frame is read in place and
//! written into a reused buffer. Every frame starts with its kind.
//!
//! - `Begin`: a request starts in a KV slot (sampling parameters and recent tokens, for the last
//!   stage's sampler);
//! - `Forward`: one batched step — the rows of several requests, each a run of positions of its slot
//!   (`sample` asks the last stage for a token from its last position) — and their hidden states, row
//!   after row, in the byte form of `engine::hidden`; `compute_us` adds up stage time;
//! - `Draft`: the drafted tokens (speculative decoding) that a request's rows in the next `Forward`
//!   end with, for the last stage to verify; the stages between pass it on;
//! - `Tokens`: the tokens the last stage sampled in one step, on their way back to stage 0 (a request
//!   whose drafts it verified gets several, in order);
//! - `End`: the request is over, its slot is free; `Failed`: a stage could not go on with it;
//! - `Prefix`: the prompt cache saves what a slot holds, writes a saved prefix back into a slot, or
//!   forgets one, on every stage in ring order (see [`PrefixOp`]); a restore comes back to stage 0 with
//!   the first stage's failure, if any.

use crate::engine::{SamplingParams, MAX_DRAFT_TOKENS};

/// One request's rows in a batched step: positions `start..start + tokens` of its KV slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRows {
    pub request: u64,
    pub slot: u32,
    pub start: u32,
    pub tokens: u32,
    /// The last stage samples a token from the last of these positions.
    pub sample: bool,
    /// The last `drafted` of the positions are drafted tokens (sent ahead in a `Draft` frame): the last
    /// stage verifies them from their positions and the one before.
    pub drafted: u8,
}

/// A token the last stage sampled for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampled {
    pub request: u64,
    pub slot: u32,
    pub token: u32,
}

/// A list of fixed-size records: borrowed from a received frame, or from the sender's own slice.
#[derive(Clone, Copy)]
pub enum Records<'a, T> {
    Wire(&'a [u8]),
    Items(&'a [T]),
}

/// A record of a fixed byte size inside a frame.
pub trait Record: Copy + Sized {
    const BYTES: usize;
    fn write(&self, out: &mut Vec<u8>);
    /// Reads one record from exactly `Self::BYTES` bytes, checked by [`Record::check`] before.
    fn read(bytes: &[u8]) -> Self;
    /// Why these bytes are not a valid record, if they are not.
    fn check(_bytes: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

impl<'a, T: Record> Records<'a, T> {
    pub fn len(&self) -> usize {
        match self {
            Records::Wire(bytes) => bytes.len() / T::BYTES,
            Records::Items(items) => items.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = T> + 'a {
        let (wire, items) = match *self {
            Records::Wire(bytes) => (Some(bytes.chunks_exact(T::BYTES).map(T::read)), None),
            Records::Items(items) => (None, Some(items.iter().copied())),
        };
        wire.into_iter().flatten().chain(items.into_iter().flatten())
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Records::Wire(bytes) => out.extend_from_slice(bytes),
            Records::Items(items) => items.iter().for_each(|item| item.write(out)),
        }
    }

    /// Takes `count` records off the front of `body`, checking each.
    fn take(body: &'a [u8], count: usize) -> Result<(Records<'a, T>, &'a [u8]), RingFrameError> {
        let bytes =
            count.checked_mul(T::BYTES).filter(|&n| n <= body.len()).ok_or(RingFrameError::Short(body.len()))?;
        let (records, rest) = body.split_at(bytes);
        for record in records.chunks_exact(T::BYTES) {
            T::check(record).map_err(RingFrameError::Malformed)?;
        }
        Ok((Records::Wire(records), rest))
    }
}

impl<T: Record + std::fmt::Debug> std::fmt::Debug for Records<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T: Record + PartialEq> PartialEq for Records<'_, T> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Record for StepRows {
    const BYTES: usize = 22;
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.request.to_le_bytes());
        out.extend_from_slice(&self.slot.to_le_bytes());
        out.extend_from_slice(&self.start.to_le_bytes());
        out.extend_from_slice(&self.tokens.to_le_bytes());
        out.push(self.sample as u8);
        out.push(self.drafted);
    }
    fn read(b: &[u8]) -> StepRows {
        StepRows {
            request: u64_at(b, 0),
            slot: u32_at(b, 8),
            start: u32_at(b, 12),
            tokens: u32_at(b, 16),
            sample: b[20] == 1,
            drafted: b[21],
        }
    }
    fn check(b: &[u8]) -> Result<(), String> {
        let tokens = u32_at(b, 16);
        if tokens == 0 {
            return Err("a step's rows of a request hold no tokens".into());
        }
        let drafted = b[21];
        if drafted > 0 && (b[20] != 1 || drafted as u32 >= tokens) {
            return Err(format!("{drafted} drafted tokens in rows of {tokens} (sample flag {})", b[20]));
        }
        match b[20] {
            0 | 1 => Ok(()),
            flag => Err(format!("sample flag {flag}")),
        }
    }
}

impl Record for Sampled {
    const BYTES: usize = 16;
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.request.to_le_bytes());
        out.extend_from_slice(&self.slot.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
    }
    fn read(b: &[u8]) -> Sampled {
        Sampled { request: u64_at(b, 0), slot: u32_at(b, 8), token: u32_at(b, 12) }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum RingFrame<'a> {
    Begin { request: u64, slot: u32, sampling: SamplingParams, recent: Vec<u32> },
    Forward { rows: Records<'a, StepRows>, compute_us: u32, hidden: &'a [u8] },
    Tokens { tokens: Records<'a, Sampled>, compute_us: u32 },
    Draft { request: u64, slot: u32, tokens: Vec<u32> },
    End { request: u64, slot: u32 },
    Failed { request: u64, slot: u32, message: String },
    Prefix { request: u64, slot: u32, op: PrefixOp },
}

/// What every stage does to its saved prefixes (the prompt cache beyond its slots), keyed by a hash of
/// the prefix's tokens.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefixOp {
    /// Copy the slot's first `positions` positions into the store (memory, and disk where it has one).
    Save { key: u64, positions: u32, tokens: Vec<u32> },
    /// Write `positions` positions of the prefix saved with `saved` positions back into the slot;
    /// `failed` carries the first stage's reason it could not, on the way back to stage 0.
    Restore { key: u64, saved: u32, positions: u32, failed: Option<String> },
    /// Drop the prefix's copy from memory, from disk, or both.
    Forget { key: u64, memory: bool, disk: bool },
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RingFrameError {
    #[error("ring frame of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("unknown ring frame kind {0}")]
    Kind(u8),
    #[error("malformed ring frame: {0}")]
    Malformed(String),
}

/// The kind, then a request and its slot (Begin, End, Failed) or a count and compute time (Forward,
/// Tokens).
const HEADER: usize = 13;
/// Most records one frame lists: more requests than any stage holds at once.
pub const MAX_ROWS: usize = 4096;

impl RingFrame<'_> {
    /// Writes the frame into `out` (replacing its contents).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        let kind = match self {
            RingFrame::Begin { .. } => 1u8,
            RingFrame::Forward { .. } => 2,
            RingFrame::Tokens { .. } => 3,
            RingFrame::End { .. } => 4,
            RingFrame::Failed { .. } => 5,
            RingFrame::Prefix { .. } => 6,
            RingFrame::Draft { .. } => 7,
        };
        out.push(kind);
        match self {
            RingFrame::Begin { request, slot, .. }
            | RingFrame::End { request, slot }
            | RingFrame::Failed { request, slot, .. }
            | RingFrame::Prefix { request, slot, .. }
            | RingFrame::Draft { request, slot, .. } => {
                out.extend_from_slice(&request.to_le_bytes());
                out.extend_from_slice(&slot.to_le_bytes());
            }
            RingFrame::Forward { rows, compute_us, .. } => {
                out.extend_from_slice(&(rows.len() as u64).to_le_bytes());
                out.extend_from_slice(&compute_us.to_le_bytes());
            }
            RingFrame::Tokens { tokens, compute_us } => {
                out.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
                out.extend_from_slice(&compute_us.to_le_bytes());
            }
        }
        match self {
            RingFrame::Begin { sampling, recent, .. } => {
                serde_json::to_writer(&mut *out, &(sampling, recent)).expect("serialisable");
            }
            RingFrame::Forward { rows, hidden, .. } => {
                rows.write(out);
                out.extend_from_slice(hidden);
            }
            RingFrame::Tokens { tokens, .. } => tokens.write(out),
            RingFrame::End { .. } => {}
            RingFrame::Failed { message, .. } => out.extend_from_slice(message.as_bytes()),
            RingFrame::Prefix { op, .. } => serde_json::to_writer(&mut *out, op).expect("serialisable"),
            RingFrame::Draft { tokens, .. } => tokens.iter().for_each(|t| out.extend_from_slice(&t.to_le_bytes())),
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<RingFrame<'_>, RingFrameError> {
        if bytes.len() < HEADER {
            return Err(RingFrameError::Short(bytes.len()));
        }
        // A request and its slot; in Forward and Tokens, the count of their records and the compute time.
        let (request, slot) = (u64_at(bytes, 1), u32_at(bytes, 9));
        let body = &bytes[HEADER..];
        let count = || match usize::try_from(request) {
            Ok(n @ 1..=MAX_ROWS) => Ok(n),
            _ => Err(RingFrameError::Malformed(format!("{request} records (1 to {MAX_ROWS})"))),
        };
        Ok(match bytes[0] {
            1 => {
                let (sampling, recent): (SamplingParams, Vec<u32>) =
                    serde_json::from_slice(body).map_err(|e| RingFrameError::Malformed(e.to_string()))?;
                // A number too large for an f32 reads as infinity: refuse what the sampler would refuse.
                sampling.validate().map_err(|e| RingFrameError::Malformed(format!("sampling parameters: {e}")))?;
                RingFrame::Begin { request, slot, sampling, recent }
            }
            2 => {
                let (rows, hidden) = Records::take(body, count()?)?;
                RingFrame::Forward { rows, compute_us: slot, hidden }
            }
            3 => {
                let (tokens, rest) = Records::take(body, count()?)?;
                if !rest.is_empty() {
                    return Err(RingFrameError::Malformed(format!("{} bytes after the tokens", rest.len())));
                }
                RingFrame::Tokens { tokens, compute_us: slot }
            }
            4 => RingFrame::End { request, slot },
            5 => RingFrame::Failed { request, slot, message: String::from_utf8_lossy(body).into_owned() },
            6 => RingFrame::Prefix {
                request,
                slot,
                op: serde_json::from_slice(body).map_err(|e| RingFrameError::Malformed(e.to_string()))?,
            },
            7 => {
                let count = body.len() / 4;
                if !body.len().is_multiple_of(4) || !(1..=MAX_DRAFT_TOKENS).contains(&count) {
                    return Err(RingFrameError::Malformed(format!(
                        "a draft of {} bytes (1 to {MAX_DRAFT_TOKENS} tokens of 4 bytes)",
                        body.len()
                    )));
                }
                RingFrame::Draft { request, slot, tokens: body.chunks(4).map(|t| u32_at(t, 0)).collect() }
            }
            k => return Err(RingFrameError::Kind(k)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_frame_round_trips() {
        let hidden = [1u8, 2, 3, 4];
        let rows = [
            StepRows { request: 7, slot: 1, start: 5, tokens: 4, sample: true, drafted: 3 },
            StepRows { request: 9, slot: 0, start: 0, tokens: 30, sample: false, drafted: 0 },
        ];
        let tokens = [Sampled { request: 7, slot: 1, token: 42 }, Sampled { request: 8, slot: 2, token: 0 }];
        let frames = [
            RingFrame::Begin {
                request: 7,
                slot: 1,
                sampling: SamplingParams { seed: 9, ..Default::default() },
                recent: vec![1, 2],
            },
            RingFrame::Forward { rows: Records::Items(&rows), compute_us: 40, hidden: &hidden },
            RingFrame::Tokens { tokens: Records::Items(&tokens), compute_us: 99 },
            RingFrame::Draft { request: 7, slot: 1, tokens: vec![5, 6, 7] },
            RingFrame::End { request: 7, slot: 1 },
            RingFrame::Failed { request: 7, slot: 1, message: "context full".into() },
            RingFrame::Prefix {
                request: 0,
                slot: 2,
                op: PrefixOp::Save { key: 5, positions: 3, tokens: vec![1, 2, 3] },
            },
            RingFrame::Prefix {
                request: 7,
                slot: 1,
                op: PrefixOp::Restore { key: 5, saved: 3, positions: 2, failed: Some("gone".into()) },
            },
            RingFrame::Prefix { request: 0, slot: 0, op: PrefixOp::Forget { key: 5, memory: true, disk: true } },
        ];
        let mut buf = Vec::new();
        for f in frames {
            f.encode(&mut buf);
            let decoded = RingFrame::decode(&buf).unwrap();
            assert_eq!(decoded, f);
            // Read in place: the rows and tokens come back as they went.
            if let RingFrame::Forward { rows: got, hidden: h, .. } = decoded {
                assert_eq!(got.iter().collect::<Vec<_>>(), rows);
                assert_eq!(h, hidden);
            }
            if let RingFrame::Tokens { tokens: got, .. } = decoded {
                assert_eq!(got.iter().collect::<Vec<_>>(), tokens);
            }
        }
    }

    #[test]
    fn malformed_steps_are_refused() {
        let rows = [StepRows { request: 7, slot: 1, start: 5, tokens: 1, sample: true, drafted: 0 }];
        let mut buf = Vec::new();
        RingFrame::Forward { rows: Records::Items(&rows), compute_us: 0, hidden: &[] }.encode(&mut buf);
        // Drafted tokens must be fewer than the rows' tokens, in rows that sample.
        let mut drafts_all = buf.clone();
        drafts_all[HEADER + 21] = 1;
        assert!(matches!(RingFrame::decode(&drafts_all), Err(RingFrameError::Malformed(m)) if m.contains("drafted")));
        let mut draft = Vec::new();
        RingFrame::Draft { request: 1, slot: 0, tokens: vec![9; MAX_DRAFT_TOKENS + 1] }.encode(&mut draft);
        assert!(matches!(RingFrame::decode(&draft), Err(RingFrameError::Malformed(m)) if m.contains("draft of")));
        draft.truncate(HEADER + 6);
        assert!(matches!(RingFrame::decode(&draft), Err(RingFrameError::Malformed(_))));
        let mut bad_flag = buf.clone();
        bad_flag[HEADER + 20] = 2;
        assert!(matches!(RingFrame::decode(&bad_flag), Err(RingFrameError::Malformed(m)) if m.contains("sample flag")));
        let mut no_tokens = buf.clone();
        no_tokens[HEADER + 16] = 0;
        assert!(matches!(RingFrame::decode(&no_tokens), Err(RingFrameError::Malformed(m)) if m.contains("no tokens")));
        let mut too_many = buf.clone();
        too_many[1..9].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(RingFrame::decode(&too_many), Err(RingFrameError::Malformed(_))));
        let mut none = buf.clone();
        none[1..9].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(RingFrame::decode(&none), Err(RingFrameError::Malformed(_))));
        let mut more_than_sent = buf.clone();
        more_than_sent[1..9].copy_from_slice(&2u64.to_le_bytes());
        assert_eq!(RingFrame::decode(&more_than_sent), Err(RingFrameError::Short(StepRows::BYTES)));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = RingFrame::decode(&bytes);
        }
    }
}
