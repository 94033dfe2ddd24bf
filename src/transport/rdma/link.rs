//! Messages over a connected queue pair: [`SlotLink`] sends and receives whole messages through the
//! framing layer, posts a send only with a free send slot (credits), keeps every receive slot posted,
//! checks every completion's status and gives up on any wait after a timeout. It drives a
//! [`QueuePair`] — the verbs shim's, or an in-memory one in tests — so this logic is tested without
//! RDMA hardware.

use super::framing::{Framer, Reassembler, SendCredits};
use super::RdmaError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub slot: u32,
    pub receive: bool,
    /// 0 for success (`IBV_WC_SUCCESS`), else the verbs status code.
    pub status: u32,
}

/// The operations of a connected UC queue pair with `slots` send and `slots` receive slots.
pub trait QueuePair: Send {
    fn slots(&self) -> u32;
    /// A slot's memory (`slot_bytes` long); `receive` picks the receive slots.
    fn slot(&mut self, receive: bool, slot: u32) -> &mut [u8];
    /// Posts a receive of the whole slot.
    fn post_recv(&mut self, slot: u32) -> Result<(), RdmaError>;
    /// Sends the whole slot (the receiver's slots are the same size: equal frame counts).
    fn post_send(&mut self, slot: u32) -> Result<(), RdmaError>;
    /// Appends the completions that are ready (possibly none) to `out`.
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<(), RdmaError>;
}

pub struct SlotLink<Q: QueuePair> {
    qp: Q,
    credits: SendCredits,
    framer: Framer,
    reassembler: Reassembler,
    /// Receive slots whose completions arrived but were not read yet, in order.
    arrived: VecDeque<u32>,
    completions: Vec<Completion>,
    timeout: Duration,
    /// Set by another thread to cut every wait short.
    abort: Option<Arc<AtomicBool>>,
}

impl<Q: QueuePair> SlotLink<Q> {
    /// A link over `qp` that posts all its receive slots now. `max_message` bounds what the peer may
    /// send; every wait gives up after `timeout`.
    pub fn new(mut qp: Q, max_message: usize, timeout: Duration) -> Result<SlotLink<Q>, RdmaError> {
        (0..qp.slots()).try_for_each(|slot| qp.post_recv(slot))?;
        Ok(SlotLink {
            credits: SendCredits::new(qp.slots()),
            qp,
            framer: Framer::default(),
            reassembler: Reassembler::new(max_message),
            arrived: VecDeque::new(),
            completions: Vec::new(),
            timeout,
            abort: None,
        })
    }

    /// Reads completions: send slots go back to the credits, received slots queue up to be read.
    fn poll(&mut self) -> Result<usize, RdmaError> {
        self.completions.clear();
        self.qp.poll(&mut self.completions)?;
        for c in &self.completions {
            if c.status != 0 {
                let what = if c.receive { "receive" } else { "send" };
                return Err(RdmaError::Completion { what, status: c.status });
            }
            if c.receive {
                self.arrived.push_back(c.slot);
            } else {
                self.credits.give_back(c.slot)?;
            }
        }
        Ok(self.completions.len())
    }

    /// Busy-polls (microseconds matter here) until `ready` holds, or the timeout.
    fn wait(&mut self, ready: impl Fn(&SlotLink<Q>) -> bool) -> Result<(), RdmaError> {
        let start = Instant::now();
        while !ready(self) {
            if self.abort.as_ref().is_some_and(|a| a.load(Ordering::Relaxed)) {
                return Err(RdmaError::Aborted);
            }
            if self.poll()? == 0 {
                if start.elapsed() > self.timeout {
                    return Err(RdmaError::Timeout(self.timeout));
                }
                std::hint::spin_loop();
            }
        }
        Ok(())
    }

    /// Every wait ends with [`RdmaError::Aborted`] once `flag` is set (by another thread).
    pub fn abort_when(&mut self, flag: Arc<AtomicBool>) {
        self.abort = Some(flag);
    }

    /// Sends `message` in as many slots as it needs.
    pub fn send(&mut self, message: &[u8]) -> Result<(), RdmaError> {
        let mut offset = 0;
        loop {
            self.wait(|l| l.credits.available() > 0)?;
            let slot = self.credits.take().expect("a credit is free");
            offset = self.framer.write_fragment(message, offset, self.qp.slot(false, slot));
            self.qp.post_send(slot)?;
            if offset == message.len() {
                return Ok(());
            }
        }
    }

    /// Receives the next message into `out`.
    pub fn recv_into(&mut self, out: &mut Vec<u8>) -> Result<(), RdmaError> {
        loop {
            self.wait(|l| !l.arrived.is_empty())?;
            let slot = self.arrived.pop_front().expect("a slot arrived");
            let complete = self.reassembler.accept(self.qp.slot(true, slot));
            self.qp.post_recv(slot)?;
            if complete? {
                out.clear();
                out.extend_from_slice(self.reassembler.message());
                return Ok(());
            }
        }
    }

    /// Receives the next message into `out` if one has begun to arrive (then it waits for the rest);
    /// `Ok(false)` at once if nothing has.
    pub fn try_recv_into(&mut self, out: &mut Vec<u8>) -> Result<bool, RdmaError> {
        if self.arrived.is_empty() {
            self.poll()?;
            if self.arrived.is_empty() {
                return Ok(false);
            }
        }
        self.recv_into(out).map(|()| true)
    }

    /// Posts as much of `message` (not empty), from `*offset` on, as the free send slots take without
    /// waiting, and moves `*offset` past it (to `message.len()` once every fragment is posted). For a
    /// sender that must keep receiving while it sends: two ends that both waited for credits to send a
    /// message larger than their slots would wait for each other for ever.
    pub fn send_some(&mut self, message: &[u8], offset: &mut usize) -> Result<(), RdmaError> {
        debug_assert!(!message.is_empty(), "send_some sends a message that has bytes");
        self.poll()?;
        while *offset < message.len() {
            let Some(slot) = self.credits.take() else { return Ok(()) };
            *offset = self.framer.write_fragment(message, *offset, self.qp.slot(false, slot));
            self.qp.post_send(slot)?;
        }
        Ok(())
    }

    /// Takes the slots that have arrived, without waiting, and reposts them; `Ok(true)` when they
    /// completed a message, which is then in `out` (the slots after it stay for the next call).
    pub fn recv_some(&mut self, out: &mut Vec<u8>) -> Result<bool, RdmaError> {
        self.poll()?;
        while let Some(slot) = self.arrived.pop_front() {
            let complete = self.reassembler.accept(self.qp.slot(true, slot));
            self.qp.post_recv(slot)?;
            if complete? {
                out.clear();
                out.extend_from_slice(self.reassembler.message());
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Waits until every send has completed (before closing the link).
    pub fn flush(&mut self) -> Result<(), RdmaError> {
        self.wait(|l| l.credits.all_free())
    }
}

#[cfg(test)]
mod tests;
