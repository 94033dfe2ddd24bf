//! Ring links over a real authenticated TCP connection on loopback, with RDMA from the in-memory queue
//! pairs (the verbs cannot run here): frames arrive in order and exactly once whether RDMA carries them,
//! fails half-way (a lost slot, a damaged one, a failed completion, a lost last slot), or cannot start
//! at either end; each fallback is reported with its reason.

use super::*;
use crate::rdma::parse::MacOsVersion;
use crate::transport::rdma::fake::{FakeRdma, Wire};
use crate::transport::{accept_tcp, connect_tcp};
use std::sync::Mutex;

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
    RdmaRoute { device: "rdma_en3".into(), peer_device: "rdma_en5".into(), slot_bytes: 4096 }
}

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
    let (outbound, inbound) = tcp_pair();
    let receiver_rdma = receiver_rdma.clone();
    let receiving = std::thread::spawn(move || {
        let mut source = open_inbound(inbound, &receiver_rdma).unwrap();
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
    let mut sink = open_outbound(outbound, route.as_ref(), sender_rdma, report).unwrap();
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
    let rdma = FakeRdma::default();
    let run = send_frames(300, Some(route()), &rdma, &rdma, |_| {});
    assert_eq!(run.reports, [RingTransport::Rdma { device: "rdma_en3".into() }]);
    assert_eq!(rdma.opened(), ["rdma_en3", "rdma_en5"], "each end opens the device the agent named");
    // 300 frames of 0 to 70,000 bytes: several slots each on average, all over the queue pair.
    assert!(rdma.wire(0).lock().unwrap().directions[0].delivered > 1000);
}

#[test]
fn a_slot_lost_half_way_moves_the_link_to_tcp_and_loses_no_frame() {
    let rdma = FakeRdma::default();
    let run =
        send_frames(300, Some(route()), &rdma, &rdma, |wire| wire.lock().unwrap().directions[0].drop_at = Some(250));
    let reason = tcp_reason(&run);
    assert!(reason.contains("the next stage") && reason.contains("lost or repeated"), "{reason}");
}

#[test]
fn a_damaged_slot_moves_the_link_to_tcp_and_loses_no_frame() {
    let rdma = FakeRdma::default();
    let run =
        send_frames(300, Some(route()), &rdma, &rdma, |wire| wire.lock().unwrap().directions[0].corrupt_at = Some(77));
    assert!(tcp_reason(&run).contains("checksum mismatch"), "{:?}", run.reports);
}

#[test]
fn a_failed_send_completion_moves_the_link_to_tcp_and_loses_no_frame() {
    let rdma = FakeRdma::default();
    let run =
        send_frames(300, Some(route()), &rdma, &rdma, |wire| wire.lock().unwrap().directions[0].fail_at = Some(120));
    let reason = tcp_reason(&run);
    // Whichever end notices first: the sender's completion error, or the gap at the receiver.
    assert!(reason.contains("error status 12") || reason.contains("lost or repeated"), "{reason}");
}

#[test]
fn a_lost_last_slot_is_noticed_by_its_missing_acknowledgement() {
    // Two frames of one slot each; the second one's slot is lost and nothing follows it.
    let rdma = FakeRdma::default();
    let run = send_frames(2, Some(route()), &rdma, &rdma, |wire| wire.lock().unwrap().directions[0].drop_at = Some(1));
    assert!(tcp_reason(&run).contains("not acknowledged"), "{:?}", run.reports);
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
        let mut source = open_inbound(inbound, &receiver_rdma).unwrap();
        let mut got = Vec::new();
        loop {
            let mut bytes = Vec::new();
            match source.recv_into(&mut bytes) {
                Ok(()) => got.push(bytes),
                Err(e) => return (got, e),
            }
        }
    });
    let mut sink = open_outbound(outbound, Some(&route()), &rdma, Arc::new(|_| {})).unwrap();
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
