//! The links of a tensor-parallel group between nodes: one authenticated, encrypted TCP connection
//! (TCP_NODELAY, keyed by the cluster secret) between every two ranks, used from the rank's compute
//! thread without a runtime. An exchange writes this rank's frame to every peer and reads each peer's
//! at the same time, waiting on all the sockets at once (`poll`), so no rank waits for another to finish
//! sending first whatever the frames' size, and a sum costs one trip over the slowest link.
//!
//! The ranks connect when the agent says where every rank listens: a rank connects to each rank
//! before it and accepts each rank after it; a connecting rank's first frame says which rank it is.
//! Each link's buffers are kept between steps, so a decode step allocates nothing.

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

/// How long the ranks have to connect to each other once told where each listens.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// One rank's connections to the others.
pub struct TcpGroupLinks {
    rank: usize,
    peers: Vec<Option<SecureStream>>,
    timeout: Duration,
}

/// Connects rank `rank` to the other ranks of its group, which listen at `addresses` (rank order; this
/// rank's own entry is not used), accepting on `listener` the ranks after it.
pub async fn connect(
    rank: usize,
    addresses: &[SocketAddr],
    listener: &TcpListener,
    secret: &Psk,
) -> Result<TcpGroupLinks, String> {
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
    Ok(TcpGroupLinks { rank, peers, timeout: EXCHANGE_TIMEOUT })
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

/// Waits until `stream` is ready for `events`, at most `left` (none: as long as it takes).
fn wait(stream: &SecureStream, events: PollFlags, left: Option<Duration>) -> Result<(), String> {
    let timeout = left.map(|d| Timespec { tv_sec: d.as_secs() as _, tv_nsec: d.subsec_nanos() as _ });
    let mut fds = [PollFd::new(stream.socket(), events)];
    match poll(&mut fds, timeout.as_ref()) {
        Ok(0) => Err("timed out".into()),
        Ok(_) => Ok(()),
        Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

fn left(deadline: Option<Instant>) -> Result<Option<Duration>, String> {
    match deadline {
        None => Ok(None),
        Some(d) => d.checked_duration_since(Instant::now()).map(Some).ok_or_else(|| "timed out".to_string()),
    }
}

fn send_blocking(stream: &mut SecureStream, frame: &[u8], timeout: Duration) -> Result<(), String> {
    let deadline = Some(Instant::now() + timeout);
    stream.queue(frame).map_err(|e| e.to_string())?;
    loop {
        stream.write_some().map_err(|e| e.to_string())?;
        if !stream.has_output() {
            return Ok(());
        }
        wait(stream, PollFlags::OUT, left(deadline)?)?;
    }
}

fn recv_blocking(
    stream: &mut SecureStream,
    frame: &mut Vec<u8>,
    max: usize,
    timeout: Option<Duration>,
) -> Result<(), String> {
    let deadline = timeout.map(|t| Instant::now() + t);
    frame.clear();
    loop {
        if stream.next_frame(frame, max).map_err(|e| e.to_string())? {
            return Ok(());
        }
        wait(stream, PollFlags::IN, left(deadline)?)?;
        stream.read_some().map_err(|e| e.to_string())?;
    }
}

impl TcpGroupLinks {
    fn peer(&mut self, rank: usize) -> Result<&mut SecureStream, String> {
        self.peers.get_mut(rank).and_then(Option::as_mut).ok_or_else(|| format!("no link to rank {rank}"))
    }
}

impl GroupLinks for TcpGroupLinks {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.peers.len()
    }

    fn send(&mut self, to: usize, frame: &[u8]) -> Result<(), String> {
        let timeout = self.timeout;
        send_blocking(self.peer(to)?, frame, timeout).map_err(|e| format!("the link to rank {to} failed: {e}"))
    }

    fn recv(&mut self, from: usize, frame: &mut Vec<u8>) -> Result<(), String> {
        recv_blocking(self.peer(from)?, frame, MAX_GROUP_FRAME, None)
            .map_err(|e| format!("the link from rank {from} failed: {e}"))
    }

    fn exchange(&mut self, mine: &[u8], theirs: &mut [Vec<u8>]) -> Result<(), String> {
        let deadline = Some(Instant::now() + self.timeout);
        let spun = Instant::now();
        let rank = self.rank;
        let mut done = vec![false; self.peers.len()];
        done[rank] = true;
        for (r, peer) in self.peers.iter_mut().enumerate() {
            if let Some(peer) = peer {
                peer.queue(mine).map_err(|e| format!("the link to rank {r} failed: {e}"))?;
                theirs[r].clear();
            }
        }
        loop {
            // Write and read what each link takes and has now, then wait for any of them.
            for (r, peer) in self.peers.iter_mut().enumerate() {
                let Some(peer) = peer else { continue };
                let failed = |e: NetError| format!("the link with rank {r} failed: {e}");
                peer.write_some().map_err(failed)?;
                if !done[r] {
                    done[r] = peer.next_frame(&mut theirs[r], MAX_GROUP_FRAME).map_err(failed)?;
                }
            }
            let writing = self.peers.iter().any(|p| p.as_ref().is_some_and(SecureStream::has_output));
            if !writing && done.iter().all(|d| *d) {
                return Ok(());
            }
            // A part is due within microseconds once its rank is done computing: look again for a
            // while before sleeping in `poll`, as waking a sleeping thread costs more than that.
            if spun.elapsed() < SPIN {
                for (r, peer) in self.peers.iter_mut().enumerate() {
                    if let (false, Some(peer)) = (done[r], peer) {
                        peer.read_some().map_err(|e| format!("the link with rank {r} failed: {e}"))?;
                    }
                }
                // Let whatever else wants this core run meanwhile (the node's agent, the kernel's
                // network work): on a machine whose cores the ranks fill, it would otherwise preempt a
                // rank that computes.
                std::thread::yield_now();
                continue;
            }
            let wait_for = left(deadline).map_err(|_| {
                let late: Vec<String> = (0..done.len()).filter(|&r| !done[r]).map(|r| r.to_string()).collect();
                format!("rank {} did not send its part within {:?}", late.join(", rank "), self.timeout)
            })?;
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(self.peers.len());
            let mut which = Vec::with_capacity(self.peers.len());
            for (r, peer) in self.peers.iter().enumerate() {
                let Some(peer) = peer else { continue };
                let mut events = PollFlags::empty();
                if !done[r] {
                    events |= PollFlags::IN;
                }
                if peer.has_output() {
                    events |= PollFlags::OUT;
                }
                if !events.is_empty() {
                    fds.push(PollFd::new(peer.socket(), events));
                    which.push(r);
                }
            }
            let timeout = wait_for.map(|d| Timespec { tv_sec: d.as_secs() as _, tv_nsec: d.subsec_nanos() as _ });
            match poll(&mut fds, timeout.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(format!("waiting for the group's links failed: {e}")),
            }
            let readable: Vec<usize> =
                fds.iter().zip(&which).filter(|(fd, _)| !fd.revents().is_empty()).map(|(_, &r)| r).collect();
            drop(fds);
            for r in readable {
                if !done[r] {
                    let peer = self.peers[r].as_mut().expect("polled");
                    peer.read_some().map_err(|e| format!("the link with rank {r} failed: {e}"))?;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three ranks on loopback, connected as the workers connect.
    async fn group(secret: [u8; 32]) -> Vec<Result<TcpGroupLinks, String>> {
        let mut listeners = Vec::new();
        for _ in 0..3 {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let addresses: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let ranks = listeners.into_iter().enumerate().map(|(rank, listener)| {
            let addresses = addresses.clone();
            tokio::spawn(async move { connect(rank, &addresses, &listener, &secret).await })
        });
        let mut links = Vec::new();
        for r in ranks.collect::<Vec<_>>() {
            links.push(r.await.unwrap());
        }
        links
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ranks_exchange_frames_of_any_size_at_once() {
        let links: Vec<TcpGroupLinks> = group([5; 32]).await.into_iter().map(Result::unwrap).collect();
        let handles: Vec<_> = links
            .into_iter()
            .map(|mut l| {
                std::thread::spawn(move || {
                    let rank = l.rank();
                    let mut theirs = vec![Vec::new(); 3];
                    // Small frames, then 8 MiB ones, which no socket buffer holds: every rank writes
                    // before it reads, so a rank that waited to finish writing would wait for ever.
                    for size in [16usize, 8 << 20] {
                        let mine: Vec<u8> = (0..size).map(|i| (i * 7 + rank) as u8).collect();
                        l.exchange(&mine, &mut theirs).unwrap();
                        for (r, frame) in theirs.iter().enumerate().filter(|(r, _)| *r != rank) {
                            assert_eq!(frame.len(), size);
                            assert!(frame.iter().enumerate().all(|(i, b)| *b == (i * 7 + r) as u8), "rank {r}'s frame");
                        }
                    }
                    // One way, as a step and the logits go.
                    let mut frame = Vec::new();
                    if rank == 0 {
                        l.send(1, b"step").unwrap();
                        l.send(2, b"step").unwrap();
                        l.recv(2, &mut frame).unwrap();
                        assert_eq!(frame, b"logits 2");
                    } else {
                        l.recv(0, &mut frame).unwrap();
                        assert_eq!(frame, b"step");
                        if rank == 2 {
                            l.send(0, b"logits 2").unwrap();
                        }
                    }
                    l
                })
            })
            .collect();
        let mut links: Vec<TcpGroupLinks> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        // A rank that is gone fails the others' exchange at once, saying which.
        let gone = links.pop().unwrap();
        drop(gone);
        let mut theirs = vec![Vec::new(); 3];
        let error = links[0].exchange(b"x", &mut theirs).unwrap_err();
        assert!(error.contains("rank 2"), "{error}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rank_without_the_secret_does_not_join() {
        let mut listeners = Vec::new();
        for _ in 0..2 {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let addresses: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let (l0, l1) = (listeners.remove(0), listeners.remove(0));
        let a = addresses.clone();
        let stranger = tokio::spawn(async move { connect(1, &a, &l1, &[1; 32]).await });
        let rank0 = tokio::time::timeout(Duration::from_secs(3), connect(0, &addresses, &l0, &[2; 32])).await;
        assert!(rank0.is_err() || rank0.unwrap().is_err(), "rank 0 took a stranger");
        stranger.abort();
    }
}
