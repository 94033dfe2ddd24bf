//! An in-memory queue pair that behaves as Apple's UC ones do, for tests of everything above the verbs:
//! a send waits until the peer has a receive posted (the hardware's credit flow), its completion says
//! nothing about delivery, and the wire can drop, damage or fail a given send. [`FakeRdma`] opens such
//! queue pairs by device name and connects them through their endpoints, as the verbs shim does.

use super::link::{Completion, QueuePair};
use super::{Endpoint, RdmaError};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

pub const SLOT: usize = 4096;

/// One direction of the wire, with the faults to inject by the index of the send.
#[derive(Default)]
pub struct Direction {
    pub in_flight: VecDeque<(u32, Vec<u8>)>,
    pub delivered: usize,
    pub drop_at: Option<usize>,
    pub corrupt_at: Option<usize>,
    pub fail_at: Option<usize>,
    pub sender_completions: VecDeque<Completion>,
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
    posted: VecDeque<u32>,
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
        assert!(!self.posted.contains(&slot), "receive slot {slot} posted twice");
        self.posted.push_back(slot);
        Ok(())
    }
    fn post_send(&mut self, slot: u32) -> Result<(), RdmaError> {
        let bytes = self.send[slot as usize].clone();
        self.wire.lock().unwrap().directions[self.side].in_flight.push_back((slot, bytes));
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<(), RdmaError> {
        let mut wire = self.wire.lock().unwrap();
        let incoming = &mut wire.directions[1 - self.side];
        // A send is delivered only into a posted receive.
        while !incoming.in_flight.is_empty() && !self.posted.is_empty() {
            let (send_slot, bytes) = incoming.in_flight.pop_front().unwrap();
            let n = incoming.delivered;
            incoming.delivered += 1;
            if incoming.fail_at == Some(n) {
                incoming.sender_completions.push_back(Completion { slot: send_slot, receive: false, status: 12 });
                continue;
            }
            incoming.sender_completions.push_back(Completion { slot: send_slot, receive: false, status: 0 });
            if incoming.drop_at == Some(n) {
                continue;
            }
            let slot = self.posted.pop_front().unwrap();
            // Apple's rule: the receive must span as many frames as the send.
            let status = if bytes.len() == self.recv[slot as usize].len() { 0 } else { 1 };
            let len = bytes.len().min(self.recv[slot as usize].len());
            self.recv[slot as usize][..len].copy_from_slice(&bytes[..len]);
            if incoming.corrupt_at == Some(n) {
                self.recv[slot as usize][100] ^= 0x04;
            }
            out.push(Completion { slot, receive: true, status });
        }
        out.extend(wire.directions[self.side].sender_completions.drain(..));
        Ok(())
    }
}

/// Two connected ends with `slots` slots each, and their wire (to inject faults).
pub fn pair(slots: u32, slot_bytes: [usize; 2]) -> (FakeQp, FakeQp, Arc<Mutex<Wire>>) {
    let wire = Arc::new(Mutex::new(Wire::default()));
    let end = |side: usize| FakeQp {
        wire: wire.clone(),
        side,
        send: vec![vec![0; slot_bytes[side]]; slots as usize],
        recv: vec![vec![0; slot_bytes[side]]; slots as usize],
        posted: VecDeque::new(),
    };
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
    refuse: Option<String>,
}

impl FakeRdma {
    /// The wire of the `n`th queue pair opened first on it (the `n`th link).
    pub fn wire(&self, n: usize) -> Arc<Mutex<Wire>> {
        self.registry.lock().unwrap().order[n].clone()
    }

    /// Devices opened so far, in order.
    pub fn opened(&self) -> Vec<String> {
        self.registry.lock().unwrap().opened.clone()
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
        registry.next_qpn += 1;
        let qpn = registry.next_qpn;
        let wire = Arc::new(Mutex::new(Wire::default()));
        registry.wires.insert(qpn, wire.clone());
        registry.order.push(wire.clone());
        registry.opened.push(device.into());
        let slot = vec![0; slot_bytes as usize];
        let qp = FakeQp {
            wire,
            side: 0,
            send: vec![slot.clone(); slots as usize],
            recv: vec![slot; slots as usize],
            posted: VecDeque::new(),
        };
        Ok(Box::new(FakePending { qp, qpn, slot_bytes, registry: self.registry.clone() }))
    }
}

struct FakePending {
    qp: FakeQp,
    qpn: u32,
    slot_bytes: u32,
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
        drop(registry);
        Ok(Box::new(super::link::SlotLink::new(self.qp, max_message, timeout)?))
    }
}
