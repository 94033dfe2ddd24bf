//! The frames a tensor-parallel group's ranks exchange, and their checks: a rank's frames are a
//! member's input, so each is checked before use (kind, lengths, counts) and a malformed one ends the
//! group with an error instead of a wrong answer.
//!
//! Every frame starts with its kind. Little-endian throughout.
//! - `STEP` (leader to each rank): `u32` segment count, per segment `seq`, `start`, `tokens` (`u32`
//!   each) and `logits` (`u8`); `u32` token count and the token ids (`u32`).
//! - `HIDDEN_STEP` (leader to each rank, in a group that runs layers after the first): the segments as
//!   in `STEP`; `u32` value count and the hidden states the previous stage sent (`f32`).
//! - `PARTIAL` (every rank to every rank): a rank's part of a layer's output, `f32` values.
//! - `LOGITS` (each rank to the leader): its rows of the logits, `f32` values.
//! - `STOP` (leader to each rank): the group ends.

use crate::engine::{Segment, StageInput};

pub const STEP: u8 = 1;
pub const PARTIAL: u8 = 2;
pub const LOGITS: u8 = 3;
pub const STOP: u8 = 4;
pub const HIDDEN_STEP: u8 = 5;

/// The most segments or tokens a step frame may hold (a step never exceeds its batch; this only bounds
/// what a malformed frame can make a rank allocate).
const MAX_STEP_ITEMS: usize = 1 << 20;

/// A frame of `kind` holding `values`.
pub fn encode_values(kind: u8, values: &[f32], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(1 + 4 * values.len());
    out.push(kind);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// The values of a frame that must be of `kind` and hold `count` of them.
pub fn values(frame: &[u8], kind: u8, count: usize) -> Result<impl Iterator<Item = f32> + '_, String> {
    match frame.split_first() {
        Some((&k, rest)) if k == kind && rest.len() == 4 * count => {
            Ok(rest.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        }
        Some((&k, rest)) => {
            Err(format!("expected a frame of kind {kind} with {count} values, got kind {k} with {} bytes", rest.len()))
        }
        None => Err("an empty frame".into()),
    }
}

/// A step's input as the leader sends it on.
#[derive(Debug, PartialEq)]
pub enum StepInput {
    Tokens(Vec<u32>),
    /// The previous stage's hidden states, a row per token.
    Hidden(Vec<f32>),
}

pub fn encode_step(segments: &[Segment], input: &StageInput<'_>, out: &mut Vec<u8>) {
    out.clear();
    out.push(match input {
        StageInput::Tokens(_) => STEP,
        StageInput::Hidden { .. } => HIDDEN_STEP,
    });
    out.extend_from_slice(&(segments.len() as u32).to_le_bytes());
    for s in segments {
        for n in [s.seq, s.start, s.tokens, s.drafted] {
            out.extend_from_slice(&(n as u32).to_le_bytes());
        }
        out.push(s.logits as u8);
    }
    match input {
        StageInput::Tokens(tokens) => {
            out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
            for t in *tokens {
                out.extend_from_slice(&t.to_le_bytes());
            }
        }
        StageInput::Hidden { values, .. } => {
            out.reserve(4 + 4 * values.len());
            out.extend_from_slice(&(values.len() as u32).to_le_bytes());
            for v in *values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// What a frame from the leader says.
#[derive(Debug, PartialEq)]
pub enum FromLeader {
    Step { segments: Vec<Segment>, input: StepInput },
    Stop,
}

pub fn decode_from_leader(frame: &[u8]) -> Result<FromLeader, String> {
    let mut r = Reader(frame);
    match r.u8()? {
        STOP if frame.len() == 1 => Ok(FromLeader::Stop),
        kind @ (STEP | HIDDEN_STEP) => {
            let n = r.count()?;
            let mut segments = Vec::with_capacity(n);
            for _ in 0..n {
                let (seq, start, tokens) = (r.u32()? as usize, r.u32()? as usize, r.u32()? as usize);
                let drafted = r.u32()? as usize;
                let logits = match r.u8()? {
                    0 => false,
                    1 => true,
                    other => return Err(format!("a step's logits flag is {other}")),
                };
                if drafted > 0 && (drafted >= tokens || !logits) {
                    return Err(format!("a segment of {tokens} tokens cannot verify {drafted} drafted ones"));
                }
                segments.push(Segment { seq, start, tokens, logits, drafted });
            }
            let input = if kind == STEP {
                let n = r.count()?;
                StepInput::Tokens((0..n).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?)
            } else {
                // As many values as the frame holds after the count, no more: the count cannot make a
                // rank allocate beyond the frame's own size.
                let n = r.u32()? as usize;
                if r.0.len() < 4 * n {
                    return Err(format!("a step claims {n} hidden values but {} bytes follow", r.0.len()));
                }
                StepInput::Hidden((0..n).map(|_| r.u32().map(f32::from_bits)).collect::<Result<Vec<_>, _>>()?)
            };
            if !r.0.is_empty() {
                return Err(format!("{} bytes after a step", r.0.len()));
            }
            Ok(FromLeader::Step { segments, input })
        }
        other => Err(format!("the leader sent a frame of kind {other} where a step or the end was due")),
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        if self.0.len() < N {
            return Err("a step frame ends early".into());
        }
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        Ok(head.try_into().expect("split at N"))
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    fn count(&mut self) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n > MAX_STEP_ITEMS {
            return Err(format!("a step frame claims {n} items"));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_and_values_round_trip() {
        let segments = vec![
            Segment { seq: 0, start: 10, tokens: 3, logits: true, drafted: 2 },
            Segment { seq: 3, start: 0, tokens: 7, logits: false, drafted: 0 },
        ];
        let tokens: Vec<u32> = (0..10).collect();
        let mut frame = Vec::new();
        encode_step(&segments, &StageInput::Tokens(&tokens), &mut frame);
        let input = StepInput::Tokens(tokens);
        assert_eq!(decode_from_leader(&frame).unwrap(), FromLeader::Step { segments: segments.clone(), input });
        let hidden: Vec<f32> = (0..16).map(|i| i as f32 * -0.25).collect();
        encode_step(&segments, &StageInput::Hidden { values: &hidden, tokens: 8 }, &mut frame);
        let input = StepInput::Hidden(hidden);
        assert_eq!(decode_from_leader(&frame).unwrap(), FromLeader::Step { segments, input });
        assert_eq!(decode_from_leader(&[STOP]).unwrap(), FromLeader::Stop);
        encode_values(PARTIAL, &[1.5, -2.0], &mut frame);
        assert_eq!(values(&frame, PARTIAL, 2).unwrap().collect::<Vec<_>>(), vec![1.5, -2.0]);
    }

    #[test]
    fn malformed_frames_are_refused() {
        let mut frame = Vec::new();
        let segment = [Segment { seq: 0, start: 0, tokens: 2, logits: true, drafted: 0 }];
        encode_step(&segment, &StageInput::Hidden { values: &[1.0, 2.0, 3.0, 4.0], tokens: 2 }, &mut frame);
        for cut in 0..frame.len() {
            assert!(decode_from_leader(&frame[..cut]).is_err(), "hidden states cut at {cut}");
        }
        let mut claims_more = frame.clone();
        claims_more[22..26].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_from_leader(&claims_more).is_err(), "more hidden values claimed than sent");
        encode_step(&segment, &StageInput::Tokens(&[5, 6]), &mut frame);
        for cut in 0..frame.len() {
            assert!(decode_from_leader(&frame[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = frame.clone();
        long.push(0);
        assert!(decode_from_leader(&long).is_err());
        let mut flag = frame.clone();
        flag[21] = 2;
        assert!(decode_from_leader(&flag).is_err());
        let mut drafts_all = frame.clone();
        drafts_all[17] = 2;
        assert!(decode_from_leader(&drafts_all).is_err(), "every token of the segment drafted");
        let mut huge = vec![STEP];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_from_leader(&huge).is_err());
        encode_values(PARTIAL, &[1.0], &mut frame);
        assert!(values(&frame, PARTIAL, 2).is_err(), "too few values");
        assert!(values(&frame, LOGITS, 1).is_err(), "another kind");
        assert!(decode_from_leader(&frame).is_err(), "a partial sum where a step was due");
    }
}
