//! An in-memory queue pair that behaves as Apple's UC ones do, for tests of everything above the verbs:
//! a send waits until the peer has a receive posted (the hardware's credit flow) and is delivered the
//! moment one is, whether or not the peer is polling; its completion says nothing about delivery; a
//! queue pair that saw a failed completion is in the error state, where every later work request
//! completes flushed (`IBV_WC_WR_FLUSH_ERR`); a process has at most [`MAX_QUEUE_PAIRS`] open (the 11th
//! fails, as on a Mac); and the wire can drop, damage or fail a given send, or break the receiving end
//! at a given delivery. [`FakeRdma`] opens such queue pairs by device name and connects them through
//! their endpoints, as the verbs shim does.

use super::link::{Completion, QueuePair};
use super::{Endpoint, RdmaError, MAX_QUEUE_PAIRS};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub const SLOT: usize = 4096;

/// `IBV_WC_RETRY_EXC_ERR`: what a failed send completes with.
pub const SEND_FAILED: u32 = 12;
/// `IBV_WC_LOC_PROT_ERR`: what a broken receive completes with.
pub const RECEIVE_FAILED: u32 = 4;
/// `IBV_WC_WR_FLUSH_ERR`: every work request of a queue pair in the error state.
pub const FLUSHED: u32 = 5;

/// One direction of the wire, with the faults to inject by the index of the send.
#[derive(Default)]
pub struct Direction {
    /// Sent, waiting for the peer to post a receive.
    pub in_flight: VecDeque<(u32, Vec<u8>)>,
    /// The receives the receiving end has posted, in order.
    posted: VecDeque<u32>,
    /// Delivered into a receive, with whether to damage it, or failed there (its status); the
    /// receiving end reads them when it polls.
    landed: VecDeque<(u32, Vec<u8>, bool, u32)>,
    pub delivered: usize,
    pub drop_at: Option<usize>,
    pub corrupt_at: Option<usize>,
    /// The send completes with an error and is not delivered.
    pub fail_at: Option<usize>,
    /// The receive it lands in completes with an error: the receiving queue pair enters the error state.
    pub break_receiver_at: Option<usize>,
    pub sender_completions: VecDeque<Completion>,
}

impl Direction {
    /// Moves what is in flight into the receives posted for it, as the hardware does on its own.
    fn deliver(&mut self) {
        while !self.in_flight.is_empty() && !self.posted.is_empty() {
            let (send_slot, bytes) = self.in_flight.pop_front().unwrap();
            let n = self.delivered;
            self.delivered += 1;
            if self.fail_at == Some(n) {
                self.sender_completions.push_back(Completion { slot: send_slot, receive: false, status: SEND_FAILED });
                continue;
            }
            self.sender_completions.push_back(Completion { slot: send_slot, receive: false, status: 0 });
            if self.drop_at == Some(n) {
                continue;
            }
            let slot = self.posted.pop_front().unwrap();
            let status = if self.break_receiver_at == Some(n) { RECEIVE_FAILED } else { 0 };
            self.landed.push_back((slot, bytes, self.corrupt_at == Some(n), status));
        }
    }
}

#[derive(Default)]
pub struct Wire {
    /// `directions[i]` carries what side `i` sends.
    pub directions: [Direction; 2],
}

pub struct FakeQp {
    wire: Arc<Mutex<Wire>>,
    side: usize,
    send: Vec<Vec<u8>>,
    recv: Vec<Vec<u8>>,
    /// A completion failed: every later work request completes flushed.
    in_error: bool,
    /// Flushed work requests not polled yet.
    flushed: Vec<Completion>,
    /// The open queue pairs of the [`FakeRdma`] that opened this one (none for a [`pair`]).
    open_count: Option<Arc<AtomicUsize>>,
}

impl Drop for FakeQp {
    fn drop(&mut self) {
        if let Some(count) = &self.open_count {
            count.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl FakeQp {
    fn new(wire: Arc<Mutex<Wire>>, side: usize, slots: u32, slot_bytes: usize) -> FakeQp {
        FakeQp {
            wire,
            side,
            send: vec![vec![0; slot_bytes]; slots as usize],
            recv: vec![vec![0; slot_bytes]; slots as usize],
            in_error: false,
            flushed: Vec::new(),
            open_count: None,
        }
    }

    /// Enters the error state: the receives still posted complete flushed.
    fn fail(&mut self, wire: &mut Wire) {
        self.in_error = true;
        let posted = std::mem::take(&mut wire.directions[1 - self.side].posted);
        self.flushed.extend(posted.into_iter().map(|slot| Completion { slot, receive: true, status: FLUSHED }));
    }
}

impl QueuePair for FakeQp {
    fn slots(&self) -> u32 {
        self.send.len() as u32
    }
    fn slot(&mut self, receive: bool, slot: u32) -> &mut [u8] {
        if receive {
            &mut self.recv[slot as usize]
        } else {
            &mut self.send[slot as usize]
        }
    }
    fn post_recv(&mut self, slot: u32) -> Result<(), RdmaError> {
        if self.in_error {
            self.flushed.push(Completion { slot, receive: true, status: FLUSHED });
            return Ok(());
        }
        let mut wire = self.wire.lock().unwrap();
        let incoming = &mut wire.directions[1 - self.side];
        assert!(!incoming.posted.contains(&slot), "receive slot {slot} posted twice");
        incoming.posted.push_back(slot);
        incoming.deliver();
        Ok(())
    }
    fn post_send(&mut self, slot: u32) -> Result<(), RdmaError> {
        if self.in_error {
            self.flushed.push(Completion { slot, receive: false, status: FLUSHED });
            return Ok(());
        }
        let bytes = self.send[slot as usize].clone();
        let mut wire = self.wire.lock().unwrap();
        let outgoing = &mut wire.directions[self.side];
        outgoing.in_flight.push_back((slot, bytes));
        outgoing.deliver();
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<(), RdmaError> {
        let first = out.len();
        out.append(&mut self.flushed);
        let shared = self.wire.clone();
        let mut wire = shared.lock().unwrap();
        let incoming = &mut wire.directions[1 - self.side];
        while let Some((slot, bytes, corrupt, status)) = incoming.landed.pop_front() {
            // Apple's rule: the receive must span as many frames as the send.
            let status = if status != 0 || bytes.len() == self.recv[slot as usize].len() { status } else { 1 };
            let len = bytes.len().min(self.recv[slot as usize].len());
            self.recv[slot as usize][..len].copy_from_slice(&bytes[..len]);
            if corrupt {
                self.recv[slot as usize][100] ^= 0x04;
            }
            out.push(Completion { slot, receive: true, status });
        }
        out.extend(wire.directions[self.side].sender_completions.drain(..));
        if !self.in_error && out[first..].iter().any(|c| c.status != 0) {
            self.fail(&mut wire);
        }
        Ok(())
    }
}

/// Two connected ends with `slots` slots each, and their wire (to inject faults).
pub fn pair(slots: u32, slot_bytes: [usize; 2]) -> (FakeQp, FakeQp, Arc<Mutex<Wire>>) {
    let wire = Arc::new(Mutex::new(Wire::default()));
    let end = |side: usize| FakeQp::new(wire.clone(), side, slots, slot_bytes[side]);
    (end(0), end(1), wire)
}

/// Opens in-memory queue pairs by device name and connects them through their endpoints' queue-pair
/// numbers; the test reaches each connected pair's wire to inject faults.
#[derive(Clone, Default)]
pub struct FakeRdma {
    registry: Arc<Mutex<Registry>>,
}

#[derive(Default)]
struct Registry {
    next_qpn: u32,
    /// The wire each queue pair number is on.
    wires: HashMap<u32, Arc<Mutex<Wire>>>,
    /// Wires in the order their first queue pair was opened.
    order: Vec<Arc<Mutex<Wire>>>,
    opened: Vec<String>,
    /// The queue pair number opened on each device, and which side of its wire it sends on (known
    /// once it connected: the first end to connect is side 0).
    by_device: HashMap<String, u32>,
    side_of: HashMap<String, usize>,
    refuse: Option<String>,
    /// Queue pairs open now.
    open: Arc<AtomicUsize>,
}

impl FakeRdma {
    /// The wire of the `n`th queue pair opened first on it (the `n`th link).
    pub fn wire(&self, n: usize) -> Arc<Mutex<Wire>> {
        self.registry.lock().unwrap().order[n].clone()
    }

    /// The wire of the queue pair opened on `device` (after it connected: the pair's wire).
    pub fn wire_of(&self, device: &str) -> Arc<Mutex<Wire>> {
        let registry = self.registry.lock().unwrap();
        registry.wires[&registry.by_device[device]].clone()
    }

    /// Sets the faults of what the queue pair opened on `device` sends (after it connected).
    pub fn faults_from(&self, device: &str, set: impl FnOnce(&mut Direction)) {
        let side = self.registry.lock().unwrap().side_of[device];
        set(&mut self.wire_of(device).lock().unwrap().directions[side]);
    }

    /// Devices opened so far, in order.
    pub fn opened(&self) -> Vec<String> {
        self.registry.lock().unwrap().opened.clone()
    }

    /// Queue pairs open now (opened, and not dropped).
    pub fn open_queue_pairs(&self) -> usize {
        self.registry.lock().unwrap().open.load(Ordering::SeqCst)
    }

    /// Every later open fails with `error` (a device that is not there).
    pub fn refuse(&self, error: &str) {
        self.registry.lock().unwrap().refuse = Some(error.into());
    }
}

impl super::open::RdmaOpener for FakeRdma {
    fn open(&self, device: &str, slots: u32, slot_bytes: u32) -> Result<Box<dyn super::open::PendingLink>, RdmaError> {
        let mut registry = self.registry.lock().unwrap();
        if let Some(error) = &registry.refuse {
            return Err(RdmaError::Device { device: device.into(), detail: error.clone() });
        }
        let open = registry.open.clone();
        if open.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < MAX_QUEUE_PAIRS).then_some(n + 1)).is_err() {
            return Err(RdmaError::TooManyQueuePairs);
        }
        registry.next_qpn += 1;
        let qpn = registry.next_qpn;
        let wire = Arc::new(Mutex::new(Wire::default()));
        registry.wires.insert(qpn, wire.clone());
        registry.order.push(wire.clone());
        registry.opened.push(device.into());
        registry.by_device.insert(device.into(), qpn);
        let mut qp = FakeQp::new(wire, 0, slots, slot_bytes as usize);
        qp.open_count = Some(open);
        Ok(Box::new(FakePending { qp, qpn, slot_bytes, device: device.into(), registry: self.registry.clone() }))
    }
}

struct FakePending {
    qp: FakeQp,
    qpn: u32,
    slot_bytes: u32,
    device: String,
    registry: Arc<Mutex<Registry>>,
}

impl super::open::PendingLink for FakePending {
    fn endpoint(&self) -> Result<Endpoint, RdmaError> {
        let mut gid = [0; 16];
        gid[10..].copy_from_slice(&[0xff, 0xff, 169, 254, 0, self.qpn as u8]);
        Ok(Endpoint { gid, qpn: self.qpn, psn: 7, lid: 0, slots: self.qp.slots(), slot_bytes: self.slot_bytes })
    }

    fn connect(
        mut self: Box<Self>,
        remote: &Endpoint,
        max_message: usize,
        timeout: std::time::Duration,
    ) -> Result<Box<dyn super::open::RdmaMessages>, RdmaError> {
        let mut registry = self.registry.lock().unwrap();
        let Some(wire) = registry.wires.get(&remote.qpn).cloned() else {
            return Err(RdmaError::Connect(format!("no queue pair {}", remote.qpn)));
        };
        if !Arc::ptr_eq(&wire, &self.qp.wire) {
            // The second end to connect joins the first one's wire.
            let own = registry.wires.insert(self.qpn, wire.clone()).expect("registered at open");
            registry.order.retain(|w| !Arc::ptr_eq(w, &own));
            self.qp.wire = wire;
            self.qp.side = 1;
        }
        registry.side_of.insert(self.device.clone(), self.qp.side);
        drop(registry);
        Ok(Box::new(super::link::SlotLink::new(self.qp, max_message, timeout)?))
    }
}
