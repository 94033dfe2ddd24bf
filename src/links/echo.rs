//! The round trip a model's own traffic sees on a link: small frames bounced between two threads that
//! wait for them as a tensor-parallel group's ranks and a ring's stages do (spinning briefly, then
//! sleeping in `poll`), over the authenticated, encrypted connection of a link probe. The agent's
//! heartbeats measure the same link through its async runtime, its JSON and its locks, which on veth
//! between network namespaces took 170 µs for a round trip that a group's sum did in 20 µs: placement
//! predicts a model's link time from this figure instead, where a probe measured it.

use crate::net::secure::SecureStream;
use crate::net::NetError;
use std::time::{Duration, Instant};

/// Round trips timed (the median counts), after a few untimed ones.
pub const ROUNDS: u32 = 32;
const WARM_UP: u32 = 4;

/// Bytes of each frame: about a small model's hidden state.
const FRAME_BYTES: usize = 2048;

/// How long a wait spins before it sleeps (as a group's exchange does).
const SPIN: Duration = Duration::from_micros(500);

/// How long the whole echo may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Sends `rounds` frames one after another, each once the peer echoed the one before; the median
/// round trip in microseconds.
pub fn time_round_trips(stream: &mut SecureStream, rounds: u32) -> Result<u64, NetError> {
    let deadline = Instant::now() + TIMEOUT;
    let payload = vec![0x5a; FRAME_BYTES];
    let mut frame = Vec::new();
    let mut times = Vec::with_capacity(rounds as usize);
    for round in 0..WARM_UP + rounds {
        let started = Instant::now();
        stream.send_waiting(&payload, Some(deadline))?;
        stream.recv_waiting(&mut frame, FRAME_BYTES, Some(deadline), SPIN)?;
        if frame != payload {
            return Err(NetError::BadPreamble("the echo came back changed".into()));
        }
        if round >= WARM_UP {
            times.push(started.elapsed().as_micros() as u64);
        }
    }
    times.sort_unstable();
    Ok(times.get(times.len() / 2).copied().unwrap_or(0))
}

/// Sends back each of `rounds` frames (of at most [`FRAME_BYTES`]) as it comes.
pub fn echo(stream: &mut SecureStream, rounds: u32) -> Result<(), NetError> {
    let deadline = Instant::now() + TIMEOUT;
    let mut frame = Vec::new();
    for _ in 0..WARM_UP + rounds {
        stream.recv_waiting(&mut frame, FRAME_BYTES, Some(deadline), SPIN)?;
        stream.send_waiting(&frame, Some(deadline))?;
    }
    Ok(())
}
