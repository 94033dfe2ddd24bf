//! The round trip a model's own traffic sees on a link: small frames bounced between two threads that
//! wait for them as a tensor-parallel group's ranks and a ring's stages do (spinning briefly, then
//! sleeping in `poll`), over the authenticated, encrypted connection of a link probe. The agent's
//! heartbeats measure the same link through its async runtime, its JSON and its locks, which on veth
//! between network namespaces took 170 µs for a round trip that a group's sum did in 20 µs: placement
//! predicts a model's link time from this figure instead, where a probe measured it.

use crate::net::secure::SecureStream;
use crate::net::NetError;
use std::time::{Duration, Instant};

/// Round trips timed in one block (its median counts).
const ROUNDS_PER_BLOCK: u32 = 32;
/// Blocks timed. A block disturbed by this machine's or the peer's other work (see [`disturbed`]) is
/// followed by a pause before the next, and the quietest block counts.
const BLOCKS: u32 = 3;
/// Round trips a prober asks its peer to echo, after a few untimed ones.
pub const ROUNDS: u32 = ROUNDS_PER_BLOCK * BLOCKS;
const WARM_UP: u32 = 4;
/// How long a prober waits after a disturbed block (a model loading beside the probe takes seconds).
const PAUSE: Duration = Duration::from_secs(1);

/// Bytes of each frame: about a small model's hidden state.
const FRAME_BYTES: usize = 2048;

/// How long a wait spins before it sleeps (as a group's exchange does).
const SPIN: Duration = Duration::from_micros(500);

/// How long the whole echo may take (both ends: it holds the peer's probe turn).
const TIMEOUT: Duration = Duration::from_secs(5);

/// Sends [`ROUNDS`] frames after a few untimed ones, each once the peer echoed the one before; the
/// median round trip in microseconds of the quietest block of [`ROUNDS_PER_BLOCK`].
pub fn time_round_trips(stream: &mut SecureStream) -> Result<u64, NetError> {
    let deadline = Instant::now() + TIMEOUT;
    let payload = vec![0x5a; FRAME_BYTES];
    let mut frame = Vec::new();
    let mut round_trip = || -> Result<u64, NetError> {
        let started = Instant::now();
        stream.send_waiting(&payload, Some(deadline))?;
        stream.recv_waiting(&mut frame, FRAME_BYTES, Some(deadline), SPIN)?;
        if frame != payload {
            return Err(NetError::BadPreamble("the echo came back changed".into()));
        }
        Ok(started.elapsed().as_micros() as u64)
    };
    for _ in 0..WARM_UP {
        round_trip()?;
    }
    let mut quietest = u64::MAX;
    // Every block runs, quiet or not: the peer echoes exactly the rounds asked for and holds its probe
    // turn until then (a quiet block costs a few milliseconds).
    for block in 0..BLOCKS {
        let mut times = (0..ROUNDS_PER_BLOCK).map(|_| round_trip()).collect::<Result<Vec<u64>, _>>()?;
        times.sort_unstable();
        quietest = quietest.min(median(&times));
        if disturbed(&times) && block + 1 < BLOCKS {
            tracing::debug!("round trips disturbed ({:?}); timing again after a pause", &times[..]);
            std::thread::sleep(PAUSE);
        }
    }
    Ok(quietest)
}

fn median(sorted: &[u64]) -> u64 {
    sorted.get(sorted.len() / 2).copied().unwrap_or(0)
}

/// Whether a block's round trips (sorted) were disturbed: its median is more than twice its fastest
/// round trip and 50 µs. A round trip is the link's, or a thread's wait to be scheduled again: with
/// three threads spinning on this VM's two cores, 12 to 27 of a block's 32 round trips over loopback
/// took ~4 ms, the kernel's time slice, where the fastest took 24 µs; undisturbed, the median was
/// within a µs of the fastest.
fn disturbed(sorted: &[u64]) -> bool {
    let fastest = sorted.first().copied().unwrap_or(0);
    median(sorted) > 2 * fastest + 50
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_disturbed_when_its_median_is_the_schedulers_not_the_links() {
        let quiet = [23; 31].into_iter().chain([111]).collect::<Vec<_>>();
        assert!(!disturbed(&quiet));
        // Recorded on this VM: a probe over loopback with three threads spinning on its two cores.
        let mut busy = vec![24, 24, 30, 33, 47];
        busy.extend([3951, 3955, 3970, 3972, 3976, 3989, 3991, 3992, 3996, 3996, 3997, 3998, 3998, 3998]);
        busy.extend([3999, 3999, 4000, 4000, 4001, 4001, 4002, 4003, 4003, 4004, 4010, 4024, 8011]);
        assert_eq!(busy.len(), 32);
        assert!(disturbed(&busy), "median {}", median(&busy));
        // A slower link with ordinary jitter is not disturbed.
        let ethernet: Vec<u64> = (0..32).map(|i| 180 + i * 3).collect();
        assert!(!disturbed(&ethernet));
    }
}
