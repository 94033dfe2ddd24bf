//! The data plane: frames between the stages of a model instance. A [`FrameSink`] / [`FrameSource`]
//! pair is the seam a transport implements; TCP (authenticated and encrypted with the cluster secret,
//! TCP_NODELAY, connected asynchronously, then used blocking from the stage's compute thread) is the one
//! here; [`ring`] opens a stage's links over it and, where chosen, over RDMA with fallback to TCP.
//! [`select`] decides per link which one to use.

pub mod frame;
pub mod rdma;
pub mod ring;
pub mod select;

/// Whether the ring's data plane carries frames over RDMA (with the `rdma` feature): each stage's link
/// to the next uses it when the agent chose RDMA for that link ([`ring`]).
pub const RDMA_RING_DATA_PLANE: bool = true;

pub use frame::{RingFrame, RingFrameError};

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

/// Accepts the previous stage's connection on `listener` (connections without the secret are dropped
/// and the wait goes on).
pub async fn accept_tcp(listener: &TcpListener, secret: &Psk) -> Result<(TcpSource, TcpSink), NetError> {
    loop {
        let (mut stream, from) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let attempt = async {
            let preamble = secure::read_preamble(&mut stream).await?;
            if preamble.kind != ConnectionKind::Stage {
                return Err(NetError::BadPreamble("not a stage connection".into()));
            }
            secure::respond(stream, preamble, secret).await
        };
        match attempt.await {
            Ok((r, w)) => return blocking(r, w),
            Err(e) => tracing::warn!("refused a stage connection from {from}: {e}"),
        }
    }
}
