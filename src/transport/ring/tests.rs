//! Ring links over a real authenticated TCP connection on loopback, with RDMA from the in-memory queue
//! pairs (the verbs cannot run here): frames arrive in order and exactly once whether RDMA carries them,
//! fails half-way (a lost slot, a damaged one, a failed completion, a lost last slot), or cannot start
//! at either end; each fallback is reported with its reason.

use super::*;
use crate::rdma::parse::MacOsVersion;
use crate::transport::rdma::fake::{Direction, FakeRdma, Wire};
use crate::transport::rdma::{FRAME_BYTES, MAX_QUEUE_PAIRS};
use crate::transport::{accept_tcp, connect_tcp};
use std::sync::Mutex;
use std::time::Duration;

const SECRET: [u8; 32] = [7; 32];

/// A connected TCP pair: (sending end, receiving end).
fn tcp_pair() -> ((TcpSource, TcpSink), (TcpSource, TcpSink)) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (inbound, outbound) = tokio::join!(accept_tcp(&listener, &SECRET), connect_tcp(addr, &SECRET));
        (outbound.unwrap(), inbound.unwrap())
    })
}

fn route() -> RdmaRoute {
    route_with_slots(FRAME_BYTES as u32)
}

/// A route with slots of `slot_bytes` (one 4 KiB frame on macOS 26.2, 64 KiB when both run 26.3).
fn route_with_slots(slot_bytes: u32) -> RdmaRoute {
    RdmaRoute { device: "rdma_en3".into(), peer_device: "rdma_en5".into(), slot_bytes }
}

/// Both slot sizes a link may use.
const SLOT_SIZES: [u32; 2] = [FRAME_BYTES as u32, 16 * FRAME_BYTES as u32];

/// Timeouts no busy machine reaches: only a fault moves these links to TCP.
const PATIENT: RingTimeouts = RingTimeouts { completion: Duration::from_secs(120), ack: Duration::from_secs(120) };
/// For the one fault that only a timeout reveals (a last frame lost with nothing after it).
const QUICK_ACK: RingTimeouts = RingTimeouts { completion: Duration::from_secs(120), ack: Duration::from_millis(200) };

/// Frame `i`: its number and a length that varies from empty to several slots.
fn frame(i: usize) -> Vec<u8> {
    let len = [0, 9, 2304, 4096, 13_000, 70_000][i % 6];
    let mut bytes: Vec<u8> = (0..len).map(|j| (i * 31 + j) as u8).collect();
    if len >= 8 {
        bytes[..8].copy_from_slice(&(i as u64).to_le_bytes());
    }
    bytes
}

struct Run {
    reports: Vec<RingTransport>,
}

/// Opens a link with `route`, lets `fault` tamper with its RDMA wire (if it has one), sends `count`
/// frames and checks the receiver got each once, in order.
fn send_frames(
    count: usize,
    route: Option<RdmaRoute>,
    sender_rdma: &FakeRdma,
    receiver_rdma: &FakeRdma,
    fault: impl FnOnce(&Mutex<Wire>),
) -> Run {
    send_frames_with(count, route, sender_rdma, receiver_rdma, PATIENT, fault)
}

fn send_frames_with(
    count: usize,
    route: Option<RdmaRoute>,
    sender_rdma: &FakeRdma,
    receiver_rdma: &FakeRdma,
    timeouts: RingTimeouts,
    fault: impl FnOnce(&Mutex<Wire>),
) -> Run {
    let (outbound, inbound) = tcp_pair();
    let receiver_rdma = receiver_rdma.clone();
    let receiving = std::thread::spawn(move || {
        let mut source = open_inbound(inbound, &receiver_rdma, timeouts).unwrap();
        let mut got = Vec::new();
        for _ in 0..count {
            let mut bytes = Vec::new();
            source.recv_into(&mut bytes).unwrap();
            got.push(bytes);
        }
        got
    });
    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink_reports = reports.clone();
    let report: TransportReport = Arc::new(move |t| sink_reports.lock().unwrap().push(t));
    let mut sink = open_outbound(outbound, route.as_ref(), sender_rdma, report, timeouts).unwrap();
    if reports.lock().unwrap().iter().any(|r| matches!(r, RingTransport::Rdma { .. })) {
        fault(&sender_rdma.wire(0));
    }
    for i in 0..count {
        sink.send(&frame(i)).unwrap();
    }
    let got = receiving.join().unwrap();
    assert_eq!(got.len(), count);
    for (i, bytes) in got.iter().enumerate() {
        assert!(bytes == &frame(i), "frame {i} differs ({} bytes, want {})", bytes.len(), frame(i).len());
    }
    drop(sink);
    let reports = reports.lock().unwrap().clone();
    Run { reports }
}

fn tcp_reason(run: &Run) -> String {
    match run.reports.last() {
        Some(RingTransport::Tcp { reason }) => reason.clone(),
        other => panic!("the link did not fall back: {other:?} (all: {:?})", run.reports),
    }
}

#[test]
fn without_a_route_frames_go_over_tcp_and_nothing_is_reported() {
    let rdma = FakeRdma::default();
    let run = send_frames(40, None, &rdma, &rdma, |_| {});
    assert!(run.reports.is_empty());
    assert!(rdma.opened().is_empty());
}

#[test]
fn rdma_carries_every_frame_when_nothing_fails() {
    for slot_bytes in SLOT_SIZES {
        let rdma = FakeRdma::default();
        let run = send_frames(300, Some(route_with_slots(slot_bytes)), &rdma, &rdma, |_| {});
        assert_eq!(run.reports, [RingTransport::Rdma { device: "rdma_en3".into() }], "{slot_bytes}-byte slots");
        assert_eq!(rdma.opened(), ["rdma_en3", "rdma_en5"], "each end opens the device the agent named");
        // 300 frames of 0 to 70,000 bytes, all over the queue pair: several slots each on average
        // with 4 KiB slots, at least one each with 64 KiB ones.
        let delivered = rdma.wire(0).lock().unwrap().directions[0].delivered;
        assert!(delivered > if slot_bytes == 4096 { 1000 } else { 300 }, "{delivered} slots of {slot_bytes} bytes");
    }
}

/// Sends 300 frames over RDMA with `slot_bytes` slots and `fault` set on the sending direction (every
/// frame must still arrive once, in order); the reason the link fell back to TCP.
fn fallback_reason(slot_bytes: u32, fault: impl FnOnce(&mut Direction)) -> String {
    let rdma = FakeRdma::default();
    let run = send_frames(300, Some(route_with_slots(slot_bytes)), &rdma, &rdma, |wire| {
        fault(&mut wire.lock().unwrap().directions[0])
    });
    tcp_reason(&run)
}

#[test]
fn a_slot_lost_half_way_moves_the_link_to_tcp_and_loses_no_frame() {
    for slot_bytes in SLOT_SIZES {
        let reason = fallback_reason(slot_bytes, |d| d.drop_at = Some(250));
        assert!(reason.contains("the next stage") && reason.contains("lost or repeated"), "{slot_bytes}: {reason}");
    }
}

#[test]
fn a_damaged_slot_moves_the_link_to_tcp_and_loses_no_frame() {
    for slot_bytes in SLOT_SIZES {
        // The fake flips byte 100 of the slot: pick a slot whose fragment reaches that far (part of a
        // 70,000-byte frame with 4 KiB slots, a 13,000-byte one with 64 KiB slots).
        let at = if slot_bytes == 4096 { 77 } else { 74 };
        let reason = fallback_reason(slot_bytes, |d| d.corrupt_at = Some(at));
        assert!(reason.contains("checksum mismatch"), "{slot_bytes}: {reason}");
    }
}

#[test]
fn a_failed_send_completion_moves_the_link_to_tcp_and_loses_no_frame() {
    for slot_bytes in SLOT_SIZES {
        let reason = fallback_reason(slot_bytes, |d| d.fail_at = Some(120));
        // Whichever end notices first: the sender's completion error (its queue pair then in the error
        // state), or the gap at the receiver.
        assert!(reason.contains("error status 12") || reason.contains("lost or repeated"), "{slot_bytes}: {reason}");
    }
}

#[test]
fn a_receiving_queue_pair_in_the_error_state_moves_the_link_to_tcp_and_loses_no_frame() {
    for slot_bytes in SLOT_SIZES {
        let reason = fallback_reason(slot_bytes, |d| d.break_receiver_at = Some(150));
        assert!(reason.contains("the next stage") && reason.contains("error status 4"), "{slot_bytes}: {reason}");
    }
}

#[test]
fn a_lost_last_slot_is_noticed_by_its_missing_acknowledgement() {
    // Two frames of one slot each; the second one's slot is lost and nothing follows it.
    let rdma = FakeRdma::default();
    let run = send_frames_with(2, Some(route()), &rdma, &rdma, QUICK_ACK, |wire| {
        wire.lock().unwrap().directions[0].drop_at = Some(1)
    });
    assert!(tcp_reason(&run).contains("not acknowledged within 200ms"), "{:?}", run.reports);
}

#[test]
fn an_eleventh_queue_pair_means_tcp_and_a_closed_link_gives_its_queue_pair_back() {
    // Two machines; each link takes one queue pair at each end.
    let (here, there) = (FakeRdma::default(), FakeRdma::default());
    let open_link = || {
        let (outbound, inbound) = tcp_pair();
        let there = there.clone();
        let accepting = std::thread::spawn(move || open_inbound(inbound, &there, PATIENT).unwrap());
        let reports = Arc::new(Mutex::new(Vec::new()));
        let sink_reports = reports.clone();
        let report: TransportReport = Arc::new(move |t| sink_reports.lock().unwrap().push(t));
        let sink = open_outbound(outbound, Some(&route()), &here, report, PATIENT).unwrap();
        let source = accepting.join().unwrap();
        let reports = reports.lock().unwrap().clone();
        (sink, source, reports)
    };
    let mut links: Vec<_> = (0..MAX_QUEUE_PAIRS).map(|_| open_link()).collect();
    assert!(links.iter().all(|(_, _, r)| r == &[RingTransport::Rdma { device: "rdma_en3".into() }]));
    assert_eq!(here.open_queue_pairs(), MAX_QUEUE_PAIRS);

    let (mut sink, mut source, reports) = open_link();
    match reports.as_slice() {
        [RingTransport::Tcp { reason }] => assert!(reason.contains("at most 10 RDMA queue pairs"), "{reason}"),
        other => panic!("the eleventh link did not fall back: {other:?}"),
    }
    sink.send(b"over tcp").unwrap();
    let mut got = Vec::new();
    source.recv_into(&mut got).unwrap();
    assert_eq!(got, b"over tcp");

    drop(links.pop());
    assert_eq!(here.open_queue_pairs(), MAX_QUEUE_PAIRS - 1, "a closed link gives its queue pair back");
    // The far end gives its queue pair back when its receiving side sees the link close: wait for it.
    let deadline = std::time::Instant::now() + PATIENT.ack;
    while there.open_queue_pairs() != MAX_QUEUE_PAIRS - 1 {
        assert!(std::time::Instant::now() < deadline, "the far end kept the closed link's queue pair");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (_, _, reports) = open_link();
    assert_eq!(reports, [RingTransport::Rdma { device: "rdma_en3".into() }]);
}

#[test]
fn rdma_that_cannot_start_at_either_end_means_tcp_with_the_reason() {
    let (here, there) = (FakeRdma::default(), FakeRdma::default());
    there.refuse("rdma_en5 is not active");
    let run = send_frames(20, Some(route()), &here, &there, |_| {});
    let reason = tcp_reason(&run);
    assert!(reason.contains("the next stage could not start RDMA") && reason.contains("not active"), "{reason}");

    here.refuse("no such device");
    let run = send_frames(20, Some(route()), &here, &FakeRdma::default(), |_| {});
    assert!(tcp_reason(&run).starts_with("RDMA could not start here"), "{:?}", run.reports);
}

#[test]
fn the_previous_stage_going_away_ends_the_receive() {
    let rdma = FakeRdma::default();
    let (outbound, inbound) = tcp_pair();
    let receiver_rdma = rdma.clone();
    let receiving = std::thread::spawn(move || {
        let mut source = open_inbound(inbound, &receiver_rdma, PATIENT).unwrap();
        let mut got = Vec::new();
        loop {
            let mut bytes = Vec::new();
            match source.recv_into(&mut bytes) {
                Ok(()) => got.push(bytes),
                Err(e) => return (got, e),
            }
        }
    });
    let mut sink = open_outbound(outbound, Some(&route()), &rdma, Arc::new(|_| {}), PATIENT).unwrap();
    sink.send(b"one").unwrap();
    drop(sink);
    // The frame sent just before the close may or may not be taken; the receive then ends.
    let (got, error) = receiving.join().unwrap();
    assert!(got.is_empty() || got == [b"one".to_vec()], "{got:?}");
    assert!(error.is_disconnect(), "{error}");
}

#[test]
fn slots_are_larger_only_when_both_macs_run_26_3() {
    let macos = |version: &str| MacOsVersion { version: version.into(), build: "25D125".into() };
    let slots = |a: &str, b: Option<&str>| RdmaRoute::slot_bytes_for([Some(&macos(a)), b.map(macos).as_ref()]);
    assert_eq!(slots("26.3", Some("26.4.1")), 65536);
    assert_eq!(slots("26.2", Some("26.3")), 4096);
    assert_eq!(slots("27.0", None), 4096);
}
