//! SlotLink over an in-memory pair of queue pairs that behave as Apple's UC ones do (see `fake`): a send
//! waits until the peer has a receive posted, its completion says nothing about delivery, a failed
//! completion puts the queue pair in the error state, and the wire can drop, damage or fail a given send.
//! Messages of every size cross both ways through few slots; every fault surfaces as an error (the link
//! then falls back to TCP); stalls time out.

use super::*;
use crate::transport::rdma::fake::{pair, Direction, FakeQp, FLUSHED, RECEIVE_FAILED, SEND_FAILED, SLOT};
use crate::transport::rdma::FramingError;

fn link(qp: FakeQp, timeout_ms: u64) -> SlotLink<FakeQp> {
    SlotLink::new(qp, 1 << 20, Duration::from_millis(timeout_ms)).unwrap()
}

fn message(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[test]
fn messages_of_every_size_cross_both_ways_through_few_slots() {
    let (a, b, _) = pair(4, [SLOT, SLOT]);
    let sizes = [0, 1, SLOT, 10 * SLOT + 17, 200_000];
    let echo = std::thread::spawn(move || {
        let mut b = link(b, 5_000);
        let mut buf = Vec::new();
        for _ in 0..sizes.len() {
            b.recv_into(&mut buf).unwrap();
            b.send(&buf).unwrap();
        }
        b.flush().unwrap();
    });
    let mut a = link(a, 5_000);
    let mut back = Vec::new();
    for len in sizes {
        a.send(&message(len)).unwrap();
        a.recv_into(&mut back).unwrap();
        assert_eq!(back, message(len), "{len} bytes");
    }
    a.flush().unwrap();
    echo.join().unwrap();
}

/// Sends a 12 KiB message (four slots: each holds 4 KiB less its header) from a to b with `fault` set on
/// the wire; what b's receive says.
fn receive_with(fault: impl FnOnce(&mut Direction)) -> Result<Vec<u8>, RdmaError> {
    let (a, b, wire) = pair(8, [SLOT, SLOT]);
    fault(&mut wire.lock().unwrap().directions[0]);
    let (mut a, mut b) = (link(a, 200), link(b, 200));
    a.send(&message(3 * SLOT)).unwrap();
    let mut got = Vec::new();
    b.recv_into(&mut got).map(|_| got)
}

#[test]
fn a_dropped_or_damaged_slot_is_an_error_not_bad_data() {
    assert_eq!(receive_with(|_| {}).unwrap(), message(3 * SLOT));
    assert_eq!(
        receive_with(|d| d.drop_at = Some(1)),
        Err(RdmaError::Framing(FramingError::Sequence { expected: 1, got: 2 }))
    );
    assert_eq!(receive_with(|d| d.corrupt_at = Some(2)), Err(RdmaError::Framing(FramingError::Checksum { seq: 2 })));
    // The last slot lost: the receiver waits for it in vain.
    assert!(matches!(receive_with(|d| d.drop_at = Some(3)), Err(RdmaError::Timeout(_))));
}

#[test]
fn a_failed_completion_is_an_error() {
    let (a, b, wire) = pair(8, [SLOT, SLOT]);
    wire.lock().unwrap().directions[0].fail_at = Some(0);
    let (mut a, mut b) = (link(a, 200), link(b, 200));
    a.send(b"hello").unwrap();
    // The failed send never arrives.
    assert!(matches!(b.recv_into(&mut Vec::new()), Err(RdmaError::Timeout(_))));
    assert_eq!(a.flush(), Err(RdmaError::Completion { what: "send", status: SEND_FAILED }));
    // The queue pair is in the error state now: what it sends next completes flushed, not delivered.
    a.send(b"again").unwrap();
    assert!(matches!(a.flush(), Err(RdmaError::Completion { status: FLUSHED, .. })));
    assert!(matches!(b.recv_into(&mut Vec::new()), Err(RdmaError::Timeout(_))));

    // Receive slots of another size than the sender's: Apple fails the receive.
    let (a, b, _) = pair(2, [SLOT, 2 * SLOT]);
    let (mut a, mut b) = (link(a, 200), link(b, 200));
    a.send(b"hello").unwrap();
    assert_eq!(b.recv_into(&mut Vec::new()), Err(RdmaError::Completion { what: "receive", status: 1 }));
}

#[test]
fn a_broken_receiver_fails_what_it_had_posted() {
    let (a, b, wire) = pair(4, [SLOT, SLOT]);
    wire.lock().unwrap().directions[0].break_receiver_at = Some(1);
    let (mut a, mut b) = (link(a, 200), link(b, 200));
    let mut got = Vec::new();
    a.send(b"one").unwrap();
    b.recv_into(&mut got).unwrap();
    assert_eq!(got, b"one");
    a.send(b"two").unwrap();
    assert_eq!(b.recv_into(&mut got), Err(RdmaError::Completion { what: "receive", status: RECEIVE_FAILED }));
    // In the error state the receives it still had, and every one it posts, complete flushed.
    assert_eq!(b.recv_into(&mut got), Err(RdmaError::Completion { what: "receive", status: FLUSHED }));
}

#[test]
fn sends_complete_while_the_peer_is_not_polling() {
    // The peer posted its receives and then does nothing: as on the hardware, sends land in them and
    // complete without the peer polling (the sender's flush waits for every completion).
    let (a, b, wire) = pair(2, [SLOT, SLOT]);
    let (mut a, _b) = (link(a, 200), link(b, 200));
    a.send(b"one").unwrap();
    a.send(b"two").unwrap();
    a.flush().unwrap();
    assert_eq!(wire.lock().unwrap().directions[0].delivered, 2);
}

#[test]
fn sends_stall_without_posted_receives_and_time_out() {
    // The peer never reads: its two receives fill and are never posted again; two more slots go out
    // (and wait on the wire), the fifth waits for a credit that never comes.
    let (a, b, _) = pair(2, [SLOT, SLOT]);
    let (mut a, _b) = (link(a, 30), link(b, 30));
    assert_eq!(a.send(&message(5 * SLOT)), Err(RdmaError::Timeout(Duration::from_millis(30))));
    // And nobody sending: the receiver times out.
    let (a, b, _) = pair(2, [SLOT, SLOT]);
    let (_a, mut b) = (link(a, 30), link(b, 30));
    assert_eq!(b.recv_into(&mut Vec::new()), Err(RdmaError::Timeout(Duration::from_millis(30))));
}
