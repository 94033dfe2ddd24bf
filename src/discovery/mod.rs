//! Finding nodes nearby with mDNS (service `_shoal._tcp`): a node advertises its id, name, cluster id (a
//! keyed hash of the secret, never the secret), protocol version and ports, and browses for the others.
//! What mDNS says is a hint: a peer is trusted only after the handshake.
//!
//! The record changes only when the node changes cluster: mDNS responders may not repeat a record
//! within a second of announcing it, so a record that changed with every join code would hold up
//! discovery by a second right when someone is joining.

use crate::net::preamble::PROTOCOL_VERSION;
use crate::node::NodeId;
use mdns_sd::{ServiceDaemon, ServiceEvent, ServiceInfo};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

pub const SERVICE_TYPE: &str = "_shoal._tcp.local.";

/// What a node tells the network about itself.
#[derive(Clone, Debug, PartialEq)]
pub struct Advertisement {
    pub id: NodeId,
    pub name: String,
    pub cluster_id: String,
    pub api_port: u16,
    pub control_port: u16,
}

/// A node seen on the network.
#[derive(Clone, Debug, PartialEq)]
pub struct DiscoveredNode {
    pub id: NodeId,
    pub name: String,
    pub cluster_id: String,
    pub version: u8,
    pub control: Vec<SocketAddr>,
    pub api_port: u16,
}

pub enum DiscoveryEvent {
    Found(DiscoveredNode),
    Lost(NodeId),
}

pub struct Discovery {
    daemon: ServiceDaemon,
    registered: Option<(String, Advertisement)>,
    /// mDNS instance name → node id, to report removals.
    instances: HashMap<String, NodeId>,
}

impl Discovery {
    pub fn start() -> anyhow::Result<Discovery> {
        let daemon = ServiceDaemon::new().map_err(|e| anyhow::anyhow!("mDNS could not start: {e}"))?;
        Ok(Discovery { daemon, registered: None, instances: HashMap::new() })
    }

    /// Publishes (or republishes, replacing the previous record) this node's advertisement.
    pub fn advertise(&mut self, ad: &Advertisement) -> anyhow::Result<()> {
        if self.registered.as_ref().is_some_and(|(_, old)| old == ad) {
            return Ok(());
        }
        if let Some((old, _)) = self.registered.take() {
            let _ = self.daemon.unregister(&old);
        }
        let instance = format!("shoal-{}", ad.id.0.simple());
        let host = format!("{instance}.local.");
        let props = [
            ("id", ad.id.to_string()),
            ("name", ad.name.clone()),
            ("cluster", ad.cluster_id.clone()),
            ("v", PROTOCOL_VERSION.to_string()),
            ("api", ad.api_port.to_string()),
        ];
        let info = ServiceInfo::new(SERVICE_TYPE, &instance, &host, "", ad.control_port, &props[..])
            .map_err(|e| anyhow::anyhow!("invalid mDNS record: {e}"))?
            .enable_addr_auto();
        let fullname = info.get_fullname().to_string();
        self.daemon.register(info).map_err(|e| anyhow::anyhow!("mDNS could not advertise this node: {e}"))?;
        self.registered = Some((fullname, ad.clone()));
        Ok(())
    }

    /// Starts browsing; events arrive on the returned channel.
    pub fn browse(&self) -> anyhow::Result<mdns_sd::Receiver<ServiceEvent>> {
        self.daemon.browse(SERVICE_TYPE).map_err(|e| anyhow::anyhow!("mDNS could not browse: {e}"))
    }

    /// Turns a raw mDNS event into a discovery event (ignoring records that are not valid shoal nodes).
    pub fn interpret(&mut self, event: ServiceEvent) -> Option<DiscoveryEvent> {
        match event {
            ServiceEvent::ServiceResolved(svc) => {
                let prop = |k: &str| svc.get_property_val_str(k).map(str::to_string);
                let id: NodeId = prop("id")?.parse().ok()?;
                let port = svc.get_port();
                let mut control: Vec<SocketAddr> =
                    svc.get_addresses_v4().into_iter().map(|ip| SocketAddr::new(IpAddr::V4(ip), port)).collect();
                control.sort();
                self.instances.insert(svc.get_fullname().to_string(), id);
                Some(DiscoveryEvent::Found(DiscoveredNode {
                    id,
                    name: prop("name").unwrap_or_default(),
                    cluster_id: prop("cluster").unwrap_or_default(),
                    version: prop("v").and_then(|v| v.parse().ok()).unwrap_or(0),
                    control,
                    api_port: prop("api").and_then(|p| p.parse().ok()).unwrap_or(0),
                }))
            }
            ServiceEvent::ServiceRemoved(_, fullname) => self.instances.remove(&fullname).map(DiscoveryEvent::Lost),
            _ => None,
        }
    }

    pub fn shutdown(&self) {
        if let Some((name, _)) = &self.registered {
            let _ = self.daemon.unregister(name);
        }
        let _ = self.daemon.shutdown();
    }
}
