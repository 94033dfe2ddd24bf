//! Connections between nodes: every one starts with a fixed preamble, then a Noise handshake keyed by a
//! pre-shared secret (the cluster secret, or a key agreed from a join code), and then carries encrypted,
//! length-prefixed, size-capped frames. Until the handshake completes, nothing a peer sends is parsed
//! beyond the preamble and the handshake's own fixed-size messages.

mod blocking;
pub mod frame;
pub mod preamble;
pub mod secure;

pub use frame::{FrameError, Reassembler};
pub use preamble::{ConnectionKind, Preamble};
pub use secure::{SecureReader, SecureWriter};

use std::time::Duration;

/// How long a peer has to complete the preamble and handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the peer does not speak shoal's protocol: {0}")]
    BadPreamble(String),
    #[error("the peer could not prove it holds the same secret (the handshake failed)")]
    Handshake,
    #[error("the peer took too long to complete the handshake")]
    Timeout,
    #[error("malformed frame: {0}")]
    Frame(#[from] FrameError),
    #[error("a record from the peer failed authentication (corrupted or forged)")]
    Forged,
    #[error("the connection was closed")]
    Closed,
}

impl NetError {
    /// Whether the peer simply went away (as opposed to misbehaving).
    pub fn is_disconnect(&self) -> bool {
        match self {
            NetError::Closed => true,
            NetError::Io(e) => matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            ),
            _ => false,
        }
    }
}
