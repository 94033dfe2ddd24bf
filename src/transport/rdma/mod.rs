//! The RDMA transport over Thunderbolt: what both ends exchange to connect a queue pair
//! ([`Endpoint`]), the errors that move a link back to TCP ([`RdmaError`]), the framing that makes
//! unacknowledged UC sends safe ([`framing`]), messages over a queue pair with credits and timeouts
//! ([`link`]), opening links by device name ([`open`]), and — with the cargo feature `rdma` — the verbs themselves through a small C shim that
//! opens the platform's library at run time (`verbs`).
//!
//! Apple's rules (shared/research/rdma.md): UC queue pairs only, SEND/RECV only, at most 10 queue pairs
//! and about 100 memory regions per device, page-aligned buffers, the receiver posts the same number of
//! 4 KiB frames as the sender, GID index 1 (the interface's IPv4), and a completion does not mean
//! delivery.

#[cfg(test)]
pub(crate) mod fake;
pub mod framing;
pub mod link;
pub mod open;
#[cfg(feature = "rdma")]
#[allow(unsafe_code)]
mod verbs;

pub use framing::FramingError;
#[cfg(feature = "rdma")]
pub use verbs::{RdmaLink, ShimQueuePair, Verbs, LIBRARY_ENV};

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Bytes of one Thunderbolt RDMA frame: buffers are whole frames.
pub const FRAME_BYTES: usize = 4096;
/// Apple's limit of queue pairs per device (the 11th fails with EBUSY).
pub const MAX_QUEUE_PAIRS: usize = 10;
/// Most slots per direction of a queue pair (posting deeper queues fails on Apple's stack).
pub const MAX_SLOTS: u32 = 32;

/// The RDMA library's file, where the platform keeps it. On macOS by its full path (the system's, in the
/// dyld shared cache since macOS 26.2), so that no library of that leaf name found earlier on a search
/// path (`DYLD_LIBRARY_PATH`, the app's own folders) is loaded instead. On Linux the soname, which the
/// distribution's loader resolves.
pub const DEFAULT_LIBRARY: &str = if cfg!(target_os = "macos") { "/usr/lib/librdma.dylib" } else { "libibverbs.so.1" };

/// What one end tells the other (over the authenticated control connection) to connect a queue pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// The GID at index 1: the IPv4-mapped address of the Thunderbolt interface.
    pub gid: [u8; 16],
    pub qpn: u32,
    pub psn: u32,
    pub lid: u32,
    /// Slots per direction and their size: both ends must use the same.
    pub slots: u32,
    pub slot_bytes: u32,
}

/// The largest slot either end may ask for (64 KiB: 16 frames, macOS 26.3's multi-frame slots).
pub const MAX_SLOT_BYTES: u32 = 16 * FRAME_BYTES as u32;

impl Endpoint {
    /// Refuses slots this end must not open for a peer: more than [`MAX_SLOTS`], or slots that are not
    /// whole frames up to [`MAX_SLOT_BYTES`] (a member asking for gigabytes of registered memory).
    pub fn check_slots(&self) -> Result<(), RdmaError> {
        let whole_frames = self.slot_bytes > 0 && self.slot_bytes.is_multiple_of(FRAME_BYTES as u32);
        if (1..=MAX_SLOTS).contains(&self.slots) && whole_frames && self.slot_bytes <= MAX_SLOT_BYTES {
            return Ok(());
        }
        Err(RdmaError::Mismatch {
            local: format!("at most {MAX_SLOTS} slots of whole 4 KiB frames up to {MAX_SLOT_BYTES} bytes"),
            remote: format!("{} slots of {} bytes", self.slots, self.slot_bytes),
        })
    }

    /// The IPv4 address inside an IPv4-mapped GID (`::ffff:a.b.c.d`), if it is one.
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        let g = &self.gid;
        (g[..10].iter().all(|b| *b == 0) && g[10] == 0xff && g[11] == 0xff)
            .then(|| std::net::Ipv4Addr::new(g[12], g[13], g[14], g[15]))
    }
}

/// Everything that can go wrong with RDMA on a link. Every variant moves the link to TCP
/// ([`crate::transport::select::LinkSelector::rdma_failed`]); none restarts anything.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RdmaError {
    #[error("cannot load the RDMA library {path}: {detail} (RDMA needs macOS 26.2 or later, or rdma-core's libibverbs on Linux)")]
    LibraryMissing { path: String, detail: String },
    /// The device list could not be had (Linux without RDMA support: "Function not implemented").
    #[error("no RDMA devices: {0}")]
    NoDevices(String),
    #[error("RDMA device {device}: {detail}")]
    Device { device: String, detail: String },
    #[error("at most {MAX_QUEUE_PAIRS} RDMA queue pairs per device, and this process has them all open")]
    TooManyQueuePairs,
    #[error("no IPv4-mapped GID at index 1: give the Thunderbolt interface an IPv4 address (see `shoal doctor`)")]
    NoIpv4Gid,
    #[error("the two ends' RDMA buffers differ: {local} here, {remote} there")]
    Mismatch { local: String, remote: String },
    #[error("connecting the queue pair failed: {0}")]
    Connect(String),
    #[error("posting RDMA work failed: {0}")]
    Post(String),
    #[error("an RDMA {what} completed with error status {status}")]
    Completion { what: &'static str, status: u32 },
    #[error("no RDMA completion within {0:?}")]
    Timeout(Duration),
    #[error("the RDMA wait was cut short: the link is moving to TCP")]
    Aborted,
    #[error("an RDMA message was damaged or lost: {0}")]
    Framing(#[from] FramingError),
}

/// This node's RDMA devices in `ibv_devices`' layout, as the doctor reads it, found through the shim
/// (`None` without the `rdma` feature). A failed list reads as rdma-core's tool prints it.
pub fn device_list_text() -> Option<String> {
    #[cfg(feature = "rdma")]
    {
        let devices = Verbs::load_default().and_then(|v| v.device_names());
        Some(match devices {
            Ok(names) => {
                let mut text =
                    String::from("    device          \t   node GUID\n    ------          \t----------------\n");
                for name in names {
                    text += &format!("    {name:<16}\t0000000000000000\n");
                }
                text
            }
            Err(RdmaError::NoDevices(detail)) => format!("Failed to get IB devices list: {detail}\n"),
            Err(e) => format!("Failed to get IB devices list: {e}\n"),
        })
    }
    #[cfg(not(feature = "rdma"))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ipv4_of_a_gid() {
        let mut e = Endpoint { gid: [0; 16], qpn: 1, psn: 7, lid: 0, slots: 8, slot_bytes: 4096 };
        assert_eq!(e.ipv4(), None);
        e.gid[10..].copy_from_slice(&[0xff, 0xff, 169, 254, 205, 255]);
        assert_eq!(e.ipv4(), Some("169.254.205.255".parse().unwrap()));
        e.gid[0] = 0xfe;
        assert_eq!(e.ipv4(), None, "a link-local IPv6 GID (index 0) is not one");
    }

    #[test]
    fn a_peer_gets_the_slots_macos_allows_and_no_more() {
        let with = |slots, slot_bytes| Endpoint { gid: [0; 16], qpn: 1, psn: 7, lid: 0, slots, slot_bytes };
        for (slots, bytes) in [(32, 4096), (1, 4096), (32, 65536), (8, 8192)] {
            assert!(with(slots, bytes).check_slots().is_ok(), "{slots} × {bytes}");
        }
        for (slots, bytes) in [(33, 4096), (0, 4096), (32, 4097), (32, 0), (32, 1 << 30), (u32::MAX, 4096)] {
            let refused = with(slots, bytes).check_slots().unwrap_err().to_string();
            assert!(refused.contains(&format!("{slots} slots of {bytes} bytes")), "{refused}");
        }
    }
}
