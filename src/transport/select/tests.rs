//! The choice of transport per link on replayed doctor reports (tests/fixtures/rdma), and the fallback
//! to TCP with backoff after an injected RDMA failure (times are passed in; nothing sleeps).

use super::*;
use crate::node::NodeId;
use crate::rdma::{self, Captures};
use crate::transport::rdma::{FramingError, RdmaError};
use crate::transport::ring::RdmaRoute;

fn report(folder: &str) -> NodeReport {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rdma").join(folder);
    rdma::doctor(&Captures::replay(&dir).expect("fixture folder"))
}

fn node(name: &str, report: Option<NodeReport>) -> NodeRdma {
    NodeRdma { node: NodeId::random(), name: name.into(), report }
}

/// A cable from `a`'s en4 to `b`'s en4.
fn cable(a: &NodeRdma, b: &NodeRdma, ready: bool) -> Cable {
    Cable {
        a: a.node,
        a_receptacle: Some(3),
        a_interface: Some("en4".into()),
        b: b.node,
        b_receptacle: Some(3),
        b_interface: Some("en4".into()),
        rdma_ready: ready,
    }
}

fn choice(build: RdmaBuild, local: &NodeRdma, remote: &NodeRdma, cables: &[Cable]) -> Result<RdmaPath, String> {
    eligible(&LinkFacts { build, local, remote, cables }).map_err(|r| r.to_string())
}

#[test]
fn rdma_when_both_ends_are_healthy_and_cabled() {
    let (mini, studio) =
        (node("mini", Some(report("healthy-two-macs"))), node("studio", Some(report("healthy-two-macs"))));
    // The cable is found whichever end the cluster listed first.
    for cables in [[cable(&mini, &studio, true)], [cable(&studio, &mini, true)]] {
        let path = choice(RdmaBuild::Ready, &mini, &studio, &cables).unwrap();
        assert_eq!(path, RdmaPath { local_device: "rdma_en4".into(), remote_device: "rdma_en4".into() });
    }
}

#[test]
fn tcp_otherwise_with_each_reason() {
    let healthy = || Some(report("healthy-two-macs"));
    let mini = node("mini", healthy());
    let with = |remote: &NodeRdma, ready: bool| choice(RdmaBuild::Ready, &mini, remote, &[cable(&mini, remote, ready)]);
    let studio = node("studio", healthy());
    let cables = [cable(&mini, &studio, true)];

    let no_feature = choice(RdmaBuild::WithoutFeature, &mini, &studio, &cables).unwrap_err();
    assert!(no_feature.contains("without the rdma feature"), "{no_feature}");
    let not_wired = choice(RdmaBuild::NotInDataPlane, &mini, &studio, &cables).unwrap_err();
    assert!(not_wired.contains("does not carry ring frames over RDMA"), "{not_wired}");

    assert_eq!(with(&node("studio", None), true).unwrap_err(), "no RDMA doctor report from studio yet");
    let disabled = with(&node("studio", Some(report("rdma-disabled"))), true).unwrap_err();
    assert_eq!(disabled, "RDMA is not usable on studio: RDMA enabled (rdma_ctl) failed: rdma_ctl status: disabled");
    let bridge = with(&node("studio", Some(report("bridge-active"))), true).unwrap_err();
    assert!(bridge.starts_with("RDMA is not usable on studio: Thunderbolt Bridge inactive failed"), "{bridge}");
    let ipv4 = with(&node("studio", Some(report("missing-ipv4"))), true).unwrap_err();
    assert_eq!(ipv4, "RDMA is not usable on studio: no Thunderbolt port is ready for RDMA");
    let linux = node("box", Some(rdma::doctor(&Captures { platform: "linux".into(), ..Default::default() })));
    assert!(with(&linux, true).unwrap_err().contains("runs linux"));

    assert_eq!(
        choice(RdmaBuild::Ready, &mini, &studio, &[]).unwrap_err(),
        "no Thunderbolt cable joins these two nodes"
    );

    // The studio is usable on another port, but this cable's port runs at 40 Gb/s.
    let mut slow = report("healthy-two-macs");
    let mut tb4 = slow.links[0].clone();
    tb4.interface = Some("en2".into());
    tb4.speed_gbps = Some(40);
    slow.links.push(tb4);
    let studio = node("studio", Some(slow));
    let mut on_en2 = cable(&mini, &studio, false);
    on_en2.b_interface = Some("en2".into());
    let ports = choice(RdmaBuild::Ready, &mini, &studio, &[on_en2]).unwrap_err();
    assert_eq!(
        ports,
        "the Thunderbolt cable is not ready for RDMA: studio: en2 runs at 40 Gb/s (RDMA needs Thunderbolt 5, 80 Gb/s)"
    );
}

#[test]
fn an_rdma_failure_falls_back_to_tcp_and_rdma_is_retried_later() {
    let (mini, studio) =
        (node("mini", Some(report("healthy-two-macs"))), node("studio", Some(report("healthy-two-macs"))));
    let cables = [cable(&mini, &studio, true)];
    let facts = LinkFacts { build: RdmaBuild::Ready, local: &mini, remote: &studio, cables: &cables };
    let mut link = LinkSelector::default();
    let t0 = 1_000_000;
    assert_eq!(link.choose(&facts, t0), LinkTransport::Rdma { device: "rdma_en4".into() });

    link.rdma_failed(&RdmaError::Timeout(std::time::Duration::from_secs(2)), t0);
    let LinkTransport::Tcp { reason, retry_at_ms } = link.choose(&facts, t0) else { panic!("still on RDMA") };
    assert_eq!(reason, "RDMA failed (no RDMA completion within 2s); using TCP until the next try");
    assert_eq!(retry_at_ms, Some(t0 + FIRST_RETRY_MS));
    assert!(matches!(link.choose(&facts, t0 + FIRST_RETRY_MS - 1), LinkTransport::Tcp { .. }));
    assert!(matches!(link.choose(&facts, t0 + FIRST_RETRY_MS), LinkTransport::Rdma { .. }), "retried after the wait");

    // Failing again on the retry doubles the wait, up to the longest.
    let t1 = t0 + FIRST_RETRY_MS;
    link.rdma_failed(&RdmaError::Framing(FramingError::Checksum { seq: 41 }), t1);
    let LinkTransport::Tcp { reason, retry_at_ms } = link.choose(&facts, t1) else { panic!() };
    assert_eq!(retry_at_ms, Some(t1 + 2 * FIRST_RETRY_MS));
    assert!(reason.contains("checksum mismatch in slot 41") && reason.contains("2 failures in a row"), "{reason}");
    for _ in 0..20 {
        link.rdma_failed(&"again", t1);
    }
    assert!(
        matches!(link.choose(&facts, t1), LinkTransport::Tcp { retry_at_ms: Some(at), .. } if at == t1 + LONGEST_RETRY_MS)
    );

    // Once RDMA works again, the next failure waits the shortest time.
    link.rdma_worked();
    assert_eq!(link.failures(), 0);
    link.rdma_failed(&"timeout", t1);
    assert!(
        matches!(link.choose(&facts, t1), LinkTransport::Tcp { retry_at_ms: Some(at), .. } if at == t1 + FIRST_RETRY_MS)
    );

    // A link that is not eligible says why, with no retry pending.
    let tcp_only = LinkFacts { build: RdmaBuild::WithoutFeature, ..facts };
    assert!(matches!(LinkSelector::default().choose(&tcp_only, t0), LinkTransport::Tcp { retry_at_ms: None, .. }));
}

#[test]
fn a_ring_link_gets_both_devices_and_a_running_fallback_pins_the_badge_to_tcp() {
    let (mini, studio) =
        (node("mini", Some(report("healthy-two-macs"))), node("studio", Some(report("healthy-two-macs"))));
    let cables = [cable(&mini, &studio, true)];
    let facts = LinkFacts { build: RdmaBuild::Ready, local: &mini, remote: &studio, cables: &cables };
    let mut link = LinkSelector::default();
    let (badge, route) = link.choose_ring(&facts, 0, None);
    assert_eq!(badge, LinkTransport::Rdma { device: "rdma_en4".into() });
    let route = route.expect("a route");
    assert_eq!((route.device.as_str(), route.peer_device.as_str()), ("rdma_en4", "rdma_en4"));
    let version = mini.report.as_ref().and_then(|r| r.macos.as_ref()).unwrap();
    assert_eq!(route.slot_bytes, RdmaRoute::slot_bytes_for([Some(version), Some(version)]), "from {version:?}");

    // The worker reports a fallback: TCP until the next try, then RDMA for new launches while the
    // running model's link still shows TCP with its reason.
    link.rdma_failed(&"slot 12 damaged", 0);
    let (badge, route) = link.choose_ring(&facts, 0, Some("slot 12 damaged"));
    assert!(matches!(badge, LinkTransport::Tcp { retry_at_ms: Some(_), .. }) && route.is_none(), "{badge:?}");
    let (badge, route) = link.choose_ring(&facts, FIRST_RETRY_MS, Some("slot 12 damaged"));
    let LinkTransport::Tcp { reason, .. } = badge else { panic!("{badge:?}") };
    assert!(reason.contains("slot 12 damaged") && reason.contains("until the model is launched again"), "{reason}");
    assert!(route.is_some(), "a new launch tries RDMA again");
    let (badge, _) = link.choose_ring(&facts, FIRST_RETRY_MS, None);
    assert!(matches!(badge, LinkTransport::Rdma { .. }));

    // Without RDMA in the build, no route at all.
    let tcp_only = LinkFacts { build: RdmaBuild::WithoutFeature, ..facts };
    assert_eq!(LinkSelector::default().choose_ring(&tcp_only, 0, None).1, None);
}

#[test]
fn the_badge_serialises_compactly_and_old_reports_still_parse() {
    let tcp = LinkTransport::Tcp { reason: "no Thunderbolt cable joins these two nodes".into(), retry_at_ms: None };
    assert_eq!(
        serde_json::to_value(&tcp).unwrap(),
        serde_json::json!({ "kind": "tcp", "reason": "no Thunderbolt cable joins these two nodes" })
    );
    let rdma = serde_json::to_value(LinkTransport::Rdma { device: "rdma_en4".into() }).unwrap();
    assert_eq!(rdma, serde_json::json!({ "kind": "rdma", "device": "rdma_en4" }));
    // A link report from a node without the field.
    let old = serde_json::json!({
        "peer": NodeId::random(), "kind": "thunderbolt", "interface": "en4", "local_addr": null, "remote_addr": null,
        "rtt_p50_us": 40, "rtt_p99_us": 90, "rtt_samples": 3, "throughput_bps": null,
        "throughput_measured_at_ms": null, "errors": 0
    });
    let parsed: crate::links::LinkReport = serde_json::from_value(old).unwrap();
    assert_eq!(parsed.transport, None);
}
