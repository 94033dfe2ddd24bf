//! The cluster with real `shoal node` processes: formation, failure detection and rejoin, measured links,
//! and strangers kept out. Nodes run in network namespaces where possible (see common/cluster.rs).

mod common;

use common::cluster::{Network, TestCluster};
use shoal::cluster::health::DOWN_AFTER;
use shoal::cluster::ClusterSnapshot;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn all_alive(s: &ClusterSnapshot, n: usize) -> bool {
    s.nodes.len() == n && s.nodes.iter().all(|node| node.status.is_up())
}

fn join_arg(c: &TestCluster, code: &str) -> String {
    match c.network {
        Network::Netns => code.to_string(),
        Network::Loopback => format!("{code}@{}", c.nodes[0].control_addr()),
    }
}

/// Starts node 0, then nodes 1.. joining with one code; returns when all see each other alive, and how
/// long that took from the last start.
fn form(c: &mut TestCluster, extra: &[&str]) -> Duration {
    let n = c.nodes.len();
    c.start(0, extra);
    c.wait_ready(0);
    let join = join_arg(c, &c.code(0));
    for i in 1..n {
        let mut args = vec!["--join", join.as_str()];
        args.extend_from_slice(extra);
        c.start(i, &args);
    }
    let last_start = Instant::now();
    c.wait_for(Duration::from_secs(15), "the cluster to form", || {
        (0..n).all(|i| c.status(i).is_some_and(|s| all_alive(&s, n)))
    });
    last_start.elapsed()
}

#[test]
fn four_nodes_form_one_cluster_detect_failure_and_rejoin() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(4);
    let formed = form(&mut c, &[]);
    let views: Vec<ClusterSnapshot> = (0..4).map(|i| c.status(i).unwrap()).collect();
    assert!(views.iter().all(|v| v.cluster_id == views[0].cluster_id), "one cluster");
    let id3 = views[3].node_id;

    let killed = Instant::now();
    c.kill(3);
    let detected = c.wait_for(Duration::from_secs(10), "the others to mark node 3 down", || {
        (0..3).all(|i| {
            c.status(i)
                .is_some_and(|s| s.nodes.iter().any(|n| n.id == id3 && n.status == shoal::cluster::NodeStatus::Down))
        })
    });
    let detected = detected.max(killed.elapsed());

    c.start(3, &[]);
    c.wait_for(Duration::from_secs(10), "node 3 to come back", || {
        (0..4).all(|i| c.status(i).is_some_and(|s| all_alive(&s, 4)))
    });
    let back = c.status(3).unwrap();
    assert_eq!(back.node_id, id3, "a restarted node keeps its id");
    assert_eq!(back.cluster_id, views[0].cluster_id, "and rejoins by itself");
    for i in 0..4 {
        let s = c.status(i).unwrap();
        assert_eq!(s.nodes.len(), 4, "no duplicate of the restarted node: {:?}", s.nodes);
    }

    c.wait_for(Duration::from_secs(30), "every link to report RTT and throughput both ways", || {
        c.status(0).is_some_and(|s| {
            s.links.len() == 6
                && s.links.iter().all(|l| {
                    l.rtt_p50_us.is_some() && l.throughput_a_to_b_bps.is_some() && l.throughput_b_to_a_bps.is_some()
                })
        })
    });
    let pool = c.status(0).unwrap().pool;
    assert_eq!(pool.nodes_up, 4);
    assert!(pool.memory_total > 0 && pool.memory_available <= pool.memory_total);
    eprintln!("network {:?}: formed {formed:?} after the last start; node down after {detected:?}", c.network);
    // Bounds from the failure detector's own configuration, with a margin of as much again for a busy
    // machine: a joining node that takes longer than a silent one takes to be declared down, or a
    // detector twice as slow as configured, is a fault, not noise.
    let bound = 2 * DOWN_AFTER;
    assert!(formed <= bound, "the cluster formed {formed:?} after the last start (bound {bound:?})");
    assert!(
        detected <= bound,
        "a killed node was marked down after {detected:?} (detector: {DOWN_AFTER:?} of silence)"
    );
}

/// A TCP relay in front of `target` that delays every chunk by `delay` in each direction.
fn start_relay(listener: std::net::TcpListener, target: String, delay: Duration) {
    std::thread::spawn(move || {
        for inbound in listener.incoming().flatten() {
            let target = target.clone();
            std::thread::spawn(move || {
                let Ok(outbound) = TcpStream::connect(&target) else { return };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let pump = |mut from: TcpStream, mut to: TcpStream| {
                    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
                    std::thread::spawn(move || {
                        for (at, chunk) in rx {
                            std::thread::sleep(at.saturating_duration_since(Instant::now()));
                            if to.write_all(&chunk).is_err() {
                                return;
                            }
                        }
                    });
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                                return;
                            }
                        }
                    });
                };
                pump(inbound.try_clone().unwrap(), outbound.try_clone().unwrap());
                pump(outbound, inbound);
            });
        }
    });
}

/// The rate of the shaped link, and the delay the relay adds each way.
const SHAPED_MBIT: f64 = 100.0;
const RELAY_DELAY: Duration = Duration::from_millis(5);

#[test]
fn link_measurements_are_true() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    if c.network != Network::Netns {
        common::cannot_run("shaping a link needs network namespaces");
        return;
    }
    form(&mut c, &[]);
    // Let the measurements every node makes when it meets a peer finish before the link changes.
    c.wait_for(Duration::from_secs(30), "the first measurements", || {
        c.status(0).is_some_and(|s| {
            s.links.len() == 3
                && s.links.iter().all(|l| l.throughput_a_to_b_bps.is_some() && l.throughput_b_to_a_bps.is_some())
        })
    });
    let snapshot = c.status(0).unwrap();
    let mut by_id: Vec<(shoal::node::NodeId, usize)> =
        snapshot.nodes.iter().map(|n| (n.id, n.name.trim_start_matches("node").parse().unwrap())).collect();
    by_id.sort();
    let (x, shaped, y) = (by_id[0].1, by_id[1].1, by_id[2].1);

    // Traffic towards `shaped` crosses a token bucket of SHAPED_MBIT on its bridge port.
    let bridge = c.bridge_namespace().unwrap().to_string();
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &bridge, "tc", "qdisc", "add", "dev", &format!("p{shaped}"), "root", "tbf"])
        .args(["rate", &format!("{SHAPED_MBIT}mbit"), "burst", "32kbit", "latency", "50ms"])
        .output()
        .unwrap();
    assert!(out.status.success(), "tc: {}", String::from_utf8_lossy(&out.stderr));

    // The x–y path goes through a relay in x's namespace that adds RELAY_DELAY each way; x has the lower id,
    // so its connection (to the relay, given with --peer) is the one the pair keeps.
    let target = c.nodes[y].control_addr();
    let relay_port = c
        .in_network(x, move || {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            start_relay(listener, target, RELAY_DELAY);
            port
        })
        .join()
        .unwrap();
    c.kill(x);
    c.start(x, &["--peer", &format!("127.0.0.1:{relay_port}")]);
    let ids: Vec<_> = by_id.iter().map(|(id, _)| *id).collect();
    let pair = |s: &ClusterSnapshot, a: usize, b: usize| {
        let (ia, ib) = (
            ids[by_id.iter().position(|(_, i)| *i == a).unwrap()],
            ids[by_id.iter().position(|(_, i)| *i == b).unwrap()],
        );
        s.links.iter().find(|l| (l.a == ia && l.b == ib) || (l.a == ib && l.b == ia)).cloned()
    };
    // The relay adds RELAY_DELAY each way: the relayed link's RTT is at least twice that, and at least
    // ten times either direct link's (measured in the same snapshot, so a busy machine slows both).
    let relay_floor_us = 2 * RELAY_DELAY.as_micros() as u64;
    let rtt = |s: &ClusterSnapshot, a: usize, b: usize| pair(s, a, b).and_then(|l| l.rtt_p50_us);
    let relayed_slow = |s: &ClusterSnapshot| {
        rtt(s, x, y).is_some_and(|relayed| {
            relayed >= relay_floor_us
                && [x, y].iter().all(|&o| rtt(s, o, shaped).is_some_and(|direct| relayed >= 10 * direct))
        })
    };
    c.wait_for(Duration::from_secs(20), "the relayed link's RTT to rise while the others stay fast", || {
        c.status(shaped).is_some_and(|s| all_alive(&s, 3) && relayed_slow(&s))
    });

    let out = c.cli(shaped, &["links", "--measure"]);
    assert!(out.status.success(), "links --measure: {}", String::from_utf8_lossy(&out.stderr));
    let s = c.status(shaped).unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    let relayed = pair(&s, x, y).unwrap();
    assert!(
        relayed_slow(&s),
        "relayed RTT {:?} µs against direct {:?} and {:?}",
        rtt(&s, x, y),
        rtt(&s, x, shaped),
        rtt(&s, y, shaped)
    );
    let mut shaped_bps = Vec::new();
    for other in [x, y] {
        let link = pair(&s, other, shaped).unwrap();
        let (towards_shaped, away) = if link.b == ids[by_id.iter().position(|(_, i)| *i == shaped).unwrap()] {
            (link.throughput_a_to_b_bps.unwrap(), link.throughput_b_to_a_bps.unwrap())
        } else {
            (link.throughput_b_to_a_bps.unwrap(), link.throughput_a_to_b_bps.unwrap())
        };
        // The token bucket caps the rate: a measurement above it is wrong, and one far below it (the
        // rate is a small fraction of what this machine moves over a veth) misses the link.
        let ratio = towards_shaped as f64 / (SHAPED_MBIT * 1e6);
        assert!((0.7..=1.3).contains(&ratio), "a {SHAPED_MBIT} Mbit/s link measured {towards_shaped} bit/s");
        assert!(away as f64 > 5.0 * towards_shaped as f64, "unshaped direction {away} bit/s is not far more");
        shaped_bps.push(towards_shaped);
    }
    // Every probe also timed the round trip of small frames between waiting threads, which placement
    // predicts a model's link time from; each link has it from one end or the other.
    for (a, b) in [(x, y), (x, shaped), (y, shaped)] {
        let echo = pair(&s, a, b).unwrap().echo_rtt_us;
        assert!(echo.is_some_and(|us| (1..1_000_000).contains(&us)), "node{a}–node{b}: echo {echo:?}");
    }
    let fastest_shaped = shaped_bps.into_iter().max().unwrap() as f64;
    for bps in [relayed.throughput_a_to_b_bps.unwrap(), relayed.throughput_b_to_a_bps.unwrap()] {
        assert!(
            bps as f64 > 5.0 * fastest_shaped,
            "an unshaped link measured {bps} bit/s, not far more than a shaped one"
        );
    }
}

/// Opens a raw connection to `addr`, sends `bytes`, and returns whether the node closed it (within 6 s).
fn raw_client(addr: String, bytes: Vec<u8>) -> bool {
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(7))).unwrap();
    let _ = s.write_all(&bytes);
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn strangers_never_become_members_and_members_keep_running() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    c.start(0, &[]);
    c.wait_ready(0);
    let code = c.code(0);
    c.start(1, &["--join", &join_arg(&c, &code)]);
    c.wait_for(Duration::from_secs(10), "two members", || c.status(0).is_some_and(|s| all_alive(&s, 2)));
    let cluster_id = c.status(0).unwrap().cluster_id;

    // Watch node 0's events while a stranger tries a wrong code.
    let api = format!("127.0.0.1:{}", c.nodes[0].api_port);
    let events = c.in_network(0, move || {
        let mut s = TcpStream::connect(&api).unwrap();
        s.write_all(b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut seen = String::new();
        let mut buf = [0u8; 4096];
        while !seen.contains("\"reason\":\"wrong code\"") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
        seen
    });
    std::thread::sleep(Duration::from_millis(300));
    let wrong = if code.starts_with('2') { "3333-3333" } else { "2222-2222" };
    let target = match c.network {
        Network::Netns => format!("{wrong}@{}", c.nodes[0].control_addr()),
        Network::Loopback => format!("{wrong}@{}", c.nodes[0].control_addr()),
    };
    c.start(2, &["--join", &target]);
    let stranger_exit = c.wait_for(Duration::from_secs(15), "the stranger to give up", || {
        std::fs::read_to_string(&c.nodes[2].log).unwrap_or_default().contains("the join code is wrong")
    });
    let seen = events.join().unwrap();
    assert!(seen.contains("event: join_attempt") && seen.contains("wrong code"), "no join_attempt event: {seen}");
    eprintln!("the stranger was refused after {stranger_exit:?}");

    // A stranger with its own cluster dialing a member directly, and raw clients: none gets in.
    c.kill(2);
    let _ = std::fs::remove_dir_all(&c.nodes[2].data_dir);
    let member = c.nodes[0].control_addr();
    c.start(2, &["--peer", &member]);
    c.wait_ready(2);
    let mut preamble_then_junk = b"SHOAL\x01\x01\x00".to_vec();
    preamble_then_junk.extend_from_slice(&[48, 0]);
    preamble_then_junk.extend_from_slice(&[0x42; 48]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect()),
        ("HTTP", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("wrong version", b"SHOAL\x09\x01\x00".to_vec()),
        ("forged handshake", preamble_then_junk),
        ("oversized handshake", [b"SHOAL\x01\x01\x00".as_slice(), &[0xff, 0xff], &[0; 1000]].concat()),
        ("silence", Vec::new()),
    ];
    for (what, bytes) in cases {
        let addr = member.clone();
        let closed = c.in_network(2, move || raw_client(addr, bytes)).join().unwrap();
        assert!(closed, "node 0 kept a connection open after {what}");
    }
    // Not a pause: wait until each member has heard the other since the last attack ended, so the
    // checks below see the cluster after the attacks, not before their effects could show.
    let attacks_ended = Instant::now();
    c.wait_for(Duration::from_secs(15), "both members to hear each other after the attacks", || {
        (0..2).all(|i| {
            c.status(i).is_some_and(|s| {
                let peers: Vec<_> = s.nodes.iter().filter(|n| !n.is_self).collect();
                !peers.is_empty()
                    && peers.iter().all(|n| {
                        n.last_heard_ms_ago.is_some_and(|ms| u128::from(ms) < attacks_ended.elapsed().as_millis())
                    })
            })
        })
    });
    for i in 0..2 {
        let s = c.status(i).unwrap_or_else(|| panic!("member {i} stopped answering\n{}", c.logs()));
        assert_eq!(s.cluster_id, cluster_id);
        assert!(all_alive(&s, 2), "member {i}: {:?}", s.nodes);
    }
    let stranger = c.status(2).unwrap();
    assert_ne!(stranger.cluster_id, cluster_id);
    assert_eq!(stranger.nodes.len(), 1, "the stranger learned no members: {:?}", stranger.nodes);
    if c.network != Network::Netns {
        common::cannot_run("mDNS discovery of a nearby cluster needs network namespaces");
    } else {
        // Seen by mDNS, the stranger's cluster is listed as nearby (for the app to offer Join), not joined.
        c.wait_for(Duration::from_secs(10), "the stranger's cluster to be listed as nearby", || {
            c.status(0).is_some_and(|s| {
                s.nearby
                    .iter()
                    .any(|n| n.cluster_id == stranger.cluster_id && n.nodes.iter().any(|m| m.id == stranger.node_id))
            })
        });
    }
    let log = std::fs::read_to_string(&c.nodes[0].log).unwrap();
    assert!(log.contains("could not prove it holds the same secret"), "node 0 logs why it refused the stranger");

    // The API refuses to listen beyond loopback without a token.
    let out = common::shoal().args(["node", "--listen", "0.0.0.0", "--port", "1", "--no-mdns"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--api-token"));
}
