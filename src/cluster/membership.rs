//! The cluster a node belongs to, kept on disk so a restarted node rejoins by itself: the cluster secret
//! (32 random bytes; only its keyed hash, the cluster id, is ever shown or advertised) and the members
//! this node knows, with the addresses they can be reached at.

use crate::node::{DataDir, NodeId};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret([u8; 32]);

impl ClusterSecret {
    pub fn random() -> ClusterSecret {
        ClusterSecret(rand::random())
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The public name of the cluster: 16 hex digits of HMAC-SHA256(secret, "shoal cluster id").
    /// Nodes of one cluster recognise each other by it; it reveals nothing about the secret.
    pub fn cluster_id(&self) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(b"shoal cluster id v1");
        hex::encode(&mac.finalize().into_bytes()[..8])
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(s: &str) -> Option<ClusterSecret> {
        let bytes = hex::decode(s).ok()?;
        Some(ClusterSecret(bytes.try_into().ok()?))
    }
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterSecret(<cluster {}>)", self.cluster_id())
    }
}

impl Serialize for ClusterSecret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for ClusterSecret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ClusterSecret, D::Error> {
        let s = String::deserialize(d)?;
        ClusterSecret::from_hex(&s).ok_or_else(|| serde::de::Error::custom("a cluster secret is 64 hex digits"))
    }
}

/// A member as the others know it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub id: NodeId,
    pub name: String,
    /// Control addresses (IP and port) the member can be reached at.
    pub control: Vec<SocketAddr>,
    pub api_port: u16,
}

/// Most members a node keeps (gossip beyond it is ignored), and most addresses and name length of one.
pub const MAX_MEMBERS: usize = 256;
const MAX_ADDRESSES: usize = 16;
const MAX_NAME: usize = 128;

impl MemberRecord {
    /// Whether a record from another node is one to keep: a name, a few addresses, no port 0.
    pub fn check(&self) -> Result<(), String> {
        if self.name.is_empty() || self.name.len() > MAX_NAME || self.name.chars().any(char::is_control) {
            return Err(format!("a member name must be 1 to {MAX_NAME} printable characters"));
        }
        if self.control.len() > MAX_ADDRESSES || self.control.iter().any(|a| a.port() == 0) {
            return Err(format!("a member has 0 to {MAX_ADDRESSES} control addresses, none with port 0"));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Membership {
    pub secret: ClusterSecret,
    /// Every member this node knows, itself included.
    pub members: BTreeMap<NodeId, MemberRecord>,
}

const FILE: &str = "cluster.json";

impl Membership {
    /// A new one-node cluster with a fresh secret.
    pub fn new_cluster(me: MemberRecord) -> Membership {
        Membership { secret: ClusterSecret::random(), members: BTreeMap::from([(me.id, me)]) }
    }

    pub fn cluster_id(&self) -> String {
        self.secret.cluster_id()
    }

    /// The membership kept in `dir`, if any.
    pub fn load(dir: &DataDir) -> anyhow::Result<Option<Membership>> {
        let path = dir.file(FILE);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).map_err(|e| {
                anyhow::anyhow!("{} is damaged ({e}); delete it and join the cluster again", path.display())
            })?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        }
    }

    /// Saves to `dir`, readable by this user only (it holds the secret).
    pub fn save(&self, dir: &DataDir) -> anyhow::Result<()> {
        dir.write(FILE, &serde_json::to_vec_pretty(self)?, true)
            .map_err(|e| anyhow::anyhow!("cannot save the cluster membership in {}: {e}", dir.root().display()))
    }

    /// Adds or updates `record`; returns whether anything changed.
    pub fn upsert(&mut self, record: MemberRecord) -> bool {
        match self.members.get(&record.id) {
            Some(existing) if *existing == record => false,
            _ => {
                self.members.insert(record.id, record);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_id_is_stable_and_hides_the_secret() {
        let s = ClusterSecret::random();
        assert_eq!(s.cluster_id(), s.cluster_id());
        assert_eq!(s.cluster_id().len(), 16);
        assert!(!s.to_hex().contains(&s.cluster_id()));
        assert_ne!(s.cluster_id(), ClusterSecret::random().cluster_id());
        assert!(!format!("{s:?}").contains(&s.to_hex()));
        assert_eq!(ClusterSecret::from_hex(&s.to_hex()), Some(s));
    }

    #[test]
    fn records_from_other_nodes_are_checked() {
        let ok = MemberRecord { id: NodeId::random(), name: "a".into(), control: vec![], api_port: 1 };
        assert!(ok.check().is_ok());
        assert!(MemberRecord { name: String::new(), ..ok.clone() }.check().is_err());
        assert!(MemberRecord { name: "x\n".into(), ..ok.clone() }.check().is_err());
        let many = vec!["10.0.0.1:1".parse().unwrap(); 17];
        assert!(MemberRecord { control: many, ..ok.clone() }.check().is_err());
        assert!(MemberRecord { control: vec!["10.0.0.1:0".parse().unwrap()], ..ok }.check().is_err());
    }

    #[test]
    fn membership_survives_a_restart() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(Some(tmp.path())).unwrap();
        let me = MemberRecord { id: NodeId::random(), name: "a".into(), control: vec![], api_port: 1 };
        let m = Membership::new_cluster(me.clone());
        m.save(&dir).unwrap();
        let loaded = Membership::load(&dir).unwrap().unwrap();
        assert_eq!(loaded.secret, m.secret);
        assert_eq!(loaded.members[&me.id], me);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.file(FILE)).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "the secret must not be readable by others");
        }
    }
}
