//! The links of a tensor-parallel group between nodes: one authenticated, encrypted TCP connection
//! (TCP_NODELAY, keyed by the cluster secret) between every two ranks, and over it RDMA where the agent
//! chose it for the pair ([`peer`]: frames over the queue pair, TCP for control, the same fallback to
//! TCP as the ring's links). They are used from the rank's compute thread without a runtime. An exchange
//! writes this rank's frame to every peer and reads each peer's at the same time, waiting on all the
//! links at once, so no rank waits for another to finish sending first whatever the frames' size, and a
//! sum costs one trip over the slowest link.
//!
//! The ranks connect when the agent says where every rank listens: a rank connects to each rank
//! before it and accepts each rank after it; a connecting rank's first frame says which rank it is.
//! Then every rank starts RDMA with the others ([`offer`]). Each link's buffers are kept between steps,
//! so a decode step allocates nothing.

mod offer;
mod peer;

pub use offer::{decode_offer, RdmaSetup};
use peer::Peer;
pub use peer::{decode_control, GroupReport, RdmaPatience};

use crate::engine::parallel::GroupLinks;
use crate::net::secure::{self, Psk, SecureStream};
use crate::net::{ConnectionKind, NetError, SecureReader, SecureWriter};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// Largest frame between ranks (the logits of a whole batch of a large vocabulary, or a prefill
/// chunk's partial sums of a wide model).
pub const MAX_GROUP_FRAME: usize = 512 << 20;

/// How long an exchange waits for the slowest rank: a rank computes its share of one layer between
/// two exchanges, which even a long prompt on a slow node does within this.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long an exchange looks for the others' parts before it sleeps until they come.
const SPIN: Duration = Duration::from_micros(500);

/// Once a wait on an RDMA link has gone on past the spin, how long it naps between looks: briefly at
/// first (a part on its way), longer once the wait has lasted (a follower waiting for the next request),
/// so that an idle rank does not keep a core busy.
const RDMA_NAP: Duration = Duration::from_micros(50);
const RDMA_IDLE_NAP: Duration = Duration::from_millis(1);
const RDMA_IDLE_AFTER: Duration = Duration::from_secs(1);

/// How long the ranks have to connect to each other once told where each listens.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// One rank's links to the others.
pub struct RankLinks {
    rank: usize,
    peers: Vec<Option<Peer>>,
    timeout: Duration,
    /// Kept between calls, so that a step's sends and receives allocate nothing: which ranks' frames
    /// are awaited, and where a lone receive's frame is put together.
    awaited: Vec<bool>,
    frames: Vec<Vec<u8>>,
}

/// Connects rank `rank` to the other ranks of its group, which listen at `addresses` (rank order; this
/// rank's own entry is not used), accepting on `listener` the ranks after it.
pub async fn connect(
    rank: usize,
    addresses: &[SocketAddr],
    listener: &TcpListener,
    secret: &Psk,
) -> Result<RankLinks, String> {
    let ranks = addresses.len();
    if rank >= ranks {
        return Err(format!("rank {rank} is not in a group of {ranks}"));
    }
    let mut peers: Vec<Option<SecureStream>> = (0..ranks).map(|_| None).collect();
    let work = async {
        for (to, &addr) in addresses.iter().enumerate().take(rank) {
            let (reader, mut writer) =
                connect_to(addr, secret).await.map_err(|e| format!("cannot reach rank {to} at {addr}: {e}"))?;
            writer
                .write_frame(&(rank as u32).to_le_bytes())
                .await
                .map_err(|e| format!("cannot greet rank {to}: {e}"))?;
            peers[to] = Some(secure::into_stream(reader, writer).map_err(|e| e.to_string())?);
        }
        // One acceptor throughout: the later ranks' handshakes run at once, and none is dropped when
        // another completes first.
        let mut acceptor = super::SecureAcceptor::new(listener, secret);
        while peers.iter().enumerate().any(|(r, p)| r > rank && p.is_none()) {
            let (mut reader, writer) = acceptor.next().await.map_err(|e| e.to_string())?;
            let hello = reader.read_frame(4).await.map_err(|e| format!("a rank did not say which it is: {e}"))?;
            let from = u32::from_le_bytes(hello.as_slice().try_into().map_err(|_| "a malformed greeting")?) as usize;
            match peers.get_mut(from) {
                Some(slot @ None) if from > rank => {
                    *slot = Some(secure::into_stream(reader, writer).map_err(|e| e.to_string())?)
                }
                _ => return Err(format!("a connection claimed to be rank {from}, which rank {rank} does not expect")),
            }
        }
        Ok::<_, String>(())
    };
    tokio::time::timeout(CONNECT_TIMEOUT, work)
        .await
        .map_err(|_| format!("the group's ranks did not all connect within {CONNECT_TIMEOUT:?}"))??;
    let peers = peers.into_iter().enumerate().map(|(r, stream)| stream.map(|s| Peer::tcp(r, s))).collect();
    Ok(RankLinks {
        rank,
        peers,
        timeout: EXCHANGE_TIMEOUT,
        awaited: vec![false; ranks],
        frames: vec![Vec::new(); ranks],
    })
}

async fn connect_to(addr: SocketAddr, secret: &Psk) -> Result<(SecureReader, SecureWriter), NetError> {
    // The rank may still be starting; keep trying for a while.
    let mut tries = 0;
    loop {
        match secure::connect(addr, ConnectionKind::Stage, secret).await {
            Ok(connection) => return Ok(connection),
            // Not listening yet: try again. A failed handshake (another secret) is final.
            Err(e) if tries < 50 && !matches!(e, NetError::Handshake) => {
                tries += 1;
                tracing::debug!("connecting to a rank at {addr}: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

fn left(deadline: Option<Instant>) -> Result<Option<Duration>, String> {
    match deadline {
        None => Ok(None),
        Some(d) => d.checked_duration_since(Instant::now()).map(Some).ok_or_else(|| "timed out".to_string()),
    }
}

impl RankLinks {
    fn peer(&mut self, rank: usize) -> Result<&mut Peer, String> {
        self.peers.get_mut(rank).and_then(Option::as_mut).ok_or_else(|| format!("no link to rank {rank}"))
    }

    /// Drives every link (sends what can go, takes what has come from each rank `awaited` marks into
    /// `theirs[rank]`, unmarking it once whole) until the awaited frames are in and nothing waits to go
    /// out, or the `deadline` (then the error is `late`'s, given the ranks still awaited).
    fn drive(
        &mut self,
        awaited: &mut [bool],
        theirs: &mut [Vec<u8>],
        deadline: Option<Instant>,
        late: impl Fn(&[bool]) -> String,
    ) -> Result<(), String> {
        let started = Instant::now();
        loop {
            for peer in self.peers.iter_mut().flatten() {
                let r = peer.rank();
                peer.push()?;
                if awaited[r] && peer.pull(&mut theirs[r])? {
                    awaited[r] = false;
                }
            }
            let writing = self.peers.iter().flatten().any(Peer::has_output);
            if !writing && !awaited.iter().any(|a| *a) {
                return Ok(());
            }
            let waited = started.elapsed();
            // A part is due within microseconds once its rank is done computing: look again for a while
            // before sleeping, as waking a sleeping thread costs more than that.
            if waited < SPIN {
                for peer in self.peers.iter_mut().flatten().filter(|p| awaited[p.rank()] && p.waits_on_tcp()) {
                    peer.read()?;
                }
                // Let whatever else wants this core run meanwhile (the node's agent, the kernel's network
                // work): on a machine whose cores the ranks fill, it would otherwise preempt a rank that
                // computes.
                std::thread::yield_now();
                continue;
            }
            let mut left = left(deadline).map_err(|_| late(awaited))?;
            let on_rdma =
                self.peers.iter().flatten().any(|p| !p.waits_on_tcp() && (awaited[p.rank()] || p.has_output()));
            if on_rdma {
                let nap = if waited < RDMA_IDLE_AFTER { RDMA_NAP } else { RDMA_IDLE_NAP };
                left = Some(left.map_or(nap, |l| l.min(nap)));
            }
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(self.peers.len());
            let mut which = Vec::with_capacity(self.peers.len());
            for peer in self.peers.iter().flatten().filter(|p| p.waits_on_tcp()) {
                let mut events = PollFlags::empty();
                if awaited[peer.rank()] || peer.switching() {
                    events |= PollFlags::IN;
                }
                if peer.tcp_has_output() {
                    events |= PollFlags::OUT;
                }
                if !events.is_empty() {
                    fds.push(PollFd::new(peer.socket(), events));
                    which.push(peer.rank());
                }
            }
            let timeout = left.map(|d| Timespec { tv_sec: d.as_secs() as _, tv_nsec: d.subsec_nanos() as _ });
            if fds.is_empty() {
                std::thread::sleep(left.unwrap_or(RDMA_IDLE_NAP));
                continue;
            }
            match poll(&mut fds, timeout.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(format!("waiting for the group's links failed: {e}")),
            }
            let readable: Vec<usize> =
                fds.iter().zip(&which).filter(|(fd, _)| !fd.revents().is_empty()).map(|(_, &r)| r).collect();
            drop(fds);
            for r in readable {
                self.peer(r)?.read()?;
            }
        }
    }
}

impl GroupLinks for RankLinks {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.peers.len()
    }

    fn send(&mut self, to: usize, frame: &[u8]) -> Result<(), String> {
        self.peer(to)?.queue(frame)?;
        let deadline = Some(Instant::now() + self.timeout);
        let timeout = self.timeout;
        let mut awaited = std::mem::take(&mut self.awaited);
        awaited.fill(false);
        let sent = self
            .drive(&mut awaited, &mut [], deadline, |_| format!("rank {to} did not take a frame within {timeout:?}"));
        self.awaited = awaited;
        sent
    }

    fn recv(&mut self, from: usize, frame: &mut Vec<u8>) -> Result<(), String> {
        self.peer(from)?;
        let (mut awaited, mut frames) = (std::mem::take(&mut self.awaited), std::mem::take(&mut self.frames));
        awaited.fill(false);
        awaited[from] = true;
        std::mem::swap(&mut frames[from], frame);
        frames[from].clear();
        let received = self.drive(&mut awaited, &mut frames, None, |_| String::new());
        std::mem::swap(&mut frames[from], frame);
        (self.awaited, self.frames) = (awaited, frames);
        received
    }

    fn exchange(&mut self, mine: &[u8], theirs: &mut [Vec<u8>]) -> Result<(), String> {
        let deadline = Some(Instant::now() + self.timeout);
        for peer in self.peers.iter_mut().flatten() {
            peer.queue(mine)?;
            theirs[peer.rank()].clear();
        }
        let mut awaited = std::mem::take(&mut self.awaited);
        awaited.fill(false);
        for peer in self.peers.iter().flatten() {
            awaited[peer.rank()] = true;
        }
        let timeout = self.timeout;
        let exchanged = self.drive(&mut awaited, theirs, deadline, |awaited| {
            let late: Vec<String> = (0..awaited.len()).filter(|&r| awaited[r]).map(|r| r.to_string()).collect();
            format!("rank {} did not send its part within {timeout:?}", late.join(", rank "))
        });
        self.awaited = awaited;
        exchanged
    }
}

#[cfg(test)]
mod tests;
