//! Tensor parallelism: a group of ranks, one process per node, each holding a slice of every layer
//! (whole heads, columns of the feed-forward, whole experts, rows of the output head: see
//! [`crate::model::slice`]), run every step together. Rank 0 (the leader) takes the steps: before
//! each it sends the step (its sequences, positions, and tokens or, in a group of later layers when
//! groups are chained as pipeline stages, the previous stage's hidden states) to the others; every
//! rank computes its part of each layer, and the group sums the parts twice per layer (after attention
//! and after the feed-forward) inside the graph ([`crate::ggml::Collective`]). At the end of the model
//! each rank has its rows of the logits, which the others send to the leader, which samples; a group
//! of earlier layers ends with the same hidden states on every rank, which its leader passes on. Every
//! rank adds the parts in rank order, so all of them hold the same hidden states, bit for bit.
//!
//! [`Group`] is a rank's end of this; it moves bytes through [`GroupLinks`]: TCP between nodes
//! ([`crate::transport::group`]), or channels between threads of one process ([`local`], for tests).

mod group;
pub mod local;
mod wire;

pub use group::{follow, follow_reporting, FollowedStep, Group};

/// A rank's links to the other ranks of its group: whole frames to and from one rank, and an exchange
/// with all of them at once. Errors say which link failed and why.
pub trait GroupLinks: Send {
    /// This rank's index in the group, and the group's size.
    fn rank(&self) -> usize;
    fn ranks(&self) -> usize;

    /// Sends one frame to rank `to`.
    fn send(&mut self, to: usize, frame: &[u8]) -> Result<(), String>;

    /// Receives the next frame from rank `from` into `frame` (waiting as long as it takes).
    fn recv(&mut self, from: usize, frame: &mut Vec<u8>) -> Result<(), String>;

    /// Sends `mine` to every other rank and receives the frame each sends at the same time into
    /// `theirs[rank]` (this rank's entry is left alone), without any rank waiting for another to finish
    /// sending first. A rank that does not answer within the links' time limit fails the exchange.
    fn exchange(&mut self, mine: &[u8], theirs: &mut [Vec<u8>]) -> Result<(), String>;
}
