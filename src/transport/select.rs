//! Which transport each ring link uses. RDMA over Thunderbolt only when this build can carry ring
//! frames over RDMA, both ends' doctors say RDMA is usable, and a Thunderbolt cable joins the two with
//! an active RDMA port at both ends; TCP otherwise, always with a reason a person can read. An RDMA
//! error or timeout moves the link to TCP at once, and RDMA is tried again later, waiting longer after
//! each failure — never a cluster restart. Pure logic: the facts and the time are passed in.

use super::ring::RdmaRoute;
use crate::rdma::{Cable, NodeRdma, NodeReport, Verdict};
use serde::{Deserialize, Serialize};
use std::fmt;

/// First wait before trying RDMA again after a failure; it doubles with each failure in a row.
pub const FIRST_RETRY_MS: u64 = 30_000;
/// Longest wait between RDMA attempts.
pub const LONGEST_RETRY_MS: u64 = 15 * 60_000;

/// What this build can do with RDMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RdmaBuild {
    /// Built without the `rdma` feature.
    WithoutFeature,
    /// The verbs shim is built in, but the ring data plane does not carry frames over it yet.
    NotInDataPlane,
    Ready,
}

impl RdmaBuild {
    /// This build.
    pub const fn current() -> RdmaBuild {
        if !cfg!(feature = "rdma") {
            RdmaBuild::WithoutFeature
        } else if super::RDMA_RING_DATA_PLANE {
            RdmaBuild::Ready
        } else {
            RdmaBuild::NotInDataPlane
        }
    }
}

/// Why a link uses TCP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TcpReason {
    Build(RdmaBuild),
    /// A node's doctor has not reported yet.
    NoReport {
        node: String,
    },
    /// A node's doctor says RDMA is not usable there.
    NotUsable {
        node: String,
        why: String,
    },
    NoThunderboltCable,
    /// A cable joins them, but its ports are not ready for RDMA at both ends.
    PortsNotReady {
        detail: String,
    },
    /// RDMA failed on this link; it is tried again at `retry_at_ms`.
    Failed {
        error: String,
        failures: u32,
    },
}

impl fmt::Display for TcpReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TcpReason::Build(RdmaBuild::WithoutFeature) => {
                write!(f, "this build of shoal has no RDMA (built without the rdma feature)")
            }
            TcpReason::Build(_) => write!(f, "this build of shoal does not carry ring frames over RDMA yet"),
            TcpReason::NoReport { node } => write!(f, "no RDMA doctor report from {node} yet"),
            TcpReason::NotUsable { node, why } => write!(f, "RDMA is not usable on {node}: {why}"),
            TcpReason::NoThunderboltCable => write!(f, "no Thunderbolt cable joins these two nodes"),
            TcpReason::PortsNotReady { detail } => write!(f, "the Thunderbolt cable is not ready for RDMA: {detail}"),
            TcpReason::Failed { error, failures } => {
                write!(f, "RDMA failed ({error}); using TCP until the next try")?;
                if *failures > 1 {
                    write!(f, " ({failures} failures in a row)")?;
                }
                Ok(())
            }
        }
    }
}

/// The RDMA devices that carry a link, at each end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaPath {
    pub local_device: String,
    pub remote_device: String,
}

/// What the choice for one link looks at.
pub struct LinkFacts<'a> {
    pub build: RdmaBuild,
    pub local: &'a NodeRdma,
    pub remote: &'a NodeRdma,
    /// The Thunderbolt cables of the cluster ([`crate::rdma::assess`]).
    pub cables: &'a [Cable],
}

/// Checks whose failure makes RDMA unusable on the whole node.
const NODE_CHECKS: [&str; 4] = ["macos_version", "rdma_ctl", "rdma_devices", "thunderbolt_bridge"];

fn node_usable(node: &NodeRdma) -> Result<&NodeReport, TcpReason> {
    let report = node.report.as_ref().ok_or_else(|| TcpReason::NoReport { node: node.name.clone() })?;
    let not_usable = |why: String| TcpReason::NotUsable { node: node.name.clone(), why };
    if report.platform != "macos" {
        return Err(not_usable(format!("it runs {}, and RDMA over Thunderbolt is a macOS feature", report.platform)));
    }
    if let Some(check) =
        report.checks.iter().find(|c| NODE_CHECKS.contains(&c.id.as_str()) && c.verdict == Verdict::Fail)
    {
        return Err(not_usable(format!("{} failed: {}", check.title, check.reason)));
    }
    if report.usable_interfaces.is_empty() {
        return Err(not_usable("no Thunderbolt port is ready for RDMA".into()));
    }
    Ok(report)
}

/// What keeps `interface` of `report` from RDMA, in a few words.
fn port_problem(report: &NodeReport, interface: Option<&str>) -> Option<String> {
    let Some(interface) = interface else { return Some("the port's interface is unknown".into()) };
    if report.usable_interfaces.iter().any(|i| i == interface) {
        return None;
    }
    let Some(link) = report.links.iter().find(|l| l.interface.as_deref() == Some(interface)) else {
        return Some(format!("{interface} is not among its Thunderbolt links"));
    };
    Some(if link.speed_gbps.is_some_and(|s| s < 80) {
        format!("{interface} runs at {} Gb/s (RDMA needs Thunderbolt 5, 80 Gb/s)", link.speed_gbps.unwrap_or(0))
    } else if !link.peer_rdma_service {
        format!("the Mac across {interface} does not advertise RDMA")
    } else if link.ipv4.is_empty() {
        format!("{interface} has no IPv4 address")
    } else {
        format!("rdma_{interface} is {}", link.port_state.as_deref().unwrap_or("missing"))
    })
}

/// Whether the link between `facts.local` and `facts.remote` can use RDMA, and over which devices.
pub fn eligible(facts: &LinkFacts) -> Result<RdmaPath, TcpReason> {
    if facts.build != RdmaBuild::Ready {
        return Err(TcpReason::Build(facts.build));
    }
    let local = node_usable(facts.local)?;
    let remote = node_usable(facts.remote)?;
    let (me, peer) = (facts.local.node, facts.remote.node);
    let ends = facts.cables.iter().filter_map(|c| {
        if (c.a, c.b) == (me, peer) {
            Some((c, c.a_interface.as_deref(), c.b_interface.as_deref()))
        } else if (c.a, c.b) == (peer, me) {
            Some((c, c.b_interface.as_deref(), c.a_interface.as_deref()))
        } else {
            None
        }
    });
    let mut problems = Vec::new();
    for (cable, here, there) in ends {
        if let (true, Some(here), Some(there)) = (cable.rdma_ready, here, there) {
            return Ok(RdmaPath { local_device: format!("rdma_{here}"), remote_device: format!("rdma_{there}") });
        }
        let mut detail: Vec<String> = Vec::new();
        detail.extend(port_problem(local, here).map(|p| format!("{}: {p}", facts.local.name)));
        detail.extend(port_problem(remote, there).map(|p| format!("{}: {p}", facts.remote.name)));
        problems.push(detail.join("; "));
    }
    if problems.is_empty() {
        Err(TcpReason::NoThunderboltCable)
    } else {
        Err(TcpReason::PortsNotReady { detail: problems.join(" | ") })
    }
}

/// The transport a link uses, as the UI shows it (an RDMA or TCP badge with the reason).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum LinkTransport {
    Rdma {
        device: String,
    },
    Tcp {
        reason: String,
        /// When RDMA is tried again (after a failure), in ms since the epoch.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_at_ms: Option<u64>,
    },
}

/// One link's choice over time: RDMA while it works, TCP with backoff after it fails.
#[derive(Clone, Debug, Default)]
pub struct LinkSelector {
    failures: u32,
    last_error: Option<String>,
    retry_at_ms: Option<u64>,
}

impl LinkSelector {
    /// The transport to use now.
    pub fn choose(&self, facts: &LinkFacts, now_ms: u64) -> LinkTransport {
        match eligible(facts) {
            Err(reason) => LinkTransport::Tcp { reason: reason.to_string(), retry_at_ms: None },
            Ok(_) if self.retry_at_ms.is_some_and(|at| now_ms < at) => LinkTransport::Tcp {
                reason: TcpReason::Failed {
                    error: self.last_error.clone().unwrap_or_default(),
                    failures: self.failures,
                }
                .to_string(),
                retry_at_ms: self.retry_at_ms,
            },
            Ok(path) => LinkTransport::Rdma { device: path.local_device },
        }
    }

    /// The link's badge and the route a ring link launched now takes. `running_fallback` is the reason
    /// a running instance's link to this peer fell back to TCP: that link stays on TCP while it runs, so
    /// the badge says TCP even when new launches would try RDMA again.
    pub fn choose_ring(
        &self,
        facts: &LinkFacts,
        now_ms: u64,
        running_fallback: Option<&str>,
    ) -> (LinkTransport, Option<RdmaRoute>) {
        let transport = self.choose(facts, now_ms);
        let route = match (&transport, eligible(facts)) {
            (LinkTransport::Rdma { .. }, Ok(path)) => Some(RdmaRoute {
                device: path.local_device,
                peer_device: path.remote_device,
                slot_bytes: RdmaRoute::slot_bytes_for(
                    [facts.local, facts.remote].map(|n| n.report.as_ref().and_then(|r| r.macos.as_ref())),
                ),
            }),
            _ => None,
        };
        match (transport, running_fallback) {
            (LinkTransport::Rdma { .. }, Some(reason)) => {
                let reason = format!(
                    "RDMA failed on a running model's link ({reason}); it stays on TCP until the model is launched again"
                );
                (LinkTransport::Tcp { reason, retry_at_ms: None }, route)
            }
            (transport, _) => (transport, route),
        }
    }

    /// RDMA failed on this link at `now_ms` (an error, a timeout, a bad checksum): TCP until the next
    /// try, which comes later after each failure in a row.
    pub fn rdma_failed(&mut self, error: &dyn fmt::Display, now_ms: u64) {
        self.failures = self.failures.saturating_add(1);
        self.last_error = Some(error.to_string());
        let wait = FIRST_RETRY_MS.saturating_mul(1 << (self.failures - 1).min(16)).min(LONGEST_RETRY_MS);
        self.retry_at_ms = Some(now_ms.saturating_add(wait));
    }

    /// RDMA carried this link's traffic correctly: the next failure starts the waits from the shortest.
    pub fn rdma_worked(&mut self) {
        self.failures = 0;
        self.retry_at_ms = None;
        self.last_error = None;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests;
