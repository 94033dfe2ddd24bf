//! A member of the cluster as the source of a shard fetch: byte ranges of a file it offers, over the
//! cluster's authenticated copy connection ([`peer_copy::read_range`]). Each piece (at most 4 MiB) is
//! checked against the sender's hash before any of it is written, so a shard never records as present
//! bytes that arrived damaged. A piece that stalls for a minute counts as a broken connection.

use super::{Failure, RangeReader, ShardError, Sink};
use crate::model::peer_copy::{self, CopyError, OfferedFile};
use crate::net::secure::Psk;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

/// Bytes asked for (and checked) at once.
const PIECE: u64 = 4 << 20;
/// How long one piece may take.
const PIECE_TIMEOUT: Duration = Duration::from_secs(60);

/// Ranges of `file` from the member listening at `addr`. Its calls block: run it off the async runtime.
pub struct PeerRanges {
    url: String,
    addr: SocketAddr,
    secret: Psk,
    file: OfferedFile,
    runtime: tokio::runtime::Handle,
}

impl PeerRanges {
    pub fn new(node: &str, addr: SocketAddr, secret: Psk, file: OfferedFile, runtime: tokio::runtime::Handle) -> Self {
        PeerRanges { url: Self::url(node, &file), addr, secret, file, runtime }
    }

    /// How a shard's record names a member as its source: `shoal://NODE/FILE`.
    pub fn url(node: &str, file: &OfferedFile) -> String {
        format!("shoal://{node}/{}", file.name)
    }
}

impl RangeReader for PeerRanges {
    fn get(&mut self, range: Range<u64>, size: &mut Option<u64>, sink: &mut Sink<'_>) -> Result<u64, Failure> {
        if let Some(expected) = size.filter(|&s| s != self.file.size) {
            let url = self.url.clone();
            return Err(Failure::Fatal(ShardError::WrongSize { url, served: self.file.size, expected }));
        }
        *size = Some(self.file.size);
        let end = range.end.min(self.file.size);
        let mut at = range.start;
        while at < end {
            let length = (end - at).min(PIECE);
            let asked = peer_copy::read_range(self.addr, &self.secret, &self.file, at, length);
            let piece = self.runtime.block_on(async { tokio::time::timeout(PIECE_TIMEOUT, asked).await });
            let failure = |reason: String| ShardError::Peer { url: self.url.clone(), reason };
            match piece {
                Ok(Ok(bytes)) => {
                    sink(at, &bytes)?;
                    at += length;
                }
                Err(_) => {
                    let reason = format!("no piece arrived within {PIECE_TIMEOUT:?}");
                    return Err(Failure::Broken { reached: at, reason });
                }
                Ok(Err(CopyError::Network(e))) => return Err(Failure::Broken { reached: at, reason: e.to_string() }),
                Ok(Err(CopyError::Damaged(reason))) => {
                    let (url, last) = (self.url.clone(), at + length - 1);
                    return Err(Failure::Fatal(ShardError::Damaged { url, start: at, last, reason }));
                }
                Ok(Err(other)) => return Err(Failure::Fatal(failure(other.to_string()))),
            }
        }
        Ok(end)
    }
}
