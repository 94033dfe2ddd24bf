//! Who this node is: a persistent random id (kept in the data directory, so a restarted node comes back
//! as itself) and a human name (the host name unless given).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

/// A node's permanent identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub uuid::Uuid);

/// In the dashboard's types (src/api/bindings.rs), a string: written by hand because ts-rs's derive
/// does not read `serde(transparent)`.
impl ts_rs::TS for NodeId {
    type WithoutGenerics = NodeId;
    type OptionInnerType = NodeId;

    fn name(_: &ts_rs::Config) -> String {
        "NodeId".to_string()
    }

    fn inline(_: &ts_rs::Config) -> String {
        "string".to_string()
    }

    fn decl(_: &ts_rs::Config) -> String {
        "type NodeId = string;".to_string()
    }

    fn docs() -> Option<String> {
        Some("/**\n * A node's permanent identity (a UUID).\n */".to_string())
    }
}

impl NodeId {
    pub fn random() -> NodeId {
        NodeId(uuid::Uuid::new_v4())
    }

    /// The first 8 hex digits, enough to tell nodes apart in a table.
    pub fn short(&self) -> String {
        self.0.simple().to_string()[..8].to_string()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for NodeId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<NodeId, uuid::Error> {
        Ok(NodeId(s.parse()?))
    }
}

/// Where a node keeps its identity and cluster membership.
#[derive(Clone, Debug)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    /// `dir`, or the platform's data directory for shoal (`~/.local/share/shoal` on Linux,
    /// `~/Library/Application Support/shoal` on macOS).
    pub fn new(dir: Option<&Path>) -> anyhow::Result<DataDir> {
        let root = match dir {
            Some(d) => d.to_path_buf(),
            None => directories::ProjectDirs::from("", "", "shoal")
                .map(|p| p.data_dir().to_path_buf())
                .ok_or_else(|| anyhow::anyhow!("no home directory to keep shoal's data in; pass --data-dir"))?,
        };
        std::fs::create_dir_all(&root)
            .map_err(|e| anyhow::anyhow!("cannot create the data directory {}: {e}", root.display()))?;
        Ok(DataDir { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Writes `contents` to `name` atomically (a crash leaves the old or the new file, never half),
    /// readable only by this user when `private`.
    pub fn write(&self, name: &str, contents: &[u8], private: bool) -> std::io::Result<()> {
        let path = self.file(name);
        let tmp = self.file(&format!(".{name}.tmp"));
        std::fs::write(&tmp, contents)?;
        #[cfg(unix)]
        if private {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        }
        #[cfg(not(unix))]
        let _ = private;
        std::fs::rename(tmp, path)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeIdentity {
    pub id: NodeId,
    pub name: String,
}

const IDENTITY_FILE: &str = "node.json";

impl NodeIdentity {
    /// The identity kept in `dir`, created on first use. `name` overrides the stored name.
    pub fn load_or_create(dir: &DataDir, name: Option<&str>) -> anyhow::Result<NodeIdentity> {
        let path = dir.file(IDENTITY_FILE);
        let mut identity = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<NodeIdentity>(&bytes).map_err(|e| {
                anyhow::anyhow!("{} is damaged ({e}); delete it to give this node a new identity", path.display())
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                NodeIdentity { id: NodeId::random(), name: default_name() }
            }
            Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        };
        if let Some(name) = name {
            identity.name = name.to_string();
        }
        dir.write(IDENTITY_FILE, &serde_json::to_vec_pretty(&identity)?, false)?;
        Ok(identity)
    }
}

fn default_name() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let host = host.trim_end_matches(".local").to_string();
    if host.is_empty() {
        "shoal-node".into()
    } else {
        host
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_persists_and_the_name_can_change() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(Some(tmp.path())).unwrap();
        let first = NodeIdentity::load_or_create(&dir, None).unwrap();
        let again = NodeIdentity::load_or_create(&dir, Some("studio-2")).unwrap();
        assert_eq!(first.id, again.id);
        assert_eq!(again.name, "studio-2");
        assert_eq!(NodeIdentity::load_or_create(&dir, None).unwrap().name, "studio-2");
        std::fs::write(dir.file(IDENTITY_FILE), "{").unwrap();
        assert!(NodeIdentity::load_or_create(&dir, None).unwrap_err().to_string().contains("damaged"));
    }
}
