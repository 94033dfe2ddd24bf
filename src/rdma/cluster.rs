//! The doctor across the cluster: every node's report (each node runs its own doctor and shares the
//! result with its telemetry), and the checks only the cluster can make: the same macOS build
//! everywhere, and which Thunderbolt port of which Mac reaches which Mac (matched through the
//! Thunderbolt domain UUIDs each side reports), full mesh or not.

use super::checks::{Check, NodeReport, Verdict};
use crate::node::NodeId;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct NodeRdma {
    pub node: NodeId,
    pub name: String,
    pub report: Option<NodeReport>,
}

/// A Thunderbolt cable between two members, as both ends see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct Cable {
    pub a: NodeId,
    pub a_receptacle: Option<u32>,
    pub a_interface: Option<String>,
    pub b: NodeId,
    pub b_receptacle: Option<u32>,
    pub b_interface: Option<String>,
    /// Both ends' link layers are ready for RDMA.
    pub rdma_ready: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct ClusterRdma {
    pub nodes: Vec<NodeRdma>,
    pub cables: Vec<Cable>,
    pub checks: Vec<Check>,
}

fn check(id: &str, title: &str, verdict: Verdict, reason: String, fix: &str) -> Check {
    Check { id: id.into(), title: title.into(), verdict, reason, fix: fix.into() }
}

pub fn assess(nodes: Vec<NodeRdma>) -> ClusterRdma {
    let macs: Vec<&NodeRdma> =
        nodes.iter().filter(|n| n.report.as_ref().is_some_and(|r| r.platform == "macos")).collect();
    let mut cables = Vec::new();
    for (i, a) in macs.iter().enumerate() {
        for b in &macs[i + 1..] {
            let (ra, rb) =
                (a.report.as_ref().expect("macs have reports"), b.report.as_ref().expect("macs have reports"));
            // a's link whose far domain is one of b's own buses, and b's matching link back.
            for la in &ra.links {
                let Some(lb) =
                    rb.links.iter().find(|lb| lb.domain_uuid.as_deref() == Some(la.peer_domain_uuid.as_str()))
                else {
                    continue;
                };
                let ready = |r: &NodeReport, iface: &Option<String>| {
                    iface.as_ref().is_some_and(|i| r.usable_interfaces.contains(i))
                };
                cables.push(Cable {
                    a: a.node,
                    a_receptacle: la.receptacle,
                    a_interface: la.interface.clone(),
                    b: b.node,
                    b_receptacle: lb.receptacle,
                    b_interface: lb.interface.clone(),
                    rdma_ready: ready(ra, &la.interface) && ready(rb, &lb.interface),
                });
            }
        }
    }
    let mut checks = Vec::new();
    let builds: Vec<(String, String)> = macs
        .iter()
        .filter_map(|n| {
            n.report.as_ref()?.macos.as_ref().map(|v| (n.name.clone(), format!("{} ({})", v.version, v.build)))
        })
        .collect();
    checks.push(if builds.len() < 2 {
        check(
            "same_build",
            "The same macOS build on every Mac",
            Verdict::Unknown,
            format!("{} Mac(s) in the cluster", builds.len()),
            "",
        )
    } else if builds.iter().all(|(_, b)| *b == builds[0].1) {
        check("same_build", "The same macOS build on every Mac", Verdict::Pass, format!("all on {}", builds[0].1), "")
    } else {
        let list: Vec<String> = builds.iter().map(|(n, b)| format!("{n} {b}")).collect();
        check(
            "same_build",
            "The same macOS build on every Mac",
            Verdict::Fail,
            list.join(", "),
            "update every Mac to the same macOS build (RDMA ports may not find each other across builds)",
        )
    });
    let name = |id: NodeId| nodes.iter().find(|n| n.node == id).map_or_else(|| id.short(), |n| n.name.clone());
    let missing: Vec<String> = macs
        .iter()
        .enumerate()
        .flat_map(|(i, a)| macs[i + 1..].iter().map(move |b| (a.node, b.node)))
        .filter(|(a, b)| !cables.iter().any(|c| (c.a, c.b) == (*a, *b)))
        .map(|(a, b)| format!("{} — {}", name(a), name(b)))
        .collect();
    let described: Vec<String> = cables
        .iter()
        .map(|c| {
            let r = |x: Option<u32>| x.map_or("?".to_string(), |v| v.to_string());
            format!("{} port {} ↔ {} port {}", name(c.a), r(c.a_receptacle), name(c.b), r(c.b_receptacle))
        })
        .collect();
    checks.push(if macs.len() < 2 {
        check("full_mesh", "Thunderbolt full mesh between the Macs", Verdict::Unknown, format!("{} Mac(s) in the cluster", macs.len()), "")
    } else if missing.is_empty() {
        check("full_mesh", "Thunderbolt full mesh between the Macs", Verdict::Pass, described.join("; "), "")
    } else {
        check(
            "full_mesh",
            "Thunderbolt full mesh between the Macs",
            Verdict::Fail,
            format!("no cable between {}{}", missing.join(", "), if described.is_empty() { String::new() } else { format!(" (cabled: {})", described.join("; ")) }),
            "RDMA links are point to point: cable every Mac to every other with Thunderbolt 5 (pairs without a cable use TCP)",
        )
    });
    ClusterRdma { nodes, cables, checks }
}
