//! One rank's link to another rank of its group: the authenticated TCP connection, and — when the agent
//! chose RDMA for the pair and both ends opened a queue pair — RDMA, which then carries the frames while
//! TCP carries only a few control messages. Everything here is non-blocking: the group's waits drive
//! every peer at once ([`super::RankLinks`]).
//!
//! Over RDMA every frame is numbered by its place in the stream and ends with the sender's count of
//! frames received (an acknowledgement that costs no message of its own); the sender keeps a copy of
//! each frame until the peer's count covers it. UC queue pairs lose frames without a word, and a rank
//! may be busy for a long while before it sends, so a frame that has not come is not judged lost by
//! time alone: after [`RdmaPatience::probe`] the waiting end asks over TCP how many the peer has sent,
//! and only if the peer says it sent the frame and it still has not come after [`RdmaPatience::grace`]
//! is it lost. A lost or damaged frame, an RDMA error, or the peer asking, switches the pair to TCP:
//! each end says how many frames it has, sends again over TCP every frame the other lacks, and the pair
//! stays on TCP until the instance is launched again. No frame is lost and the group keeps running.

use super::MAX_GROUP_FRAME;
use crate::net::secure::SecureStream;
use crate::net::NetError;
use crate::transport::rdma::open::RdmaMessages;
use crate::transport::ring::RingTransport;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Called with each change of a pair's transport: the peer's rank, and the transport.
pub type GroupReport = Arc<dyn Fn(usize, RingTransport) + Send + Sync>;

/// Frames sent over RDMA that the peer has not acknowledged, at most, before the pair is judged broken
/// (a step has two sums per layer and the peer acknowledges with each of its own).
const MAX_UNACKNOWLEDGED: usize = 64;

/// Largest control message over TCP while RDMA carries the frames.
const MAX_CONTROL: usize = 4096;

/// How often a rank waiting for an RDMA frame looks at the TCP connection for the peer's control
/// messages (and for the peer closing it).
const LOOK_AT_TCP_EVERY: Duration = Duration::from_micros(200);

/// Bytes of the acknowledgement at the end of each RDMA frame.
const ACK_BYTES: usize = 8;

/// How long an RDMA frame may be awaited before the waiting end asks the peer whether it was sent, and
/// how long after the peer says so it may still take to arrive before it is judged lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaPatience {
    pub probe: Duration,
    pub grace: Duration,
}

impl Default for RdmaPatience {
    fn default() -> RdmaPatience {
        RdmaPatience { probe: Duration::from_secs(2), grace: Duration::from_secs(1) }
    }
}

/// A control message over TCP while RDMA carries the frames.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "control", rename_all = "snake_case")]
enum Control {
    /// "I have `received` of your frames; how many did you send?"
    Probe { received: u64 },
    /// "I have posted `sent` frames to you."
    Status { sent: u64 },
    /// "Switch to TCP: I have `received` of your frames; send the rest over TCP." Data frames follow it.
    Switch { received: u64, reason: String },
}

/// Decodes `bytes` as a control message, as a rank does (for the fuzz targets).
#[doc(hidden)]
pub fn decode_control(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Control>(bytes).is_ok()
}

pub(super) struct Peer {
    rank: usize,
    tcp: SecureStream,
    /// While RDMA carries the frames (or the switch to TCP is under way).
    rdma: Option<Rdma>,
    /// A control message being read.
    control: Vec<u8>,
    report: GroupReport,
}

struct Rdma {
    link: Box<dyn RdmaMessages>,
    device: String,
    /// Frames received from the peer.
    received: u64,
    /// Frames queued for the peer, and copies (with their acknowledgement) of the last `kept.len()`
    /// of them, which the peer may not have yet.
    queued: u64,
    kept: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    /// The frame being posted, and how much of it is.
    posting: u64,
    offset: usize,
    /// Since when a frame has been awaited; when TCP was last read; the count a probe went out for;
    /// since when the peer has said it sent a frame that has not come.
    awaited_since: Option<Instant>,
    tcp_read_at: Instant,
    probed: Option<u64>,
    overdue_since: Option<Instant>,
    /// This end asked to switch to TCP (why), and waits for the peer's switch.
    switching: Option<String>,
    patience: RdmaPatience,
}

impl Rdma {
    fn first_kept(&self) -> u64 {
        self.queued - self.kept.len() as u64
    }

    /// The peer has every frame below `acknowledged`: their copies go.
    fn forget_below(&mut self, acknowledged: u64) {
        while self.first_kept() < acknowledged.min(self.posting) {
            if let Some(copy) = self.kept.pop_front() {
                self.spare.push(copy);
            }
        }
    }
}

fn failed(rank: usize) -> impl Fn(NetError) -> String {
    move |e| format!("the link with rank {rank} failed: {e}")
}

impl Peer {
    /// The link with rank `rank` over `tcp`.
    pub fn tcp(rank: usize, tcp: SecureStream) -> Peer {
        Peer { rank, tcp, rdma: None, control: Vec::new(), report: Arc::new(|_, _| {}) }
    }

    /// Where changes of the pair's transport go.
    pub fn report_to(&mut self, report: GroupReport) {
        self.report = report;
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn tcp_stream(&mut self) -> &mut SecureStream {
        &mut self.tcp
    }

    /// Carries the frames over `link` (on `device`) from now on; both ends switch at the same point.
    pub fn use_rdma(&mut self, link: Box<dyn RdmaMessages>, device: String, patience: RdmaPatience) {
        self.rdma = Some(Rdma {
            link,
            device,
            received: 0,
            queued: 0,
            kept: VecDeque::new(),
            spare: Vec::new(),
            posting: 0,
            offset: 0,
            awaited_since: None,
            tcp_read_at: Instant::now(),
            probed: None,
            overdue_since: None,
            switching: None,
            patience,
        });
    }

    /// The RDMA link while it carries the frames (not once a switch to TCP has begun).
    fn running(&mut self) -> Option<&mut Rdma> {
        self.rdma.as_mut().filter(|r| r.switching.is_none())
    }

    fn on_rdma(&self) -> bool {
        self.rdma.as_ref().is_some_and(|r| r.switching.is_none())
    }

    /// The RDMA device that carries the frames, while one does.
    #[cfg(test)]
    pub fn rdma_device(&self) -> Option<&str> {
        self.rdma.as_ref().filter(|_| self.on_rdma()).map(|r| r.device.as_str())
    }

    /// Whether a wait for this peer should poll its TCP socket (its frames come over TCP, or the switch
    /// to TCP is under way) rather than spin on RDMA completions.
    pub fn waits_on_tcp(&self) -> bool {
        !self.on_rdma()
    }

    /// Whether this end waits for the peer's word to finish the switch to TCP.
    pub fn switching(&self) -> bool {
        self.rdma.as_ref().is_some_and(|r| r.switching.is_some())
    }

    /// Whether bytes wait to be written to the TCP socket.
    pub fn tcp_has_output(&self) -> bool {
        self.tcp.has_output()
    }

    pub fn socket(&self) -> &std::net::TcpStream {
        self.tcp.socket()
    }

    /// Whether queued frames (or TCP bytes) wait to go out.
    pub fn has_output(&self) -> bool {
        match &self.rdma {
            Some(r) if r.switching.is_none() => r.posting < r.queued || self.tcp.has_output(),
            Some(_) => true,
            None => self.tcp.has_output(),
        }
    }

    /// Queues `frame` for the peer; [`Peer::push`] sends it.
    pub fn queue(&mut self, frame: &[u8]) -> Result<(), String> {
        let rank = self.rank;
        let Some(rdma) = &mut self.rdma else { return self.tcp.queue(frame).map_err(failed(rank)) };
        if rdma.kept.len() >= MAX_UNACKNOWLEDGED && rdma.switching.is_none() {
            let reason = format!("rank {rank} acknowledged none of the last {MAX_UNACKNOWLEDGED} frames over RDMA");
            self.fall_back(reason)?;
        }
        let Some(rdma) = &mut self.rdma else { return self.tcp.queue(frame).map_err(failed(rank)) };
        let mut copy = rdma.spare.pop().unwrap_or_default();
        copy.clear();
        copy.extend_from_slice(frame);
        copy.extend_from_slice(&rdma.received.to_le_bytes());
        rdma.kept.push_back(copy);
        rdma.queued += 1;
        Ok(())
    }

    /// Sends what can go now of the queued frames, without waiting.
    pub fn push(&mut self) -> Result<(), String> {
        if let Some(rdma) = self.running() {
            let mut error = None;
            while rdma.posting < rdma.queued {
                let frame = &rdma.kept[(rdma.posting - rdma.first_kept()) as usize];
                if let Err(e) = rdma.link.send_some(frame, &mut rdma.offset) {
                    error = Some(format!("RDMA failed: {e}"));
                    break;
                }
                if rdma.offset < frame.len() {
                    break;
                }
                rdma.posting += 1;
                rdma.offset = 0;
            }
            if let Some(reason) = error {
                self.fall_back(reason)?;
            } else if rdma.posting < rdma.queued {
                // Waiting for credits: the peer may be asking for something meanwhile.
                self.look_at_tcp(false)?;
            }
        } else if self.rdma.is_some() {
            self.look_at_tcp(true)?;
        }
        self.tcp.write_some().map_err(failed(self.rank))
    }

    /// Reads what the TCP socket has now (frames over TCP, or control messages).
    pub fn read(&mut self) -> Result<(), String> {
        self.tcp.read_some().map_err(failed(self.rank))
    }

    /// Takes the peer's next frame into `frame` (cleared before its first call for a frame) if it has
    /// come, without waiting: `Ok(true)` then.
    pub fn pull(&mut self, frame: &mut Vec<u8>) -> Result<bool, String> {
        loop {
            let Some(rdma) = &mut self.rdma else {
                return self.tcp.next_frame(frame, MAX_GROUP_FRAME).map_err(failed(self.rank));
            };
            if rdma.switching.is_some() {
                self.look_at_tcp(true)?;
                if self.rdma.is_none() {
                    frame.clear();
                    continue;
                }
                return Ok(false);
            }
            match rdma.link.recv_some(frame) {
                Ok(true) => {
                    let Some(body) = frame.len().checked_sub(ACK_BYTES) else {
                        self.fall_back(format!("rank {} sent a frame without its acknowledgement", self.rank))?;
                        continue;
                    };
                    let mut acknowledgement = [0u8; ACK_BYTES];
                    acknowledgement.copy_from_slice(&frame[body..]);
                    let acknowledged = u64::from_le_bytes(acknowledgement);
                    frame.truncate(body);
                    rdma.received += 1;
                    rdma.forget_below(acknowledged);
                    (rdma.awaited_since, rdma.probed, rdma.overdue_since) = (None, None, None);
                    return Ok(true);
                }
                Ok(false) => {
                    self.watch()?;
                    if self.on_rdma() {
                        return Ok(false);
                    }
                }
                Err(e) => self.fall_back(format!("RDMA failed: {e}"))?,
            }
        }
    }

    /// While an RDMA frame is awaited: looks at TCP now and then, asks the peer whether it sent the
    /// frame once it is late, and judges it lost once the peer said so and it still has not come.
    fn watch(&mut self) -> Result<(), String> {
        let now = Instant::now();
        let Some(rdma) = &mut self.rdma else { return Ok(()) };
        let since = *rdma.awaited_since.get_or_insert(now);
        if now.duration_since(rdma.tcp_read_at) >= LOOK_AT_TCP_EVERY {
            self.look_at_tcp(true)?;
        }
        let Some(rdma) = self.running() else { return Ok(()) };
        if now.duration_since(since) >= rdma.patience.probe && rdma.probed != Some(rdma.received) {
            rdma.probed = Some(rdma.received);
            let probe = Control::Probe { received: rdma.received };
            self.send_control(&probe)?;
        }
        let Some(rdma) = &self.rdma else { return Ok(()) };
        if let Some(overdue) = rdma.overdue_since.filter(|t| now.duration_since(*t) >= rdma.patience.grace) {
            let waited = now.duration_since(overdue);
            let reason = format!(
                "frame {} from rank {} did not arrive over RDMA ({waited:?} after it was sent)",
                rdma.received, self.rank
            );
            self.fall_back(reason)?;
        }
        Ok(())
    }

    fn send_control(&mut self, control: &Control) -> Result<(), String> {
        let bytes = serde_json::to_vec(control).expect("a control message serializes");
        self.tcp.queue(&bytes).map_err(failed(self.rank))?;
        self.tcp.write_some().map_err(failed(self.rank))
    }

    /// Reads the TCP connection (when `read`) and acts on the control messages in it; stops after the
    /// peer's switch, as data frames follow it.
    fn look_at_tcp(&mut self, read: bool) -> Result<(), String> {
        if read {
            self.tcp.read_some().map_err(failed(self.rank))?;
        }
        if let Some(rdma) = &mut self.rdma {
            rdma.tcp_read_at = Instant::now();
        }
        while self.rdma.is_some() {
            if !self.tcp.next_frame(&mut self.control, MAX_CONTROL).map_err(failed(self.rank))? {
                return Ok(());
            }
            let control: Control = serde_json::from_slice(&self.control)
                .map_err(|e| format!("rank {} sent a malformed control message: {e}", self.rank))?;
            self.control.clear();
            let Some(rdma) = &mut self.rdma else { break };
            match control {
                Control::Probe { .. } if rdma.switching.is_some() => {}
                Control::Probe { .. } => {
                    let status = Control::Status { sent: rdma.posting };
                    self.send_control(&status)?;
                }
                Control::Status { sent } => {
                    if sent > rdma.received && rdma.switching.is_none() {
                        rdma.overdue_since.get_or_insert_with(Instant::now);
                    }
                }
                Control::Switch { received, reason } => {
                    let reason = match rdma.switching.take() {
                        Some(ours) => ours,
                        None => {
                            let answer = Control::Switch { received: rdma.received, reason: reason.clone() };
                            self.send_control(&answer)?;
                            format!("rank {} fell back: {reason}", self.rank)
                        }
                    };
                    self.finish_switch(received, reason)?;
                }
            }
        }
        Ok(())
    }

    /// Moves the pair to TCP: asks the peer to switch too, saying how many of its frames this end has.
    fn fall_back(&mut self, reason: String) -> Result<(), String> {
        let rank = self.rank;
        let Some(rdma) = self.running() else { return Ok(()) };
        tracing::warn!("the RDMA link ({}) with rank {rank} falls back to TCP: {reason}", rdma.device);
        rdma.switching = Some(reason.clone());
        let switch = Control::Switch { received: rdma.received, reason };
        self.send_control(&switch)
    }

    /// Both ends have said how many frames they have: sends again over TCP every frame from
    /// `peer_received` on, and leaves RDMA.
    fn finish_switch(&mut self, peer_received: u64, reason: String) -> Result<(), String> {
        let Some(rdma) = self.rdma.take() else { return Ok(()) };
        let first = rdma.first_kept();
        if peer_received < first || peer_received > rdma.queued {
            return Err(format!(
                "rank {} asked for frames from {peer_received} on, but this end kept {first} to {}",
                self.rank, rdma.queued
            ));
        }
        for copy in rdma.kept.iter().skip((peer_received - first) as usize) {
            self.tcp.queue(&copy[..copy.len() - ACK_BYTES]).map_err(failed(self.rank))?;
        }
        (self.report)(self.rank, RingTransport::Tcp { reason });
        self.tcp.write_some().map_err(failed(self.rank))
    }
}
