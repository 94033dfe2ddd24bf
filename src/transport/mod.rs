//! The data plane: frames between the stages of a model instance. A [`FrameSink`] / [`FrameSource`]
//! pair is the seam a transport implements; TCP (authenticated and encrypted with the cluster secret,
//! TCP_NODELAY, connected asynchronously, then used blocking from the stage's compute thread) is the one
//! here; [`ring`] opens a stage's links over it and, where chosen, over RDMA with fallback to TCP.
//! [`select`] decides per link which one to use.

pub mod frame;
pub mod group;
pub mod rdma;
pub mod ring;
pub mod select;

/// Whether the ring's data plane carries frames over RDMA (with the `rdma` feature): each stage's link
/// to the next uses it when the agent chose RDMA for that link ([`ring`]).
pub const RDMA_RING_DATA_PLANE: bool = true;

pub use frame::{PrefixOp, Records, RingFrame, RingFrameError, Sampled, StepRows};

use crate::net::secure::{self, Psk};
use crate::net::secure::{BlockingReader, BlockingWriter};
use crate::net::{ConnectionKind, NetError, SecureReader, SecureWriter};
use std::net::SocketAddr;
use tokio::net::TcpListener;

/// Largest frame between stages (a prefill chunk of 512 tokens of an 8192-wide model is 16 MiB).
pub const MAX_RING_FRAME: usize = 256 << 20;

/// Sends frames to the next stage. Blocking: the compute thread writes its frames itself, with no
/// hand-off to another thread per frame.
pub trait FrameSink: Send {
    fn send(&mut self, frame: &[u8]) -> Result<(), NetError>;
}

/// Receives frames from the previous stage, into a reused buffer (blocking).
pub trait FrameSource: Send {
    fn recv_into(&mut self, frame: &mut Vec<u8>) -> Result<(), NetError>;
}

pub struct TcpSink(BlockingWriter);
pub struct TcpSource(BlockingReader);

impl TcpSink {
    /// Shuts the connection down (both directions) when the returned handle is dropped.
    pub fn closer(&self) -> Result<crate::net::secure::ConnectionCloser, NetError> {
        Ok(self.0.closer()?)
    }
}

impl FrameSink for TcpSink {
    fn send(&mut self, frame: &[u8]) -> Result<(), NetError> {
        self.0.write_frame(frame)
    }
}

impl FrameSource for TcpSource {
    fn recv_into(&mut self, frame: &mut Vec<u8>) -> Result<(), NetError> {
        self.0.read_frame_into(MAX_RING_FRAME, frame)
    }
}

fn blocking(r: SecureReader, w: SecureWriter) -> Result<(TcpSource, TcpSink), NetError> {
    let (r, w) = secure::into_blocking(r, w)?;
    Ok((TcpSource(r), TcpSink(w)))
}

/// Connects to the stage listening at `addr`.
pub async fn connect_tcp(addr: SocketAddr, secret: &Psk) -> Result<(TcpSource, TcpSink), NetError> {
    let (r, w) = secure::connect(addr, ConnectionKind::Stage, secret).await?;
    blocking(r, w)
}

/// How long a connection to a stage's data port has to complete its handshake.
const STAGE_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// Most handshakes in progress at once on a data port; more connections are closed at once.
const MAX_STAGE_HANDSHAKES: usize = 16;

/// Accepts the previous stage's connection on `listener`: handshakes run concurrently, each with a
/// short deadline, so connections without the secret (or silent ones) neither block nor delay it; the
/// first that proves it holds the secret wins.
pub async fn accept_tcp(listener: &TcpListener, secret: &Psk) -> Result<(TcpSource, TcpSink), NetError> {
    let (r, w) = accept_secure(listener, secret).await?;
    blocking(r, w)
}

/// As [`accept_tcp`], the connection left as it is (async).
pub async fn accept_secure(listener: &TcpListener, secret: &Psk) -> Result<(SecureReader, SecureWriter), NetError> {
    SecureAcceptor::new(listener, secret).next().await
}

/// Accepts stage connections on a listener one after another, each handshake running beside the
/// others with its own deadline. Handshakes still in progress when one completes carry on for the next
/// call (a group's ranks connect at once; dropping the others' would leave them believing they are in).
pub struct SecureAcceptor<'a> {
    listener: &'a TcpListener,
    secret: Psk,
    attempts: tokio::task::JoinSet<(SocketAddr, Handshake)>,
}

/// A handshake's outcome: the connection, or why it was refused.
type Handshake = Result<(SecureReader, SecureWriter), NetError>;

impl<'a> SecureAcceptor<'a> {
    pub fn new(listener: &'a TcpListener, secret: &Psk) -> SecureAcceptor<'a> {
        SecureAcceptor { listener, secret: *secret, attempts: tokio::task::JoinSet::new() }
    }

    /// The next connection that proves it holds the secret.
    pub async fn next(&mut self) -> Result<(SecureReader, SecureWriter), NetError> {
        loop {
            tokio::select! {
                accepted = self.listener.accept() => {
                    let (mut stream, from) = accepted?;
                    if self.attempts.len() >= MAX_STAGE_HANDSHAKES {
                        tracing::warn!("refused a stage connection from {from}: too many handshakes in progress");
                        continue;
                    }
                    let secret = self.secret;
                    self.attempts.spawn(async move {
                        let attempt = async {
                            stream.set_nodelay(true)?;
                            let preamble = secure::read_preamble(&mut stream).await?;
                            if preamble.kind != ConnectionKind::Stage {
                                return Err(NetError::BadPreamble("not a stage connection".into()));
                            }
                            secure::respond(stream, preamble, &secret).await
                        };
                        let result = tokio::time::timeout(STAGE_HANDSHAKE_TIMEOUT, attempt).await;
                        (from, result.unwrap_or(Err(NetError::Timeout)))
                    });
                }
                Some(done) = self.attempts.join_next(), if !self.attempts.is_empty() => match done {
                    Ok((_, Ok((r, w)))) => return Ok((r, w)),
                    Ok((from, Err(e))) => tracing::warn!("refused a stage connection from {from}: {e}"),
                    Err(e) => tracing::warn!("a stage handshake ended abnormally: {e}"),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Silent connections and connections without the secret, opened first, do not keep the previous
    /// stage out: its handshake runs beside theirs and wins.
    #[tokio::test]
    async fn silent_and_foreign_connections_do_not_hold_up_the_previous_stage() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let secret = [7u8; 32];
        let mut silent = Vec::new();
        for _ in 0..MAX_STAGE_HANDSHAKES - 2 {
            silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let foreign = tokio::spawn(async move { connect_tcp(addr, &[9u8; 32]).await.is_err() });
        let previous = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            connect_tcp(addr, &secret).await.map(|_| ())
        });
        // With one handshake at a time (10 s each, as it was) this took minutes; a minute bounds it
        // generously.
        let accepted = tokio::time::timeout(std::time::Duration::from_secs(60), accept_tcp(&listener, &secret)).await;
        assert!(matches!(accepted, Ok(Ok(_))), "the previous stage was not accepted");
        assert!(previous.await.unwrap().is_ok());
        assert!(foreign.await.unwrap(), "a connection without the secret was accepted");
        drop(silent);
    }

    /// Connections that arrive together are each accepted in turn: a handshake still running when
    /// another completes is not dropped (a tensor-parallel group's later ranks connect at once).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_arriving_together_are_all_accepted() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let secret = [3u8; 32];
        let clients: Vec<_> = (0..4u8)
            .map(|i| {
                tokio::spawn(async move {
                    let (_reader, mut writer) = secure::connect(addr, ConnectionKind::Stage, &secret).await?;
                    writer.write_frame(&[i]).await?;
                    // Hold the connection until the other side has read.
                    tokio::time::sleep(std::time::Duration::from_secs(10)).await;
                    Ok::<_, NetError>(())
                })
            })
            .collect();
        let mut acceptor = SecureAcceptor::new(&listener, &secret);
        let mut seen = Vec::new();
        for _ in 0..4 {
            let wait = std::time::Duration::from_secs(20);
            let (mut reader, _writer) = tokio::time::timeout(wait, acceptor.next()).await.expect("accepted").unwrap();
            seen.push(reader.read_frame(1).await.unwrap()[0]);
        }
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2, 3]);
        for c in clients {
            c.abort();
        }
    }
}
