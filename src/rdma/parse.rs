//! Pure parsers of the macOS (and Linux) tools' output the RDMA doctor reads. Each tolerates tabs or
//! spaces, extra fields, other field orders and the elisions of published samples.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `sw_vers`: product version and build.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
pub struct MacOsVersion {
    pub version: String,
    pub build: String,
}

impl MacOsVersion {
    /// (major, minor, patch), missing parts as 0.
    pub fn numbers(&self) -> (u32, u32, u32) {
        let mut parts = self.version.split('.').map(|p| p.trim().parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }

    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        let (a, b, _) = self.numbers();
        (a, b) >= (major, minor)
    }
}

fn value_of<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let l = l.trim();
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

pub fn sw_vers(text: &str) -> Option<MacOsVersion> {
    let version = value_of(text, "ProductVersion")?.to_string();
    let build = value_of(text, "BuildVersion").unwrap_or_default().to_string();
    (!version.is_empty()).then_some(MacOsVersion { version, build })
}

/// `rdma_ctl status`: `Some(true)` for enabled, `Some(false)` for disabled.
pub fn rdma_ctl_status(text: &str) -> Option<bool> {
    let t = text.trim().to_ascii_lowercase();
    if t.contains("disabled") {
        Some(false)
    } else if t.contains("enabled") {
        Some(true)
    } else {
        None
    }
}

/// What `ibv_devices` said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceList {
    Devices(Vec<String>),
    /// The device-list call failed (Linux without RDMA support: "Function not implemented").
    Unsupported(String),
}

pub fn ibv_devices(text: &str) -> DeviceList {
    if let Some(line) = text.lines().find(|l| l.contains("Failed to get IB devices list")) {
        return DeviceList::Unsupported(line.trim().to_string());
    }
    let names = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|t| *t != "device" && !t.starts_with('-'))
        .map(str::to_string)
        .collect();
    DeviceList::Devices(names)
}

/// One device of `ibv_devinfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub transport: Option<String>,
    /// e.g. `PORT_ACTIVE`.
    pub port_state: Option<String>,
    pub active_mtu: Option<u32>,
    pub link_layer: Option<String>,
    pub gids: BTreeMap<u32, String>,
}

/// `ibv_devinfo` (also `-v`): its devices. "No IB devices found" or a failed list gives none.
pub fn ibv_devinfo(text: &str) -> Vec<DeviceInfo> {
    let mut devices: Vec<DeviceInfo> = Vec::new();
    // Published samples wrap lines; fields are recognised anywhere as `key: value`.
    let tokens: Vec<&str> = text.split_whitespace().collect();
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i];
        let next = tokens.get(i + 1).copied().unwrap_or("");
        match t {
            "hca_id:" => devices.push(DeviceInfo { name: next.to_string(), ..Default::default() }),
            "transport:" => {
                if let Some(d) = devices.last_mut() {
                    d.transport = Some(next.to_string());
                }
            }
            "state:" => {
                if let Some(d) = devices.last_mut() {
                    d.port_state = Some(next.to_string());
                }
            }
            "active_mtu:" => {
                if let Some(d) = devices.last_mut() {
                    d.active_mtu = next.parse().ok();
                }
            }
            "link_layer:" => {
                if let Some(d) = devices.last_mut() {
                    d.link_layer = Some(next.to_string());
                }
            }
            _ if t.starts_with("GID[") => {
                // `GID[  1]:  ::ffff:169.254.205.255` splits as `GID[`, `1]:`, value or `GID[1]:`, value.
                let (index, value) = if t.ends_with("]:") {
                    (t.trim_start_matches("GID[").trim_end_matches("]:").trim().parse().ok(), next)
                } else {
                    (next.trim_end_matches("]:").parse().ok(), tokens.get(i + 2).copied().unwrap_or(""))
                };
                if let (Some(index), Some(d)) = (index, devices.last_mut()) {
                    d.gids.insert(index, value.trim_end_matches(',').to_string());
                }
            }
            _ => {}
        }
        i += 1;
    }
    devices
}

/// A link speed as system_profiler prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Speed {
    pub gbps: u32,
    /// "Up to N Gb/s": the port's capability, nothing connected.
    pub up_to: bool,
}

fn speed(value: &str) -> Option<Speed> {
    let v = value.trim();
    let (up_to, rest) = match v.strip_prefix("Up to") {
        Some(r) => (true, r.trim()),
        None => (false, v),
    };
    let gbps = rest.split_whitespace().next()?.parse().ok()?;
    Some(Speed { gbps, up_to })
}

/// A Mac across a Thunderbolt cable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    pub name: String,
    pub domain_uuid: String,
    /// The peer advertises the `rdma` Thunderbolt service (it has RDMA enabled).
    pub rdma_service: bool,
}

/// One Thunderbolt bus (one receptacle) of this Mac.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bus {
    pub domain_uuid: Option<String>,
    pub receptacle: Option<u32>,
    pub connected: bool,
    pub speed: Option<Speed>,
    /// The other Mac on this bus, if a Mac is what is connected.
    pub peer: Option<Peer>,
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// `system_profiler SPThunderboltDataType` (text): each bus's own port and the Mac across it, if any.
pub fn thunderbolt(text: &str) -> Vec<Bus> {
    let mut buses: Vec<Bus> = Vec::new();
    let mut field_indent = usize::MAX; // indent of the bus's own fields
    let mut in_host_port = false;
    // The device section being read (its header indent), and what it holds so far.
    let mut device: Option<(usize, String, Option<String>, bool)> = None;
    let flush = |buses: &mut Vec<Bus>, device: &mut Option<(usize, String, Option<String>, bool)>| {
        if let (Some((_, name, Some(uuid), rdma)), Some(bus)) = (device.take(), buses.last_mut()) {
            if bus.peer.is_none() {
                bus.peer = Some(Peer { name, domain_uuid: uuid, rdma_service: rdma });
            }
        }
    };
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed == "Thunderbolt/USB4:" {
            continue;
        }
        let level = indent(line);
        if trimmed.starts_with("Thunderbolt/USB4 Bus") || trimmed.starts_with("Thunderbolt Bus") {
            flush(&mut buses, &mut device);
            buses.push(Bus::default());
            field_indent = usize::MAX;
            in_host_port = false;
            continue;
        }
        let Some(bus) = buses.last_mut() else { continue };
        if field_indent == usize::MAX {
            field_indent = level;
        }
        let (key, value) = match trimmed.split_once(':') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => (trimmed, ""),
        };
        if level <= field_indent {
            // A field of the bus itself (or its host "Port:" header).
            flush(&mut buses, &mut device);
            let Some(bus) = buses.last_mut() else { continue };
            in_host_port = key == "Port" && value.is_empty();
            if key == "Domain UUID" {
                bus.domain_uuid = Some(value.to_string());
            }
            continue;
        }
        let is_header = value.is_empty() && trimmed.ends_with(':');
        match &mut device {
            None if in_host_port && !is_header => match key {
                "Status" => bus.connected = value.eq_ignore_ascii_case("Device connected"),
                "Speed" => bus.speed = speed(value),
                "Receptacle" => bus.receptacle = value.parse().ok(),
                _ => {}
            },
            None if is_header && !matches!(key, "Port" | "Port (Upstream)") => {
                in_host_port = false;
                device = Some((level, key.to_string(), None, false));
            }
            Some((device_indent, _, uuid, rdma)) if level > *device_indent => match key {
                "Domain UUID" if uuid.is_none() => *uuid = Some(value.to_string()),
                "Service Key" if value.eq_ignore_ascii_case("rdma") => *rdma = true,
                _ => {}
            },
            Some(_) if is_header => {
                flush(&mut buses, &mut device);
                device = Some((level, key.to_string(), None, false));
            }
            _ => {}
        }
    }
    flush(&mut buses, &mut device);
    buses
}

/// One interface of `ifconfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub ipv4: Vec<String>,
    pub up: bool,
    /// `status: active` / `inactive`, when printed.
    pub active: Option<bool>,
    /// Bridge members.
    pub members: Vec<String>,
    /// Hardware address (`ether`).
    pub ether: Option<String>,
}

pub fn ifconfig(text: &str) -> BTreeMap<String, Interface> {
    let mut interfaces = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) && line.contains(": flags=") {
            let name = line.split(':').next().unwrap_or_default().to_string();
            let up = line.split_once('<').is_some_and(|(_, f)| f.split(['>', ',']).any(|x| x == "UP"));
            interfaces.insert(name.clone(), Interface { up, ..Default::default() });
            current = Some(name);
            continue;
        }
        let Some(iface) = current.as_ref().and_then(|c| interfaces.get_mut(c)) else { continue };
        let mut words = line.split_whitespace();
        match words.next() {
            Some("inet") => iface.ipv4.extend(words.next().map(str::to_string)),
            Some("status:") => iface.active = words.next().map(|s| s == "active"),
            Some("member:") => iface.members.extend(words.next().map(str::to_string)),
            Some("ether") => iface.ether = words.next().map(str::to_string),
            _ => {}
        }
    }
    interfaces
}

#[cfg(test)]
mod tests;
