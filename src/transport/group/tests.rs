//! The group's links between threads over loopback TCP, and over RDMA from the in-memory queue pairs (the
//! verbs cannot run here).

use super::*;

/// Three ranks on loopback, connected as the workers connect.
async fn group(secret: [u8; 32]) -> Vec<Result<RankLinks, String>> {
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addresses: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let ranks = listeners.into_iter().enumerate().map(|(rank, listener)| {
        let addresses = addresses.clone();
        tokio::spawn(async move { connect(rank, &addresses, &listener, &secret).await })
    });
    let mut links = Vec::new();
    for r in ranks.collect::<Vec<_>>() {
        links.push(r.await.unwrap());
    }
    links
}

/// Runs `work` on every rank at once, each on its own thread; the links back, in rank order.
fn on_every_rank(links: Vec<RankLinks>, work: impl Fn(&mut RankLinks) + Clone + Send + 'static) -> Vec<RankLinks> {
    let handles: Vec<_> = links
        .into_iter()
        .map(|mut l| {
            let work = work.clone();
            std::thread::spawn(move || {
                work(&mut l);
                l
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Rank `rank`'s part of `len` bytes in exchange `step`.
fn part(rank: usize, step: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + rank * 31 + step) as u8).collect()
}

/// Every rank runs an exchange of a part of each length, checking every part it receives.
fn exchange_all(links: Vec<RankLinks>, lengths: Vec<usize>) -> Vec<RankLinks> {
    on_every_rank(links, move |l| {
        let rank = l.rank();
        let mut theirs = vec![Vec::new(); 3];
        for (step, &len) in lengths.iter().enumerate() {
            l.exchange(&part(rank, step, len), &mut theirs).unwrap();
            for (r, frame) in theirs.iter().enumerate().filter(|(r, _)| *r != rank) {
                assert!(*frame == part(r, step, len), "rank {rank}, step {step}: rank {r}'s part");
            }
        }
    })
}

/// One way, as a step and the logits go: rank 0 sends `to_rank_1` to rank 1 and a step to rank 2, which
/// answers with its logits.
fn step_and_logits(links: Vec<RankLinks>, to_rank_1: Vec<u8>) -> Vec<RankLinks> {
    on_every_rank(links, move |l| {
        let mut frame = Vec::new();
        match l.rank() {
            0 => {
                l.send(1, &to_rank_1).unwrap();
                l.send(2, b"step").unwrap();
                l.recv(2, &mut frame).unwrap();
                assert_eq!(frame, b"logits 2");
            }
            1 => {
                l.recv(0, &mut frame).unwrap();
                assert_eq!(frame, to_rank_1);
            }
            _ => {
                l.recv(0, &mut frame).unwrap();
                assert_eq!(frame, b"step");
                l.send(0, b"logits 2").unwrap();
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_exchange_frames_of_any_size_at_once() {
    let links: Vec<RankLinks> = group([5; 32]).await.into_iter().map(Result::unwrap).collect();
    // Small frames, then 8 MiB ones, which no socket buffer holds: every rank writes before it reads, so
    // a rank that waited to finish writing would wait for ever.
    let links = exchange_all(links, vec![16, 8 << 20]);
    let mut links = step_and_logits(links, b"step".to_vec());
    // A rank that is gone fails the others' exchange at once, saying which.
    let gone = links.pop().unwrap();
    drop(gone);
    let mut theirs = vec![Vec::new(); 3];
    let error = links[0].exchange(b"x", &mut theirs).unwrap_err();
    assert!(error.contains("rank 2"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_without_the_secret_does_not_join() {
    let mut listeners = Vec::new();
    for _ in 0..2 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addresses: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let (l0, l1) = (listeners.remove(0), listeners.remove(0));
    let a = addresses.clone();
    let stranger = tokio::spawn(async move { connect(1, &a, &l1, &[1; 32]).await });
    let rank0 = tokio::time::timeout(Duration::from_secs(3), connect(0, &addresses, &l0, &[2; 32])).await;
    assert!(rank0.is_err() || rank0.unwrap().is_err(), "rank 0 took a stranger");
    stranger.abort();
}

// ---- RDMA between ranks (in-memory queue pairs that behave as Apple's UC ones) ----

use crate::transport::rdma::fake::FakeRdma;
use crate::transport::ring::{RdmaRoute, RingTransport};
use std::sync::{Arc, Mutex};

/// What each rank reported: (rank, peer, transport), in order.
type Reports = Arc<Mutex<Vec<(usize, usize, RingTransport)>>>;

/// The device rank `r` opens for its link with rank `s`.
fn device(r: usize, s: usize) -> String {
    format!("rdma_{r}_{s}")
}

/// Patience a test can wait out: a late frame is asked about after 50 ms.
const QUICK: RdmaPatience = RdmaPatience { probe: Duration::from_millis(50), grace: Duration::from_millis(50) };

/// Three ranks connected over loopback TCP, then RDMA started on every pair through `rdma`.
async fn rdma_group(rdma: &FakeRdma, patience: RdmaPatience) -> (Vec<RankLinks>, Reports) {
    let links: Vec<RankLinks> = group([5; 32]).await.into_iter().map(Result::unwrap).collect();
    let reports: Reports = Arc::default();
    let started: Vec<_> = links
        .into_iter()
        .map(|mut links| {
            let (rdma, reports) = (rdma.clone(), reports.clone());
            std::thread::spawn(move || {
                let r = links.rank();
                let routes: Vec<Option<RdmaRoute>> = (0..3)
                    .map(|s| {
                        (s != r).then(|| RdmaRoute {
                            device: device(r, s),
                            peer_device: device(s, r),
                            slot_bytes: 4096,
                        })
                    })
                    .collect();
                let report: GroupReport = Arc::new(move |peer, t| reports.lock().unwrap().push((r, peer, t)));
                links.start_rdma(RdmaSetup { routes: &routes, opener: &rdma, report, patience }).unwrap();
                links
            })
        })
        .collect();
    (started.into_iter().map(|h| h.join().unwrap()).collect(), reports)
}

/// Parts that vary from one slot to many, `steps` of them.
fn slot_spanning(steps: usize) -> Vec<usize> {
    (0..steps).map(|step| [16, 2304, 4096, 13_000, 200_000][step % 5]).collect()
}

/// The pairs each rank reported falling back, as (rank, peer).
fn fallbacks(reports: &Reports) -> Vec<(usize, usize)> {
    let reports = reports.lock().unwrap();
    let mut pairs: Vec<(usize, usize)> =
        reports.iter().filter(|(_, _, t)| matches!(t, RingTransport::Tcp { .. })).map(|(r, p, _)| (*r, *p)).collect();
    pairs.sort();
    pairs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pair_carries_its_frames_over_rdma_when_chosen() {
    let rdma = FakeRdma::default();
    let (links, reports) = rdma_group(&rdma, RdmaPatience::default()).await;
    {
        let reports = reports.lock().unwrap();
        assert_eq!(reports.len(), 6, "each rank reports each pair: {reports:?}");
        assert!(reports.iter().all(|(_, _, t)| matches!(t, RingTransport::Rdma { .. })), "{reports:?}");
    }
    // A queue pair at each end of each pair of ranks, carrying both directions.
    assert_eq!(rdma.open_queue_pairs(), 6);
    for (r, peer) in links.iter().flat_map(|l| l.peers.iter().flatten().map(move |p| (l.rank(), p))) {
        assert_eq!(peer.rdma_device(), Some(device(r, peer.rank()).as_str()));
    }
    // Parts of up to 200 kB cross both ways at once through 32 slots of 4 KiB: a rank that waited to
    // finish sending before it took what came would wait for ever.
    let links = exchange_all(links, slot_spanning(10));
    step_and_logits(links, part(0, 4, 200_000));
    assert_eq!(fallbacks(&reports), vec![], "nothing fell back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_or_damaged_frame_moves_its_pair_to_tcp_and_loses_nothing() {
    let rdma = FakeRdma::default();
    let (links, reports) = rdma_group(&rdma, QUICK).await;
    // Rank 0's eighth slot to rank 1 is lost; rank 2's fifth to rank 1 arrives damaged.
    rdma.faults_from(&device(0, 1), |sent| sent.drop_at = Some(7));
    rdma.faults_from(&device(2, 1), |sent| sent.corrupt_at = Some(4));
    exchange_all(links, slot_spanning(20));
    assert_eq!(fallbacks(&reports), vec![(0, 1), (1, 0), (1, 2), (2, 1)], "both ends of both pairs");
    let reports = reports.lock().unwrap();
    let reason_at = |r: usize, p: usize| {
        reports.iter().rev().find_map(|(a, b, t)| match t {
            RingTransport::Tcp { reason } if (*a, *b) == (r, p) => Some(reason.clone()),
            _ => None,
        })
    };
    let (lost, damaged) = (reason_at(1, 0).unwrap(), reason_at(1, 2).unwrap());
    assert!(lost.contains("lost or repeated"), "{lost}");
    assert!(damaged.contains("damaged"), "{damaged}");
    assert!(reason_at(0, 1).unwrap().contains("rank 1 fell back"), "the other end says who asked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_last_frame_is_found_by_asking_and_a_long_wait_is_not_a_loss() {
    let rdma = FakeRdma::default();
    let (links, reports) = rdma_group(&rdma, QUICK).await;
    let mut links = links.into_iter();
    let (mut leader, mut follower, _other) = (links.next().unwrap(), links.next().unwrap(), links.next().unwrap());
    let follower = std::thread::spawn(move || {
        let mut frame = Vec::new();
        // Waits six times the probe's patience for the first step: a rank between requests.
        follower.recv(0, &mut frame).unwrap();
        assert_eq!(frame, b"step 1");
        follower.send(0, b"done 1").unwrap();
        // The second step's only slot is lost, and nothing follows it: the follower asks, the leader
        // says it sent it, and the pair moves to TCP, which brings it.
        follower.recv(0, &mut frame).unwrap();
        assert_eq!(frame, b"step 2");
        follower.send(0, b"done 2").unwrap();
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut frame = Vec::new();
    leader.send(1, b"step 1").unwrap();
    leader.recv(1, &mut frame).unwrap();
    assert_eq!(frame, b"done 1");
    assert_eq!(fallbacks(&reports), vec![], "a long wait is not a loss");
    rdma.faults_from(&device(0, 1), |sent| sent.drop_at = Some(1));
    leader.send(1, b"step 2").unwrap();
    leader.recv(1, &mut frame).unwrap();
    assert_eq!(frame, b"done 2");
    follower.join().unwrap();
    assert_eq!(fallbacks(&reports), vec![(0, 1), (1, 0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_gone_fails_an_exchange_over_rdma_at_once_and_a_refused_device_means_tcp() {
    let rdma = FakeRdma::default();
    let (mut links, _) = rdma_group(&rdma, RdmaPatience::default()).await;
    drop(links.pop());
    let started = std::time::Instant::now();
    let error = links[0].exchange(b"x", &mut [Vec::new(), Vec::new(), Vec::new()]).unwrap_err();
    assert!(error.contains("rank 2"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5), "noticed in {:?}", started.elapsed());

    let refusing = FakeRdma::default();
    refusing.refuse("no device rdma_en5 here");
    let (links, reports) = rdma_group(&refusing, RdmaPatience::default()).await;
    assert_eq!(fallbacks(&reports).len(), 3, "each pair's offering end: {:?}", reports.lock().unwrap());
    assert!(reports.lock().unwrap().iter().all(|(_, _, t)| match t {
        RingTransport::Tcp { reason } => reason.contains("no device rdma_en5 here"),
        _ => false,
    }));
    exchange_all(links, slot_spanning(5));
}
