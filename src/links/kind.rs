//! What kind of link a connection runs over (loopback, Ethernet, Wi-Fi, Thunderbolt), from the local
//! interface that carries it: sysfs on Linux, `networksetup -listallhardwareports` on macOS (parsed by a
//! pure function tested on real outputs; run once per interface not seen before, never under a lock, its
//! answer kept in a [`PortKinds`] table).

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    Loopback,
    Ethernet,
    Wifi,
    Thunderbolt,
    #[default]
    Unknown,
}

impl LinkKind {
    /// How people call it: "Thunderbolt", "Wi-Fi", …
    pub fn label(self) -> &'static str {
        match self {
            LinkKind::Loopback => "loopback",
            LinkKind::Ethernet => "Ethernet",
            LinkKind::Wifi => "Wi-Fi",
            LinkKind::Thunderbolt => "Thunderbolt",
            LinkKind::Unknown => "network",
        }
    }
}

/// The interface that holds `ip`, and its kind.
pub fn classify(ip: IpAddr) -> (Option<String>, LinkKind) {
    if ip.is_loopback() {
        return (Some(loopback_name()), LinkKind::Loopback);
    }
    let Some(name) = interface_of(ip) else { return (None, LinkKind::Unknown) };
    let kind = kind_of_interface(&name);
    (Some(name), kind)
}

fn loopback_name() -> String {
    if cfg!(target_os = "macos") { "lo0" } else { "lo" }.to_string()
}

fn interface_of(ip: IpAddr) -> Option<String> {
    if_addrs::get_if_addrs().ok()?.into_iter().find(|i| i.ip() == ip).map(|i| i.name)
}

/// This machine's network interfaces and their addresses, as a set to compare: what changes when a cable
/// is plugged in or out or an interface gets an address. Read without spawning a process (getifaddrs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Interfaces(std::collections::BTreeSet<(String, IpAddr)>);

impl Interfaces {
    pub fn read() -> Interfaces {
        let all = if_addrs::get_if_addrs().unwrap_or_default();
        Interfaces(all.into_iter().map(|i| (i.name.clone(), i.ip())).collect())
    }
}

#[cfg(target_os = "linux")]
fn kind_of_interface(name: &str) -> LinkKind {
    let sys = std::path::Path::new("/sys/class/net").join(name);
    if std::fs::read_to_string(sys.join("type")).is_ok_and(|t| t.trim() == "772") {
        return LinkKind::Loopback;
    }
    if sys.join("wireless").exists() || sys.join("phy80211").exists() {
        return LinkKind::Wifi;
    }
    let driver = std::fs::read_link(sys.join("device/driver")).ok();
    if driver.is_some_and(|d| d.file_name().is_some_and(|f| f.to_string_lossy().contains("thunderbolt"))) {
        return LinkKind::Thunderbolt;
    }
    LinkKind::Ethernet
}

#[cfg(target_os = "macos")]
fn kind_of_interface(name: &str) -> LinkKind {
    static KNOWN: PortKinds = PortKinds::new();
    KNOWN.kind(name, || {
        let out = std::process::Command::new("networksetup").arg("-listallhardwareports").output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    })
}

/// The kinds of a machine's interfaces as the hardware-port listing gives them, asked for again only when
/// an interface is not in the last listing (a cable plugged in since).
pub struct PortKinds {
    known: Mutex<Option<HashMap<String, LinkKind>>>,
}

impl Default for PortKinds {
    fn default() -> PortKinds {
        PortKinds::new()
    }
}

impl PortKinds {
    pub const fn new() -> PortKinds {
        PortKinds { known: Mutex::new(None) }
    }

    /// The kind of interface `name`; `list_ports` gives the hardware-port listing when the table does not
    /// have it, called without the table's lock held.
    pub fn kind(&self, name: &str, list_ports: impl FnOnce() -> String) -> LinkKind {
        if let Some(kind) = self.lookup(name) {
            return kind;
        }
        let listing = list_ports();
        let mut fresh: HashMap<String, LinkKind> =
            hardware_ports(&listing).into_iter().map(|(port, device)| (device, kind_of_port(&port))).collect();
        // Not listed (a VPN's utun, say): remembered as unknown rather than listed again on every connection.
        let kind = *fresh.entry(name.to_string()).or_insert(LinkKind::Unknown);
        *self.known.lock().unwrap_or_else(|e| e.into_inner()) = Some(fresh);
        kind
    }

    fn lookup(&self, name: &str) -> Option<LinkKind> {
        self.known.lock().unwrap_or_else(|e| e.into_inner()).as_ref()?.get(name).copied()
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn kind_of_interface(_name: &str) -> LinkKind {
    LinkKind::Unknown
}

/// (hardware port, device) pairs from `networksetup -listallhardwareports`.
pub fn hardware_ports(text: &str) -> Vec<(String, String)> {
    let mut ports = Vec::new();
    let mut port: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if let Some(p) = line.strip_prefix("Hardware Port:") {
            port = Some(p.trim().to_string());
        } else if let Some(d) = line.strip_prefix("Device:") {
            if let Some(p) = port.take() {
                ports.push((p, d.trim().to_string()));
            }
        }
    }
    ports
}

/// The kind of a macOS hardware port name. "Thunderbolt 1" and "Thunderbolt Bridge" carry IP over the
/// Thunderbolt cable; "Thunderbolt Ethernet Slot 1" is an Ethernet adapter behind Thunderbolt.
pub fn kind_of_port(port: &str) -> LinkKind {
    let p = port.to_ascii_lowercase();
    if p.starts_with("wi-fi") || p.starts_with("airport") {
        LinkKind::Wifi
    } else if p.starts_with("thunderbolt") && !p.contains("ethernet") {
        LinkKind::Thunderbolt
    } else if p.contains("ethernet") || p.contains("lan") {
        LinkKind::Ethernet
    } else {
        LinkKind::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_macos_hardware_ports_are_classified() {
        let text = include_str!(
            "../../tests/fixtures/macos/verbatim/networksetup_listallhardwareports_mac16_9_macos26_6_2.txt"
        );
        let ports = hardware_ports(text);
        assert_eq!(ports.len(), 12);
        let kind = |dev: &str| kind_of_port(&ports.iter().find(|(_, d)| d == dev).unwrap().0);
        assert_eq!(kind("en0"), LinkKind::Ethernet);
        assert_eq!(kind("en10"), LinkKind::Ethernet); // Thunderbolt Ethernet Slot 1
        assert_eq!(kind("bridge0"), LinkKind::Thunderbolt);
        assert_eq!(kind("en1"), LinkKind::Wifi);
        for dev in ["en2", "en3", "en4", "en5"] {
            assert_eq!(kind(dev), LinkKind::Thunderbolt, "{dev}");
        }
    }

    #[test]
    fn hardware_ports_are_listed_once_per_interface_not_seen_before() {
        let listing = include_str!(
            "../../tests/fixtures/macos/verbatim/networksetup_listallhardwareports_mac16_9_macos26_6_2.txt"
        );
        let kinds = PortKinds::new();
        let listed = std::cell::Cell::new(0);
        let list = || {
            listed.set(listed.get() + 1);
            listing.to_string()
        };
        assert_eq!(kinds.kind("en2", list), LinkKind::Thunderbolt);
        assert_eq!(kinds.kind("en1", list), LinkKind::Wifi);
        assert_eq!(kinds.kind("en0", list), LinkKind::Ethernet);
        assert_eq!(listed.get(), 1, "one listing serves every interface it names");
        assert_eq!(kinds.kind("utun3", list), LinkKind::Unknown);
        assert_eq!(kinds.kind("utun3", list), LinkKind::Unknown);
        assert_eq!(listed.get(), 2, "an unlisted interface is listed again once, then remembered");
    }

    #[test]
    fn the_interface_set_is_read_the_same_until_it_changes() {
        let first = Interfaces::read();
        assert!(first.0.iter().any(|(name, _)| *name == loopback_name()), "{first:?}");
        assert_eq!(Interfaces::read(), first, "nothing changed between two reads");
        let mut more = first.clone();
        more.0.insert(("en2".into(), "169.254.10.1".parse().unwrap()));
        assert_ne!(more, first, "an interface that appears is a change");
    }

    #[test]
    fn loopback_is_recognised() {
        assert_eq!(classify("127.0.0.1".parse().unwrap()).1, LinkKind::Loopback);
    }
}
