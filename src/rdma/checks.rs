//! The doctor's checks: each prerequisite of RDMA over Thunderbolt with a verdict, a one-line reason and
//! a concrete fix, computed from parsed command outputs (live or replayed).

use super::parse::{self, Bus, DeviceInfo, DeviceList, Interface, MacOsVersion};
use super::Captures;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
pub struct Check {
    pub id: String,
    pub title: String,
    pub verdict: Verdict,
    pub reason: String,
    /// What to do about a failure (empty when it passes).
    pub fix: String,
}

fn check(id: &str, title: &str, verdict: Verdict, reason: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { id: id.into(), title: title.into(), verdict, reason: reason.into(), fix: fix.into() }
}

/// A Thunderbolt cable from this Mac to another, with what each layer says about it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct ThunderboltLink {
    pub receptacle: Option<u32>,
    /// This side's bus domain (the other Mac sees it as its peer's domain).
    pub domain_uuid: Option<String>,
    pub interface: Option<String>,
    pub speed_gbps: Option<u32>,
    pub peer_name: String,
    pub peer_domain_uuid: String,
    pub peer_rdma_service: bool,
    pub ipv4: Vec<String>,
    pub rdma_device: Option<String>,
    pub port_state: Option<String>,
    /// A link-local IPv4 to give the interface when it has none (what the IPv4 fix assigns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggested_ipv4: Option<String>,
}

/// The doctor's findings for one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[ts(rename = "RdmaNodeReport")]
pub struct NodeReport {
    pub platform: String,
    pub macos: Option<MacOsVersion>,
    pub checks: Vec<Check>,
    pub links: Vec<ThunderboltLink>,
    /// Links whose every layer is ready for RDMA (by interface).
    pub usable_interfaces: Vec<String>,
}

impl NodeReport {
    pub fn check(&self, id: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.id == id)
    }
}

const RECOVERY_STEPS: &str = "shut down; press and hold the power button until \"Loading startup options\" appears; \
choose Options, then Continue; open Utilities › Terminal; run `rdma_ctl enable`; restart";

/// A link-local IPv4 for an interface, from the last two bytes of its hardware address (as IPv4
/// link-local addressing does), so the two ends of a cable pick different addresses.
fn link_local_for(ether: Option<&str>, fallback: u32) -> String {
    let bytes: Vec<u8> = ether.unwrap_or_default().split(':').filter_map(|b| u8::from_str_radix(b, 16).ok()).collect();
    let (x, y) = match bytes.as_slice() {
        [.., a, b] => (*a, *b),
        _ => (100, fallback as u8),
    };
    format!("169.254.{}.{}", 1 + x % 254, 1 + y % 254)
}

/// Runs every check on `captures`.
pub fn run(captures: &Captures) -> NodeReport {
    let macos = captures.sw_vers.as_deref().and_then(parse::sw_vers);
    let on_mac = captures.platform == "macos";
    let buses = captures.thunderbolt.as_deref().map(parse::thunderbolt);
    let ports: Option<BTreeMap<u32, String>> = captures.hardware_ports.as_deref().map(|t| {
        crate::links::kind::hardware_ports(t)
            .into_iter()
            .filter_map(|(port, device)| {
                port.strip_prefix("Thunderbolt ").and_then(|n| n.trim().parse().ok()).map(|n| (n, device))
            })
            .collect()
    });
    let interfaces: Option<BTreeMap<String, Interface>> = captures.ifconfig.as_deref().map(parse::ifconfig);
    let devices = captures.ibv_devices.as_deref().map(parse::ibv_devices);
    let devinfo: Option<Vec<DeviceInfo>> = captures.ibv_devinfo.as_deref().map(parse::ibv_devinfo);
    let links = links_of(buses.as_deref(), ports.as_ref(), interfaces.as_ref(), devices.as_ref(), devinfo.as_deref());
    let mut checks = Vec::new();

    // macOS version.
    checks.push(match (&macos, on_mac) {
        (_, false) => check(
            "macos_version",
            "macOS 26.2 or later",
            Verdict::Unknown,
            format!("this node runs {}, not macOS: RDMA over Thunderbolt is a macOS feature", captures.platform),
            "",
        ),
        (None, true) => check(
            "macos_version",
            "macOS 26.2 or later",
            Verdict::Unknown,
            "sw_vers gave no version",
            "run `sw_vers` and check that it prints ProductVersion",
        ),
        (Some(v), true) if !v.at_least(26, 2) => check(
            "macos_version",
            "macOS 26.2 or later",
            Verdict::Fail,
            format!("macOS {} ({}) predates RDMA over Thunderbolt", v.version, v.build),
            "update every Mac to macOS 26.2 or later (26.3+ for large RDMA buffers), the same build on all",
        ),
        (Some(v), true) if !v.at_least(26, 3) => check(
            "macos_version",
            "macOS 26.2 or later",
            Verdict::Pass,
            format!("macOS {} ({}); 26.3 or later allows large RDMA buffers (more bandwidth)", v.version, v.build),
            "",
        ),
        (Some(v), true) => check(
            "macos_version",
            "macOS 26.2 or later",
            Verdict::Pass,
            format!("macOS {} ({})", v.version, v.build),
            "",
        ),
    });

    // rdma_ctl.
    checks.push(match captures.rdma_ctl_status.as_deref().map(parse::rdma_ctl_status) {
        _ if !on_mac => check("rdma_ctl", "RDMA enabled (rdma_ctl)", Verdict::Unknown, "not macOS", ""),
        None => check(
            "rdma_ctl",
            "RDMA enabled (rdma_ctl)",
            Verdict::Unknown,
            "rdma_ctl status was not run",
            "run `rdma_ctl status`",
        ),
        Some(None) => check(
            "rdma_ctl",
            "RDMA enabled (rdma_ctl)",
            Verdict::Unknown,
            "rdma_ctl status printed neither enabled nor disabled",
            "run `rdma_ctl status` and check its output",
        ),
        Some(Some(true)) => check("rdma_ctl", "RDMA enabled (rdma_ctl)", Verdict::Pass, "rdma_ctl status: enabled", ""),
        Some(Some(false)) => check(
            "rdma_ctl",
            "RDMA enabled (rdma_ctl)",
            Verdict::Fail,
            "rdma_ctl status: disabled",
            format!("enable it in macOS Recovery: {RECOVERY_STEPS}"),
        ),
    });

    // RDMA devices.
    checks.push(match &devices {
        None => check("rdma_devices", "RDMA devices", Verdict::Unknown, "ibv_devices was not run", "run `ibv_devices`"),
        Some(DeviceList::Unsupported(e)) => check("rdma_devices", "RDMA devices", Verdict::Fail, format!("no RDMA devices: {e}"), if on_mac { "enable RDMA (rdma_ctl) and restart" } else { "this machine has no RDMA hardware or kernel support; shoal uses TCP" }),
        Some(DeviceList::Devices(d)) if d.is_empty() => check("rdma_devices", "RDMA devices", Verdict::Fail, "no RDMA devices", if on_mac { "RDMA is disabled, or these Thunderbolt ports are not Thunderbolt 5: enable RDMA and use TB5 ports and cables" } else { "this machine has no RDMA devices; shoal uses TCP" }),
        Some(DeviceList::Devices(d)) => check("rdma_devices", "RDMA devices", Verdict::Pass, d.join(", "), ""),
    });

    if on_mac {
        checks.extend(link_checks(&links, buses.is_some(), ports.is_some(), interfaces.as_ref(), devinfo.is_some()));
    }
    let usable_interfaces = links
        .iter()
        .filter(|l| {
            l.speed_gbps.is_some_and(|s| s >= 80)
                && l.peer_rdma_service
                && !l.ipv4.is_empty()
                && l.port_state.as_deref() == Some("PORT_ACTIVE")
        })
        .filter_map(|l| l.interface.clone())
        .collect();
    NodeReport { platform: captures.platform.clone(), macos, checks, links, usable_interfaces }
}

fn links_of(
    buses: Option<&[Bus]>,
    ports: Option<&BTreeMap<u32, String>>,
    interfaces: Option<&BTreeMap<String, Interface>>,
    devices: Option<&DeviceList>,
    devinfo: Option<&[DeviceInfo]>,
) -> Vec<ThunderboltLink> {
    let Some(buses) = buses else { return Vec::new() };
    buses
        .iter()
        .filter(|b| b.connected)
        .filter_map(|b| {
            let peer = b.peer.as_ref()?;
            let interface = b.receptacle.and_then(|r| ports.and_then(|p| p.get(&r).cloned()));
            let rdma_name = interface.as_ref().map(|i| format!("rdma_{i}"));
            let rdma_device =
                rdma_name.clone().filter(|n| matches!(devices, Some(DeviceList::Devices(d)) if d.contains(n)));
            let interface_info = interface.as_ref().and_then(|i| interfaces?.get(i));
            let ipv4 = interface_info.map(|i| i.ipv4.clone()).unwrap_or_default();
            let suggested_ipv4 = (interfaces.is_some() && ipv4.is_empty())
                .then(|| link_local_for(interface_info.and_then(|i| i.ether.as_deref()), b.receptacle.unwrap_or(0)));
            Some(ThunderboltLink {
                receptacle: b.receptacle,
                domain_uuid: b.domain_uuid.clone(),
                speed_gbps: b.speed.filter(|s| !s.up_to).map(|s| s.gbps),
                peer_name: peer.name.clone(),
                peer_domain_uuid: peer.domain_uuid.clone(),
                peer_rdma_service: peer.rdma_service,
                ipv4,
                suggested_ipv4,
                port_state: rdma_name.and_then(|n| devinfo?.iter().find(|d| d.name == n)?.port_state.clone()),
                rdma_device,
                interface,
            })
        })
        .collect()
}

fn link_checks(
    links: &[ThunderboltLink],
    have_profiler: bool,
    have_ports: bool,
    interfaces: Option<&BTreeMap<String, Interface>>,
    have_devinfo: bool,
) -> Vec<Check> {
    let mut checks = Vec::new();
    let name = |l: &ThunderboltLink| {
        format!(
            "receptacle {} ({}) → {}",
            l.receptacle.map_or("?".into(), |r| r.to_string()),
            l.interface.as_deref().unwrap_or("?"),
            l.peer_name
        )
    };
    if !have_profiler {
        checks.push(check(
            "cabling",
            "Thunderbolt cables to other Macs",
            Verdict::Unknown,
            "system_profiler SPThunderboltDataType was not run",
            "run `system_profiler SPThunderboltDataType`",
        ));
    } else if links.is_empty() {
        checks.push(check(
            "cabling",
            "Thunderbolt cables to other Macs",
            Verdict::Fail,
            "no Thunderbolt cable reaches another Mac",
            "connect each Mac to every other with a Thunderbolt 5 cable (a full mesh), not through a dock",
        ));
    } else {
        let list: Vec<String> = links.iter().map(name).collect();
        checks.push(check("cabling", "Thunderbolt cables to other Macs", Verdict::Pass, list.join("; "), ""));
        let slow: Vec<String> = links
            .iter()
            .filter(|l| l.speed_gbps.is_some_and(|s| s < 80))
            .map(|l| format!("{} at {} Gb/s", name(l), l.speed_gbps.unwrap_or(0)))
            .collect();
        checks.push(if slow.is_empty() {
            check("thunderbolt5", "Thunderbolt 5 links (80 Gb/s)", Verdict::Pass, "every link runs at 80 Gb/s", "")
        } else {
            check(
                "thunderbolt5",
                "Thunderbolt 5 links (80 Gb/s)",
                Verdict::Fail,
                slow.join("; "),
                "RDMA needs Thunderbolt 5 end to end: use TB5 ports on both Macs and a TB5-rated cable",
            )
        });
        let silent: Vec<String> = links.iter().filter(|l| !l.peer_rdma_service).map(name).collect();
        checks.push(if silent.is_empty() {
            check(
                "peer_rdma",
                "Peers advertise RDMA",
                Verdict::Pass,
                "every Mac across a cable advertises its rdma service",
                "",
            )
        } else {
            check(
                "peer_rdma",
                "Peers advertise RDMA",
                Verdict::Fail,
                format!("no rdma service from {}", silent.join("; ")),
                format!("enable RDMA on those Macs too: {RECOVERY_STEPS}"),
            )
        });
    }
    // The Thunderbolt Bridge.
    checks.push(match interfaces {
        None => check(
            "thunderbolt_bridge",
            "Thunderbolt Bridge inactive",
            Verdict::Unknown,
            "ifconfig was not run",
            "run `ifconfig`",
        ),
        Some(ifs) => match ifs.get("bridge0") {
            Some(b) if b.active == Some(true) || (b.up && !b.members.is_empty()) => check(
                "thunderbolt_bridge",
                "Thunderbolt Bridge inactive",
                Verdict::Fail,
                format!("bridge0 is active with members {}: frames loop between the Macs", b.members.join(", ")),
                "System Settings › Network › Thunderbolt Bridge › Make Inactive (or `sudo ifconfig bridge0 down`)",
            ),
            _ => check(
                "thunderbolt_bridge",
                "Thunderbolt Bridge inactive",
                Verdict::Pass,
                "bridge0 is inactive or absent",
                "",
            ),
        },
    });
    // IPv4 on each linked Thunderbolt interface.
    if interfaces.is_some() && have_ports && !links.is_empty() {
        let missing: Vec<&ThunderboltLink> = links.iter().filter(|l| l.ipv4.is_empty()).collect();
        checks.push(if missing.is_empty() {
            let list: Vec<String> = links
                .iter()
                .map(|l| format!("{} {}", l.interface.as_deref().unwrap_or("?"), l.ipv4.join(",")))
                .collect();
            check("ipv4", "An IPv4 address on each Thunderbolt interface", Verdict::Pass, list.join("; "), "")
        } else {
            let fixes: Vec<String> = missing
                .iter()
                .map(|l| {
                    let iface = l.interface.as_deref().unwrap_or("enX");
                    let address =
                        l.suggested_ipv4.clone().unwrap_or_else(|| link_local_for(None, l.receptacle.unwrap_or(0)));
                    format!("sudo ifconfig {iface} inet {address} netmask 255.255.0.0 alias")
                })
                .collect();
            check(
                "ipv4",
                "An IPv4 address on each Thunderbolt interface",
                Verdict::Fail,
                format!(
                    "no IPv4 on {}: without it the GID at index 1 does not exist and queue pairs fail with errno 22",
                    missing.iter().map(|l| l.interface.clone().unwrap_or_default()).collect::<Vec<_>>().join(", ")
                ),
                format!("give each a link-local IPv4: {}", fixes.join("; ")),
            )
        });
    }
    // Port state of each link's RDMA device.
    if have_devinfo && !links.is_empty() {
        let down: Vec<String> = links
            .iter()
            .filter(|l| l.port_state.as_deref() != Some("PORT_ACTIVE"))
            .map(|l| {
                format!(
                    "{} {}",
                    l.rdma_device.clone().or(l.interface.as_ref().map(|i| format!("rdma_{i}"))).unwrap_or_default(),
                    l.port_state.as_deref().unwrap_or("missing")
                )
            })
            .collect();
        checks.push(if down.is_empty() {
            check("rdma_ports", "RDMA ports active", Verdict::Pass, "every linked port is PORT_ACTIVE", "")
        } else {
            check(
                "rdma_ports",
                "RDMA ports active",
                Verdict::Fail,
                down.join("; "),
                "a port is active only when the Macs on both ends have RDMA enabled and the link is Thunderbolt 5",
            )
        });
    }
    checks
}
