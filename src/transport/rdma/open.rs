//! Opening RDMA links by device name, behind a small interface so the ring's data plane is the same
//! code over the verbs shim and over the in-memory queue pairs of the tests: an [`RdmaOpener`] opens a
//! queue pair on a device ([`PendingLink`]), whose [`Endpoint`] goes to the peer over the authenticated
//! TCP connection; connecting it to the peer's endpoint gives [`RdmaMessages`].

use super::link::{QueuePair, SlotLink};
use super::{Endpoint, RdmaError};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Whole messages over a connected queue pair.
pub trait RdmaMessages: Send {
    fn send(&mut self, message: &[u8]) -> Result<(), RdmaError>;
    /// The next message into `out` if one has begun to arrive; `Ok(false)` at once if none has.
    fn try_recv_into(&mut self, out: &mut Vec<u8>) -> Result<bool, RdmaError>;
    /// Every wait ends with [`RdmaError::Aborted`] once `flag` is set.
    fn abort_when(&mut self, flag: Arc<AtomicBool>);
    /// Without waiting: posts what the free send slots take of `message` (not empty) from `*offset`,
    /// moving `*offset` on (see [`SlotLink::send_some`]).
    fn send_some(&mut self, message: &[u8], offset: &mut usize) -> Result<(), RdmaError>;
    /// Without waiting: takes what has arrived; `Ok(true)` when a whole message is in `out`.
    fn recv_some(&mut self, out: &mut Vec<u8>) -> Result<bool, RdmaError>;
}

impl<Q: QueuePair> RdmaMessages for SlotLink<Q> {
    fn send(&mut self, message: &[u8]) -> Result<(), RdmaError> {
        SlotLink::send(self, message)
    }

    fn try_recv_into(&mut self, out: &mut Vec<u8>) -> Result<bool, RdmaError> {
        SlotLink::try_recv_into(self, out)
    }

    fn abort_when(&mut self, flag: Arc<AtomicBool>) {
        SlotLink::abort_when(self, flag)
    }

    fn send_some(&mut self, message: &[u8], offset: &mut usize) -> Result<(), RdmaError> {
        SlotLink::send_some(self, message, offset)
    }

    fn recv_some(&mut self, out: &mut Vec<u8>) -> Result<bool, RdmaError> {
        SlotLink::recv_some(self, out)
    }
}

/// A queue pair opened on a device, waiting for the peer's endpoint.
pub trait PendingLink: Send {
    fn endpoint(&self) -> Result<Endpoint, RdmaError>;
    /// Connects to the peer; every receive slot is posted when this returns, so the peer may send.
    fn connect(
        self: Box<Self>,
        remote: &Endpoint,
        max_message: usize,
        timeout: Duration,
    ) -> Result<Box<dyn RdmaMessages>, RdmaError>;
}

pub trait RdmaOpener: Send + Sync {
    fn open(&self, device: &str, slots: u32, slot_bytes: u32) -> Result<Box<dyn PendingLink>, RdmaError>;
}

/// This build's opener: the verbs shim with the `rdma` feature (the library is loaded at the first
/// open), or one that says the build has no RDMA.
pub fn platform() -> Arc<dyn RdmaOpener> {
    #[cfg(feature = "rdma")]
    {
        Arc::new(VerbsOpener::default())
    }
    #[cfg(not(feature = "rdma"))]
    {
        Arc::new(NoRdma)
    }
}

/// The opener of a build without RDMA.
pub struct NoRdma;

impl RdmaOpener for NoRdma {
    fn open(&self, device: &str, _slots: u32, _slot_bytes: u32) -> Result<Box<dyn PendingLink>, RdmaError> {
        Err(RdmaError::Device { device: device.into(), detail: "this build of shoal has no RDMA".into() })
    }
}

#[cfg(feature = "rdma")]
#[derive(Default)]
pub struct VerbsOpener {
    verbs: std::sync::OnceLock<Result<Arc<super::Verbs>, RdmaError>>,
}

#[cfg(feature = "rdma")]
impl RdmaOpener for VerbsOpener {
    fn open(&self, device: &str, slots: u32, slot_bytes: u32) -> Result<Box<dyn PendingLink>, RdmaError> {
        let verbs = self.verbs.get_or_init(super::Verbs::load_default).clone()?;
        Ok(Box::new(super::RdmaLink::open(&verbs, device, slots, slot_bytes)?))
    }
}

#[cfg(feature = "rdma")]
impl PendingLink for super::RdmaLink {
    fn endpoint(&self) -> Result<Endpoint, RdmaError> {
        self.local_endpoint()
    }

    fn connect(
        self: Box<Self>,
        remote: &Endpoint,
        max_message: usize,
        timeout: Duration,
    ) -> Result<Box<dyn RdmaMessages>, RdmaError> {
        Ok(Box::new(super::RdmaLink::connect(*self, remote, max_message, timeout)?))
    }
}
