//! The data directory's lock: one node per data directory. Two nodes on one directory would share an
//! identity and a membership file and fight over both, so a node holds an exclusive OS file lock
//! (`flock`) on `node.lock` in it for as long as it runs; the OS releases it when the process ends,
//! however it ends. The file names the holder (its process id, then its API address) so that a second
//! node can say which process is in the way.

use super::DataDir;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::PathBuf;

const LOCK_FILE: &str = "node.lock";

/// Held while the node runs; dropping it releases the directory.
#[derive(Debug)]
pub struct DataDirLock {
    file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Locks `dir` for this process, or says which process holds it.
    pub fn acquire(dir: &DataDir) -> anyhow::Result<DataDirLock> {
        let path = dir.file(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let who = if holder.is_empty() { "another process".to_string() } else { format!("a node ({holder})") };
                anyhow::bail!(
                    "the data directory {} is in use by {who}: one node per data directory. Stop that node first, or give this one a directory of its own (--data-dir DIR, with --port PORT to run beside it)",
                    dir.root().display()
                );
            }
            Err(TryLockError::Error(e)) => anyhow::bail!("cannot lock {}: {e}", path.display()),
        }
        let mut lock = DataDirLock { file, path };
        lock.describe(&format!("process {}", std::process::id()));
        Ok(lock)
    }

    /// Writes who holds the lock (shown to a second node that tries to use the directory).
    pub fn describe(&mut self, holder: &str) {
        let written = self
            .file
            .set_len(0)
            .and_then(|()| self.file.rewind())
            .and_then(|()| self.file.write_all(format!("{holder}\n").as_bytes()));
        if let Err(e) = written {
            tracing::debug!("cannot write {}: {e}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_the_second_is_told_who() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(Some(tmp.path())).unwrap();
        let mut first = DataDirLock::acquire(&dir).unwrap();
        first.describe("process 42, API 127.0.0.1:1");
        let refused = DataDirLock::acquire(&dir).unwrap_err().to_string();
        assert!(refused.contains("process 42, API 127.0.0.1:1"), "{refused}");
        drop(first);
        DataDirLock::acquire(&dir).expect("free again once the holder is gone");
    }
}
