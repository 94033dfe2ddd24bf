//! Joins under a flood (issue 46): strangers at four addresses, each sending twenty join attempts a
//! second with wrong codes, cannot keep a new node with the right code out — each address is held to
//! its own few attempts, and the joining node tries again a while when a member refuses it for the rate
//! of attempts instead of giving up. Run in the harness's network namespaces (each node its own address).

mod common;

use common::cluster::{Network, TestCluster};
use shoal::cluster::MemberRecord;
use shoal::node::NodeId;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn a_join_flood_from_four_addresses_does_not_keep_out_the_right_code() {
    let _guard = common::cluster::exclusive();
    let mut c = TestCluster::new(6);
    if c.network != Network::Netns {
        common::cannot_run("four strangers' addresses and a joiner's need network namespaces");
        return;
    }
    c.start(0, &[]);
    c.wait_ready(0);
    let code = c.code(0);
    let control: SocketAddr = c.nodes[0].control_addr().parse().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let attempts = Arc::new(AtomicUsize::new(0));
    let floods: Vec<_> = (2..6)
        .map(|stranger| {
            let (stop, attempts) = (stop.clone(), attempts.clone());
            c.in_network(stranger, move || {
                let runtime = tokio::runtime::Runtime::new().unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let me = MemberRecord { id: NodeId::random(), name: "flood".into(), control: vec![], api_port: 1 };
                    let guess = runtime.block_on(shoal::cluster::join::request(control, "ABCDEFGH", me));
                    assert!(guess.is_err(), "a wrong code got in");
                    attempts.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    c.start(1, &["--join", &code]);
    c.wait_for(Duration::from_secs(60), "the new node to join during the flood", || {
        c.status(1).is_some_and(|s| s.nodes.len() == 2 && s.nodes.iter().all(|n| n.status.is_up()))
    });
    stop.store(true, Ordering::Relaxed);
    floods.into_iter().for_each(|f| f.join().unwrap());
    let sent = attempts.load(Ordering::Relaxed);
    assert!(sent > 100, "the strangers flooded ({sent} attempts)");
    // The member counts the joiner, and none of the strangers.
    let status = c.status(0).unwrap();
    assert_eq!(status.nodes.len(), 2, "{}", c.logs());
}
