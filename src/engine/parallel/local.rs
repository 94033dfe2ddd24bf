//! A group whose ranks are threads of one process, linked by channels: what the engine's tests run a
//! tensor-parallel model with, to compare it with the model whole without a network in between.

use super::GroupLinks;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Duration;

/// One rank's channels: a sender to each other rank, a receiver from each.
pub struct ChannelLinks {
    rank: usize,
    to: Vec<Option<Sender<Vec<u8>>>>,
    from: Vec<Option<Receiver<Vec<u8>>>>,
    timeout: Duration,
}

/// The links of every rank of a group of `ranks`, in rank order. A rank waits at most `timeout` for
/// another during an exchange.
pub fn channel_group(ranks: usize, timeout: Duration) -> Vec<ChannelLinks> {
    let mut links: Vec<ChannelLinks> = (0..ranks)
        .map(|rank| ChannelLinks {
            rank,
            to: (0..ranks).map(|_| None).collect(),
            from: (0..ranks).map(|_| None).collect(),
            timeout,
        })
        .collect();
    for a in 0..ranks {
        for b in 0..ranks {
            if a != b {
                let (tx, rx) = channel();
                links[a].to[b] = Some(tx);
                links[b].from[a] = Some(rx);
            }
        }
    }
    links
}

impl GroupLinks for ChannelLinks {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.to.len()
    }

    fn send(&mut self, to: usize, frame: &[u8]) -> Result<(), String> {
        let sender = self.to.get(to).and_then(Option::as_ref).ok_or(format!("no link to rank {to}"))?;
        sender.send(frame.to_vec()).map_err(|_| format!("rank {to} is gone"))
    }

    fn recv(&mut self, from: usize, frame: &mut Vec<u8>) -> Result<(), String> {
        let receiver = self.from.get(from).and_then(Option::as_ref).ok_or(format!("no link from rank {from}"))?;
        *frame = receiver.recv().map_err(|_| format!("rank {from} is gone"))?;
        Ok(())
    }

    fn exchange(&mut self, mine: &[u8], theirs: &mut [Vec<u8>]) -> Result<(), String> {
        let (rank, ranks) = (self.rank, self.ranks());
        for to in (0..ranks).filter(|&r| r != rank) {
            self.send(to, mine)?;
        }
        for from in (0..ranks).filter(|&r| r != rank) {
            let receiver = self.from[from].as_ref().expect("linked");
            theirs[from] =
                receiver.recv_timeout(self.timeout).map_err(|e| format!("rank {from} did not send its part ({e})"))?;
        }
        Ok(())
    }
}
