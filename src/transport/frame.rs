//! The frames that travel around a ring of stages, in a compact binary form (the hot path allocates
//! nothing: frames are written into and read from reused buffers). Every frame starts with its kind,
//! the request id and the request's KV slot.
//!
//! - `Begin`: a request starts (sampling parameters and recent tokens, for the last stage's sampler);
//! - `Forward`: hidden states of positions `start..start+tokens` (in the byte form of
//!   `engine::hidden`); `sample` asks the last stage for a token; `compute_us` adds up stage time;
//! - `Token`: the last stage's sampled token, on its way back to stage 0;
//! - `End`: the request is over, its slot is free; `Failed`: a stage could not go on.

use crate::engine::SamplingParams;

#[derive(Clone, Debug, PartialEq)]
pub enum RingFrame<'a> {
    Begin { request: u64, slot: u32, sampling: SamplingParams, recent: Vec<u32> },
    Forward { request: u64, slot: u32, start: u32, tokens: u32, sample: bool, compute_us: u32, hidden: &'a [u8] },
    Token { request: u64, slot: u32, token: u32, compute_us: u32 },
    End { request: u64, slot: u32 },
    Failed { request: u64, slot: u32, message: String },
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

const HEADER: usize = 13;

impl RingFrame<'_> {
    pub fn request(&self) -> u64 {
        match self {
            RingFrame::Begin { request, .. }
            | RingFrame::Forward { request, .. }
            | RingFrame::Token { request, .. }
            | RingFrame::End { request, .. }
            | RingFrame::Failed { request, .. } => *request,
        }
    }

    /// Writes the frame into `out` (replacing its contents).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        let (kind, request, slot) = match self {
            RingFrame::Begin { request, slot, .. } => (1u8, request, slot),
            RingFrame::Forward { request, slot, .. } => (2, request, slot),
            RingFrame::Token { request, slot, .. } => (3, request, slot),
            RingFrame::End { request, slot } => (4, request, slot),
            RingFrame::Failed { request, slot, .. } => (5, request, slot),
        };
        out.push(kind);
        out.extend_from_slice(&request.to_le_bytes());
        out.extend_from_slice(&slot.to_le_bytes());
        match self {
            RingFrame::Begin { sampling, recent, .. } => {
                serde_json::to_writer(&mut *out, &(sampling, recent)).expect("serialisable");
            }
            RingFrame::Forward { start, tokens, sample, compute_us, hidden, .. } => {
                out.extend_from_slice(&start.to_le_bytes());
                out.extend_from_slice(&tokens.to_le_bytes());
                out.push(*sample as u8);
                out.extend_from_slice(&compute_us.to_le_bytes());
                out.extend_from_slice(hidden);
            }
            RingFrame::Token { token, compute_us, .. } => {
                out.extend_from_slice(&token.to_le_bytes());
                out.extend_from_slice(&compute_us.to_le_bytes());
            }
            RingFrame::End { .. } => {}
            RingFrame::Failed { message, .. } => out.extend_from_slice(message.as_bytes()),
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<RingFrame<'_>, RingFrameError> {
        if bytes.len() < HEADER {
            return Err(RingFrameError::Short(bytes.len()));
        }
        let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let request = u64::from_le_bytes(bytes[1..9].try_into().expect("8 bytes"));
        let slot = u32_at(bytes, 9);
        let body = &bytes[HEADER..];
        let short = || RingFrameError::Short(bytes.len());
        Ok(match bytes[0] {
            1 => {
                let (sampling, recent): (SamplingParams, Vec<u32>) =
                    serde_json::from_slice(body).map_err(|e| RingFrameError::Malformed(e.to_string()))?;
                // A number too large for an f32 reads as infinity: refuse what the sampler would refuse.
                sampling.validate().map_err(|e| RingFrameError::Malformed(format!("sampling parameters: {e}")))?;
                RingFrame::Begin { request, slot, sampling, recent }
            }
            2 => {
                if body.len() < 13 {
                    return Err(short());
                }
                RingFrame::Forward {
                    request,
                    slot,
                    start: u32_at(body, 0),
                    tokens: u32_at(body, 4),
                    sample: match body[8] {
                        0 => false,
                        1 => true,
                        b => return Err(RingFrameError::Malformed(format!("sample flag {b}"))),
                    },
                    compute_us: u32_at(body, 9),
                    hidden: &body[13..],
                }
            }
            3 => {
                if body.len() != 8 {
                    return Err(short());
                }
                RingFrame::Token { request, slot, token: u32_at(body, 0), compute_us: u32_at(body, 4) }
            }
            4 => RingFrame::End { request, slot },
            5 => RingFrame::Failed { request, slot, message: String::from_utf8_lossy(body).into_owned() },
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
        let frames = [
            RingFrame::Begin {
                request: 7,
                slot: 1,
                sampling: SamplingParams { seed: 9, ..Default::default() },
                recent: vec![1, 2],
            },
            RingFrame::Forward {
                request: 7,
                slot: 1,
                start: 5,
                tokens: 1,
                sample: true,
                compute_us: 40,
                hidden: &hidden,
            },
            RingFrame::Token { request: 7, slot: 1, token: 42, compute_us: 99 },
            RingFrame::End { request: 7, slot: 1 },
            RingFrame::Failed { request: 7, slot: 1, message: "context full".into() },
        ];
        let mut buf = Vec::new();
        for f in frames {
            f.encode(&mut buf);
            assert_eq!(RingFrame::decode(&buf).unwrap(), f);
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = RingFrame::decode(&bytes);
        }
    }
}
