//! The receiving end of a ring link that RDMA was offered for: one thread polls the queue pair and
//! acknowledges each frame over TCP, another reads the TCP connection (frames after a switch), and the
//! stage takes frames in their order, each once, whichever way they came. An RDMA failure here asks the
//! previous stage to fall back.

use super::wire::{Backward, Forward};
use crate::net::secure::ConnectionCloser;
use crate::net::NetError;
use crate::transport::rdma::open::RdmaMessages;
use crate::transport::{FrameSink, FrameSource, TcpSink, TcpSource};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the RDMA thread busy-polls after the last frame before it starts to sleep between polls
/// (a decode step's frames come much closer together than this).
const SPIN_AFTER_ACTIVITY: Duration = Duration::from_millis(5);
const IDLE_POLL: Duration = Duration::from_micros(50);

enum Incoming {
    Frame(u64, Vec<u8>),
    Closed(NetError),
}

pub struct FailoverSource {
    incoming: Receiver<Incoming>,
    expected: u64,
    /// Frames that came before their turn (over TCP after a switch, while RDMA still delivered).
    early: BTreeMap<u64, Vec<u8>>,
    stop: Arc<AtomicBool>,
    /// Closes the connection when the stage lets go of the link (its threads then end).
    _closer: Option<ConnectionCloser>,
}

impl Drop for FailoverSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl FailoverSource {
    /// Takes frames from `rdma` (if any) and from the TCP connection (`source`, `sink`).
    pub fn start(rdma: Option<Box<dyn RdmaMessages>>, source: TcpSource, sink: TcpSink) -> FailoverSource {
        let (tx, incoming) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let closer = sink.closer().ok();
        if let Some(rdma) = rdma {
            let (tx, stop) = (tx.clone(), stop.clone());
            std::thread::Builder::new()
                .name("ring-rdma-in".into())
                .spawn(move || poll_rdma(rdma, sink, tx, &stop))
                .expect("spawning a thread");
        }
        let tcp_stop = stop.clone();
        std::thread::Builder::new()
            .name("ring-tcp-in".into())
            .spawn(move || read_tcp(source, tx, &tcp_stop))
            .expect("spawning a thread");
        FailoverSource { incoming, expected: 0, early: BTreeMap::new(), stop, _closer: closer }
    }
}

impl FrameSource for FailoverSource {
    fn recv_into(&mut self, frame: &mut Vec<u8>) -> Result<(), NetError> {
        loop {
            if let Some(bytes) = self.early.remove(&self.expected) {
                self.expected += 1;
                *frame = bytes;
                return Ok(());
            }
            match self.incoming.recv() {
                Ok(Incoming::Frame(seq, bytes)) if seq >= self.expected => {
                    self.early.insert(seq, bytes);
                }
                Ok(Incoming::Frame(..)) => {} // already had it
                Ok(Incoming::Closed(e)) => return Err(e),
                Err(_) => return Err(NetError::Closed),
            }
        }
    }
}

fn poll_rdma(mut rdma: Box<dyn RdmaMessages>, mut sink: TcpSink, tx: Sender<Incoming>, stop: &AtomicBool) {
    let mut seq = 0;
    let mut last_frame = Instant::now();
    let mut bytes = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match rdma.try_recv_into(&mut bytes) {
            Ok(true) => {
                if tx.send(Incoming::Frame(seq, std::mem::take(&mut bytes))).is_err() {
                    return;
                }
                if sink.send(&Backward::Ack { seq }.encode()).is_err() {
                    return;
                }
                seq += 1;
                last_frame = Instant::now();
            }
            Ok(false) if last_frame.elapsed() < SPIN_AFTER_ACTIVITY => std::hint::spin_loop(),
            Ok(false) => std::thread::sleep(IDLE_POLL),
            Err(e) => {
                if !stop.load(Ordering::Relaxed) {
                    tracing::warn!("RDMA from the previous stage failed at frame {seq}: {e}");
                    let _ = sink.send(&Backward::Fallback { from: seq, reason: e.to_string() }.encode());
                }
                return;
            }
        }
    }
}

fn read_tcp(mut source: TcpSource, tx: Sender<Incoming>, stop: &AtomicBool) {
    let mut bytes = Vec::new();
    loop {
        let incoming = match source.recv_into(&mut bytes).and_then(|()| {
            Forward::decode(&bytes).map(|f| match f {
                Forward::Frame { seq, bytes } => Some(Incoming::Frame(seq, bytes.to_vec())),
                Forward::Switch { .. } => None,
            })
        }) {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                // Frames come over TCP from now on: the RDMA thread stops.
                stop.store(true, Ordering::Relaxed);
                continue;
            }
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                let _ = tx.send(Incoming::Closed(e));
                return;
            }
        };
        if tx.send(incoming).is_err() {
            return;
        }
    }
}
