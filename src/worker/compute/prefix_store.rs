//! Every stage's saved prefixes: the prompt cache beyond its slots. When a request ends, stage 0 has each
//! stage copy what the slot holds (its rows of those positions, see `engine::snapshot`) into memory
//! under a hash of the tokens, and a thread writes the copy to the node's disk; when a later request
//! begins with a saved prefix that no free slot holds, every stage writes it back into the slot. Stage 0
//! decides what is kept ([`super::prefix_index`]); this store only does what the ring frames say.
//!
//! A file on disk holds one stage's part of one prefix, in a directory named for what makes the bytes
//! fit (the model file, the stage's layers, the KV type: [`identity`]); its header repeats that
//! identity, the prefix's key, positions and tokens, and a CRC of the bytes. A file that is damaged,
//! cut short or another's is refused with its reason, deleted, and the prompt prefilled instead.

use crate::engine::Stage;
use crate::transport::PrefixOp;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};

const MAGIC: &[u8; 8] = b"SHOALPFX";
const VERSION: u32 = 1;
/// magic, version, identity, key, positions, tokens, payload bytes, CRC.
const HEADER: usize = 8 + 4 + 32 + 8 + 4 + 4 + 8 + 4;

/// What a saved prefix's bytes fit: a hash of the model file (its size, first and last MiB: the GGUF's
/// metadata and tensor table, and weights), the stage's layers, its KV type and this format.
pub fn identity(model: &Path, stage: &Stage) -> std::io::Result<[u8; 32]> {
    const SAMPLE: u64 = 1 << 20;
    let mut file = std::fs::File::open(model)?;
    let len = file.metadata()?.len();
    let mut hash = Sha256::new();
    hash.update(MAGIC);
    hash.update(VERSION.to_le_bytes());
    hash.update(len.to_le_bytes());
    let mut buf = vec![0u8; SAMPLE.min(len) as usize];
    file.read_exact(&mut buf)?;
    hash.update(&buf);
    use std::io::Seek;
    file.seek(std::io::SeekFrom::Start(len - buf.len() as u64))?;
    file.read_exact(&mut buf)?;
    hash.update(&buf);
    let layers = stage.layers();
    hash.update(format!("layers {}..{} kv {}", layers.start, layers.end, stage.options().kv_type.name()));
    Ok(hash.finalize().into())
}

/// The key of a prefix of `tokens`: the first 8 bytes of their SHA-256.
pub fn key_of(tokens: &[u32]) -> u64 {
    let mut hash = Sha256::new();
    tokens.iter().for_each(|t| hash.update(t.to_le_bytes()));
    u64::from_le_bytes(hash.finalize()[..8].try_into().expect("8 bytes"))
}

/// A prefix saved on disk, as its file's header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedOnDisk {
    pub key: u64,
    pub tokens: Vec<u32>,
    pub bytes: u64,
}

/// The directory of one stage's saved prefixes on disk.
#[derive(Clone)]
pub struct PrefixDisk {
    dir: PathBuf,
    identity: [u8; 32],
}

impl PrefixDisk {
    /// The directory for `identity` under `root` (created).
    pub fn open(root: &Path, identity: [u8; 32]) -> std::io::Result<PrefixDisk> {
        let dir = root.join(hex::encode(&identity[..12]));
        std::fs::create_dir_all(&dir)?;
        Ok(PrefixDisk { dir, identity })
    }

    fn path(&self, key: u64) -> PathBuf {
        self.dir.join(format!("{key:016x}.prefix"))
    }

    /// Writes a prefix's file (through a temporary name, so a crash leaves no half file under its name).
    pub fn write(&self, key: u64, tokens: &[u32], data: &[u8]) -> std::io::Result<()> {
        let tmp = self.dir.join(format!("{key:016x}.partial"));
        let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        out.write_all(&self.identity)?;
        out.write_all(&key.to_le_bytes())?;
        out.write_all(&(tokens.len() as u32).to_le_bytes())?;
        out.write_all(&(tokens.len() as u32).to_le_bytes())?;
        out.write_all(&(data.len() as u64).to_le_bytes())?;
        out.write_all(&crc32fast::hash(data).to_le_bytes())?;
        tokens.iter().try_for_each(|t| out.write_all(&t.to_le_bytes()))?;
        out.write_all(data)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(tmp, self.path(key))
    }

    /// Reads the file of `key`: its tokens and bytes, or why it cannot be used.
    pub fn read(&self, key: u64) -> Result<(Vec<u32>, Vec<u8>), String> {
        let path = self.path(key);
        let mut file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (tokens, bytes) = self.read_header(&mut file, key).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(|e| format!("{}: {e}", path.display()))?;
        let crc = bytes.1;
        if data.len() as u64 != bytes.0 || crc32fast::hash(&data) != crc {
            return Err(format!("{}: its bytes are damaged (size or checksum differ)", path.display()));
        }
        Ok((tokens, data))
    }

    /// Every prefix this directory holds, oldest first, by the headers of its files; files that are
    /// not readable prefixes of this identity are deleted, with a warning naming why.
    pub fn list(&self) -> Vec<SavedOnDisk> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "partial") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let named = path.file_stem().and_then(|s| s.to_str()).and_then(|s| u64::from_str_radix(s, 16).ok());
            let header = std::fs::File::open(&path)
                .map_err(|e| e.to_string())
                .and_then(|mut f| self.read_header(&mut f, named.ok_or("not named for a key")?));
            match header {
                Ok((tokens, (bytes, _))) => {
                    let modified = entry.metadata().and_then(|m| m.modified()).ok();
                    found.push((modified, SavedOnDisk { key: key_of(&tokens), tokens, bytes }));
                }
                Err(reason) => {
                    tracing::warn!("the saved prefix {} is refused and deleted: {reason}", path.display());
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        found.sort_by_key(|(modified, _)| *modified);
        found.into_iter().map(|(_, saved)| saved).collect()
    }

    pub fn remove(&self, key: u64) {
        let _ = std::fs::remove_file(self.path(key));
    }

    /// Reads and checks a header; the tokens, and the payload's length and CRC.
    fn read_header(&self, file: &mut std::fs::File, key: u64) -> Result<(Vec<u32>, (u64, u32)), String> {
        let mut h = [0u8; HEADER];
        file.read_exact(&mut h).map_err(|_| "shorter than a saved prefix's header".to_string())?;
        let u32_at = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().expect("8 bytes"));
        if &h[..8] != MAGIC || u32_at(8) != VERSION {
            return Err("not a saved prefix of this version of shoal".into());
        }
        if h[12..44] != self.identity {
            return Err("saved for another model, stage or KV type".into());
        }
        let (file_key, positions, count, bytes, crc) = (u64_at(44), u32_at(52), u32_at(56), u64_at(60), u32_at(68));
        if key != file_key || count != positions || count > 1 << 24 {
            return Err("its header does not match its name".into());
        }
        let mut raw = vec![0u8; count as usize * 4];
        file.read_exact(&mut raw).map_err(|_| "cut short in its tokens".to_string())?;
        let tokens: Vec<u32> = raw.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect();
        if key_of(&tokens) != file_key {
            return Err("its tokens do not match its key".into());
        }
        Ok((tokens, (bytes, crc)))
    }
}

struct Saved {
    positions: usize,
    data: std::sync::Arc<Vec<u8>>,
}

/// A stage's saved prefixes in memory, written through to disk by a thread of its own.
pub struct PrefixStore {
    memory: HashMap<u64, Saved>,
    disk: Option<PrefixDisk>,
    /// Positions held in memory and on disk, oldest first, and the most of each this stage keeps
    /// whatever the frames say: stage 0 decides within the same budgets, so these bind only a
    /// misbehaving ring (a hostile member's Save frames cannot fill this node's memory or disk).
    memory_order: VecDeque<(u64, usize)>,
    disk_order: VecDeque<(u64, usize)>,
    budget: Budget,
    /// What the disk held when the store opened, oldest first (stage 0's index starts from it).
    found_on_disk: Vec<SavedOnDisk>,
    /// The disk's writes and removals, in order, done by a thread of their own.
    writer: Option<Sender<DiskJob>>,
}

enum DiskJob {
    Write(u64, Vec<u32>, std::sync::Arc<Vec<u8>>),
    Remove(u64),
    /// Answers once every job before it is done.
    Done(Sender<()>),
}

/// The most positions of saved prefixes a stage keeps in memory and on disk.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub memory: usize,
    pub disk: usize,
    /// What one saved recurrent state costs, in positions of rows (0 without linear layers).
    pub state_cost: usize,
}

impl PrefixStore {
    pub fn new(disk: Option<PrefixDisk>, budget: Budget) -> PrefixStore {
        let found_on_disk: Vec<SavedOnDisk> = disk.iter().flat_map(PrefixDisk::list).collect();
        let disk_order = found_on_disk.iter().map(|s| (s.key, s.tokens.len())).collect();
        let writer = disk.clone().map(|disk| {
            let (tx, rx) = channel::<DiskJob>();
            std::thread::spawn(move || {
                for job in rx {
                    match job {
                        DiskJob::Write(key, tokens, data) => {
                            if let Err(e) = disk.write(key, &tokens, &data) {
                                tracing::warn!("cannot write a saved prefix to {}: {e}", disk.dir.display());
                            }
                        }
                        DiskJob::Remove(key) => disk.remove(key),
                        DiskJob::Done(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            });
            tx
        });
        PrefixStore {
            memory: HashMap::new(),
            disk,
            writer,
            memory_order: VecDeque::new(),
            disk_order,
            budget,
            found_on_disk,
        }
    }

    /// Drops the oldest copies beyond the budgets.
    fn bound(&mut self) {
        let state = self.budget.state_cost;
        let held = |order: &VecDeque<(u64, usize)>| order.iter().map(|(_, n)| n + state).sum::<usize>();
        while held(&self.memory_order) > self.budget.memory {
            let Some((key, _)) = self.memory_order.pop_front() else { break };
            self.memory.remove(&key);
        }
        while held(&self.disk_order) > self.budget.disk {
            let Some((key, _)) = self.disk_order.pop_front() else { break };
            if let Some(writer) = &self.writer {
                let _ = writer.send(DiskJob::Remove(key));
            }
        }
    }

    /// Whether copies also go to disk.
    pub fn has_disk(&self) -> bool {
        self.disk.is_some()
    }

    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// What the disk held when the store opened, oldest first; taken once.
    pub fn take_found_on_disk(&mut self) -> Vec<SavedOnDisk> {
        std::mem::take(&mut self.found_on_disk)
    }

    /// Waits, at most `within`, for the disk to have every copy sent to it so far.
    pub fn wait_for_disk(&self, within: std::time::Duration) {
        let Some(writer) = &self.writer else { return };
        let (done, finished) = channel();
        if writer.send(DiskJob::Done(done)).is_ok() {
            let _ = finished.recv_timeout(within);
        }
    }

    /// Does what `op` says to `slot` of `stage`; why it could not, if it could not.
    pub fn apply(&mut self, stage: &mut Stage, slot: u32, op: &PrefixOp) -> Result<(), String> {
        let seq = slot as usize;
        if seq >= stage.options().sequences {
            return Err(format!("no slot {slot}"));
        }
        match op {
            PrefixOp::Save { key, positions, tokens } => {
                let positions = *positions as usize;
                if tokens.len() != positions || key_of(tokens) != *key {
                    return Err("a save whose tokens do not match its key and positions".into());
                }
                let data = std::sync::Arc::new(stage.save_prefix(seq, positions).map_err(|e| e.to_string())?);
                if let Some(writer) = &self.writer {
                    let _ = writer.send(DiskJob::Write(*key, tokens.clone(), data.clone()));
                    self.disk_order.retain(|(k, _)| k != key);
                    self.disk_order.push_back((*key, positions));
                }
                self.memory.insert(*key, Saved { positions, data });
                self.memory_order.retain(|(k, _)| k != key);
                self.memory_order.push_back((*key, positions));
                self.bound();
                Ok(())
            }
            PrefixOp::Restore { key, saved, positions, .. } => {
                let (saved, positions) = (*saved as usize, *positions as usize);
                let restored = match self.memory.get(key) {
                    Some(s) if s.positions == saved => stage.restore_prefix(seq, saved, positions, &s.data),
                    _ => {
                        let disk = self.disk.as_ref().ok_or("the prefix is not in this stage's memory")?;
                        let (tokens, data) = disk.read(*key).inspect_err(|_| disk.remove(*key))?;
                        if tokens.len() != saved {
                            disk.remove(*key);
                            return Err(format!(
                                "the saved prefix {key:016x} holds {} positions, not {saved}",
                                tokens.len()
                            ));
                        }
                        // Read from disk into the slot only: stage 0's index counts what memory holds.
                        stage.restore_prefix(seq, saved, positions, &data)
                    }
                };
                restored.map_err(|e| e.to_string())
            }
            PrefixOp::Forget { key, memory, disk } => {
                if *memory {
                    self.memory.remove(key);
                    self.memory_order.retain(|(k, _)| k != key);
                }
                if *disk {
                    self.disk_order.retain(|(k, _)| k != key);
                }
                if let (true, Some(writer)) = (*disk, &self.writer) {
                    let _ = writer.send(DiskJob::Remove(*key));
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(root: &Path, identity: u8) -> PrefixDisk {
        PrefixDisk::open(root, [identity; 32]).unwrap()
    }

    #[test]
    fn a_saved_file_reads_back_and_a_damaged_or_foreign_one_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let ours = disk(root.path(), 1);
        let tokens: Vec<u32> = (0..100).collect();
        let key = key_of(&tokens);
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        ours.write(key, &tokens, &data).unwrap();
        assert_eq!(ours.read(key).unwrap(), (tokens.clone(), data.clone()));
        assert_eq!(ours.list(), vec![SavedOnDisk { key, tokens: tokens.clone(), bytes: 5000 }]);

        // Another model's (or stage's) file in our directory: refused and deleted when listed.
        let path = ours.path(key);
        let foreign = disk(root.path(), 2);
        foreign.write(key, &tokens, &data).unwrap();
        std::fs::copy(foreign.path(key), &path).unwrap();
        assert!(ours.read(key).unwrap_err().contains("another model"));
        assert!(ours.list().is_empty() && !path.exists());

        // A flipped byte in the rows, a file cut short, a header naming other tokens.
        ours.write(key, &tokens, &data).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER + 400 + 17] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(ours.read(key).unwrap_err().contains("damaged"));
        bytes[HEADER + 400 + 17] ^= 1;
        std::fs::write(&path, &bytes[..HEADER + 10]).unwrap();
        assert!(ours.read(key).unwrap_err().contains("cut short"));
        std::fs::write(&path, &bytes).unwrap();
        assert!(ours.read(key ^ 1).is_err(), "no file of that key");
        std::fs::rename(&path, ours.path(key ^ 1)).unwrap();
        assert!(ours.read(key ^ 1).unwrap_err().contains("does not match its name"));
        // A half-written file from a crash is cleared away.
        std::fs::write(ours.dir.join("0000000000000001.partial"), b"half").unwrap();
        assert!(ours.list().is_empty());
        assert_eq!(std::fs::read_dir(&ours.dir).unwrap().count(), 0);
    }
}
