//! The sending end of a ring link that RDMA carries: frames go over the queue pair, a copy of each is
//! kept until the next stage acknowledges it over TCP, and on any failure — an RDMA error here, a
//! fallback asked for by the next stage, an acknowledgement overdue — the link switches to TCP and sends
//! again what was not acknowledged. A reader thread takes the acknowledgements; a watchdog thread looks
//! for overdue ones.

use super::wire::{Backward, Forward};
use super::{RingTransport, TransportReport};
use crate::net::secure::ConnectionCloser;
use crate::net::NetError;
use crate::transport::rdma::open::RdmaMessages;
use crate::transport::{FrameSink, FrameSource, TcpSink, TcpSource};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// Most frames in flight without an acknowledgement before the link is judged broken (the ring has a
/// few per sequence at most).
const MAX_UNACKED: usize = 4096;

pub struct FailoverSink {
    state: Arc<Mutex<SenderState>>,
    /// Closes the connection with the sink, so the acknowledgement reader and the next stage see it end.
    _closer: Option<ConnectionCloser>,
}

/// What the next stage said, kept without the state's lock (a send may hold it while it waits for RDMA
/// credits that will not come): how far it acknowledged, and whether it asked to fall back.
#[derive(Default)]
struct FromPeer {
    /// Every frame below this one was acknowledged.
    acked_below: AtomicU64,
    asked: Arc<AtomicBool>,
    reason: Mutex<Option<String>>,
}

impl FromPeer {
    fn reason(&self) -> Option<String> {
        self.asked.load(Ordering::Relaxed).then(|| self.reason.lock().ok().and_then(|r| r.clone())).flatten()
    }
}

struct SenderState {
    tcp: TcpSink,
    /// `None` once the link is on TCP.
    rdma: Option<Box<dyn RdmaMessages>>,
    next_seq: u64,
    /// Frames sent over RDMA and not acknowledged yet, oldest first, with when they went.
    unacked: VecDeque<(u64, Vec<u8>, Instant)>,
    report: Option<TransportReport>,
    scratch: Vec<u8>,
    peer: Arc<FromPeer>,
}

fn lock(state: &Mutex<SenderState>) -> MutexGuard<'_, SenderState> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SenderState {
    fn send_tcp(&mut self, message: Forward<'_>) -> Result<(), NetError> {
        message.encode(&mut self.scratch);
        self.tcp.send(&self.scratch)
    }

    fn send(&mut self, frame: &[u8]) -> Result<(), NetError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(reason) = self.peer.reason() {
            self.fall_back(reason)?;
        }
        let Some(rdma) = self.rdma.as_mut() else {
            return self.send_tcp(Forward::Frame { seq, bytes: frame });
        };
        let sent = rdma.send(frame);
        self.forget_acknowledged();
        self.unacked.push_back((seq, frame.to_vec(), Instant::now()));
        match sent {
            Err(e) => {
                let reason = self.peer.reason().unwrap_or_else(|| format!("RDMA failed: {e}"));
                self.fall_back(reason)
            }
            Ok(()) if self.unacked.len() > MAX_UNACKED => {
                self.fall_back(format!("{MAX_UNACKED} frames went unacknowledged over RDMA"))
            }
            Ok(()) => Ok(()),
        }
    }

    /// Moves the link to TCP (if it is not there yet): says so, then sends again every frame not
    /// acknowledged.
    fn fall_back(&mut self, reason: String) -> Result<(), NetError> {
        if self.rdma.take().is_none() {
            return Ok(());
        }
        tracing::warn!("a ring link falls back from RDMA to TCP: {reason}");
        if let Some(report) = &self.report {
            report(RingTransport::Tcp { reason });
        }
        let from = self.unacked.front().map_or(self.next_seq, |(seq, ..)| *seq);
        self.send_tcp(Forward::Switch { from })?;
        while let Some((seq, bytes, _)) = self.unacked.pop_front() {
            self.send_tcp(Forward::Frame { seq, bytes: &bytes })?;
        }
        Ok(())
    }

    /// Forgets the frames the next stage has acknowledged.
    fn forget_acknowledged(&mut self) {
        let below = self.peer.acked_below.load(Ordering::Relaxed);
        while self.unacked.front().is_some_and(|(seq, ..)| *seq < below) {
            self.unacked.pop_front();
        }
    }
}

impl FailoverSink {
    /// A link whose frames go over `rdma`; `source` and `sink` are its TCP connection. A frame not
    /// acknowledged within `ack_timeout` moves it to TCP.
    pub fn start(
        mut rdma: Box<dyn RdmaMessages>,
        source: TcpSource,
        sink: TcpSink,
        report: TransportReport,
        ack_timeout: Duration,
    ) -> FailoverSink {
        let closer = sink.closer().ok();
        let peer = Arc::new(FromPeer::default());
        rdma.abort_when(peer.asked.clone());
        let state = Arc::new(Mutex::new(SenderState {
            tcp: sink,
            rdma: Some(rdma),
            next_seq: 0,
            unacked: VecDeque::new(),
            report: Some(report),
            scratch: Vec::new(),
            peer: peer.clone(),
        }));
        let weak = Arc::downgrade(&state);
        std::thread::Builder::new()
            .name("ring-acks".into())
            .spawn(move || read_acknowledgements(source, weak, &peer))
            .expect("spawning a thread");
        let weak = Arc::downgrade(&state);
        std::thread::Builder::new()
            .name("ring-watchdog".into())
            .spawn(move || watch(weak, ack_timeout))
            .expect("spawning a thread");
        FailoverSink { state, _closer: closer }
    }

    /// A link that RDMA was offered for but does not carry: frames go over TCP in the numbered form.
    pub fn tcp_only(sink: TcpSink) -> FailoverSink {
        let state = SenderState {
            tcp: sink,
            rdma: None,
            next_seq: 0,
            unacked: VecDeque::new(),
            report: None,
            scratch: Vec::new(),
            peer: Arc::default(),
        };
        FailoverSink { state: Arc::new(Mutex::new(state)), _closer: None }
    }

    /// Tells the next stage that frames come over TCP from now on.
    pub fn switch_now(&mut self) -> Result<(), NetError> {
        let mut state = lock(&self.state);
        let from = state.next_seq;
        state.send_tcp(Forward::Switch { from })
    }
}

impl FrameSink for FailoverSink {
    fn send(&mut self, frame: &[u8]) -> Result<(), NetError> {
        lock(&self.state).send(frame)
    }
}

/// The next stage's acknowledgements and fallback requests, until the connection closes.
fn read_acknowledgements(mut source: TcpSource, state: Weak<Mutex<SenderState>>, peer: &FromPeer) {
    let mut bytes = Vec::new();
    while source.recv_into(&mut bytes).is_ok() {
        let reason = match Backward::decode(&bytes) {
            Ok(Backward::Ack { seq }) => {
                peer.acked_below.fetch_max(seq + 1, Ordering::Relaxed);
                continue;
            }
            Ok(Backward::Fallback { from, reason }) => {
                peer.acked_below.fetch_max(from, Ordering::Relaxed);
                format!("the next stage: {reason}")
            }
            Err(e) => format!("the next stage sent {e}"),
        };
        *peer.reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.clone());
        peer.asked.store(true, Ordering::Relaxed);
        let Some(state) = state.upgrade() else { return };
        let mut state = lock(&state);
        state.forget_acknowledged();
        if state.fall_back(reason).is_err() {
            return;
        }
    }
}

/// Falls back when an acknowledgement is overdue; ends when the link is on TCP or gone.
fn watch(state: Weak<Mutex<SenderState>>, ack_timeout: Duration) {
    loop {
        std::thread::sleep(ack_timeout / 4);
        let Some(state) = state.upgrade() else { return };
        let mut state = lock(&state);
        if state.rdma.is_none() {
            return;
        }
        state.forget_acknowledged();
        if let Some((seq, _, sent)) = state.unacked.front() {
            if sent.elapsed() > ack_timeout {
                let reason = format!("frame {seq} was not acknowledged within {ack_timeout:?}");
                if state.fall_back(reason).is_err() {
                    return;
                }
            }
        }
    }
}
